"""What the CPU harness needs on top of ``launcher.py`` / ``cpu_shims.py`` for accelerate >= 1.10 (the 1.16.0 line).

Additive only: nothing here changes the modules the 0.16.1 line's tests use.

accelerate 1.10+ picks ``DistributedType.NO`` for a launched process on a GPU-less machine unless
``ACCELERATE_USE_CPU=true``, and that flag drops the DeepSpeed plugin.  The *backend shim* below patches
``PartialState._prepare_backend`` (private accelerate API, test-only): when it would answer ``NO`` for a
process that ``torchrun`` started with ``WORLD_SIZE > 1``, it answers ``("gloo", MULTI_CPU)``, as accelerate 1.6
did.  From there accelerate's own code turns DeepSpeed launches into ``DEEPSPEED`` (over gloo), and the existing
CPU FSDP shim (``cpu_shims.py``) turns FSDP launches into real ``FSDP`` states.

The shim is installed in the launched processes through the harness start-up hook's ``TRL_HARNESS_PRELOAD``
(this file is executed at interpreter start-up and patches ``accelerate`` right after it is imported).

DeepSpeed on CPU also refuses a torch optimizer unless ``zero_allow_untested_optimizer`` is set: ZeRO-2 gets a
DeepSpeed JSON next to the derived config as ZeRO-3 already does (``launcher._zero3_tiny_model_config``).
"""

import json
import os
from pathlib import Path


SHIM_FILE = Path(__file__).resolve()


# ----------------------------------------------------------------------------------- in launched processes


def _patch_prepare_backend(accelerate_module):
    from accelerate.state import DistributedType, PartialState

    original = PartialState._prepare_backend
    if getattr(original, "_trl_harness_shim", False):
        return

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        chosen_backend, distributed_type = original(self, cpu, sagemaker_dp, backend)
        launched = int(os.environ.get("LOCAL_RANK", -1)) != -1 and int(os.environ.get("WORLD_SIZE", "1")) > 1
        if distributed_type == DistributedType.NO and launched:
            return "gloo", DistributedType.MULTI_CPU
        return chosen_backend, distributed_type

    _prepare_backend._trl_harness_shim = True
    _prepare_backend.__wrapped__ = original
    PartialState._prepare_backend = _prepare_backend


def install():
    """Patch accelerate (now or right after its import) in this process."""
    from trl_harness_hooks import after_import  # tests/harness/_site, on PYTHONPATH in launched processes

    # the package, not ``accelerate.state``: cpu_shims' FSDP shim hooks that module, and one post-import finder per
    # module name is all the hook machinery runs
    after_import("accelerate", _patch_prepare_backend)


def reset_accelerate_state():
    """Forget the accelerator state between two trainers of one process (private accelerate API, test-only).

    ``AcceleratorState._reset_state()`` drops the mixed-precision / plugin state so that the next trainer's
    ``Accelerator`` reads its own DeepSpeed / FSDP plugin; the process group (``PartialState``) is kept.
    """
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


# ------------------------------------------------------------------------------------- in the test process


def derive_config(backend, dest_dir, *, num_processes=2, port=None):
    """``launcher.derive_config`` on CPU, plus a DeepSpeed JSON for ZeRO-2 with ``zero_allow_untested_optimizer``."""
    from .launcher import BACKENDS, _yaml
    from .launcher import derive_config as derive_v1

    spec = BACKENDS[backend]
    path = derive_v1(spec, dest_dir, device="cpu", num_processes=num_processes, port=port)
    if spec.name != "zero2":
        return path
    yaml = _yaml()
    config = yaml.safe_load(path.read_text())
    ds = config["deepspeed_config"]
    config.pop("mixed_precision", None)  # must live in the JSON file then; "no" on CPU
    ds_json = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": ds.get("offload_optimizer_device", "none")},
            "offload_param": {"device": ds.get("offload_param_device", "none")},
        },
        "zero_allow_untested_optimizer": True,
    }
    json_path = Path(dest_dir) / "zero2-cpu.ds.json"
    json_path.write_text(json.dumps(ds_json, indent=2))
    kept = {k: v for k, v in ds.items() if k in ("deepspeed_multinode_launcher", "zero3_init_flag")}
    config["deepspeed_config"] = dict(kept, deepspeed_config_file=str(json_path))
    path.write_text(yaml.safe_dump(config, sort_keys=True))
    return path


def launch(script, args=(), *, backend, workdir, num_processes=2, timeout=None, extra_env=None, fresh=()):
    """``accelerate launch`` of ``script`` on CPU ranks with the accelerate >= 1.10 shims; a ``LaunchResult``
    (``fresh``: as for :func:`launcher.run_command`).

    Same interpreter as the caller (``sys.executable``) and the caller's ``PYTHONPATH`` (so the workers import the
    ``trl`` the test process finds), the harness start-up hook in front of it.
    """
    import sys

    from .launcher import BACKENDS, DEFAULT_TIMEOUT, harness_env, run_command

    spec = BACKENDS[backend]
    if spec.config is None:
        raise ValueError(f"backend {backend!r} is not launched through accelerate")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    env = harness_env(spec, device="cpu", error_dir=workdir / "errors", preload=[SHIM_FILE], extra=extra_env)
    config = derive_config(backend, workdir, num_processes=num_processes)
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        "--num_processes",
        str(num_processes),
        str(script),
        *args,
    ]
    return run_command(cmd, env=env, workdir=workdir, backend=backend, timeout=timeout or DEFAULT_TIMEOUT, fresh=fresh)


if __name__.startswith("_trl_harness_preload_"):  # executed by _site/sitecustomize.py (TRL_HARNESS_PRELOAD)
    install()
