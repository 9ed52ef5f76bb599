"""Launch a script under ``accelerate launch`` (or plain ``python`` for DataParallel) with a bounded timeout.

The user-facing configs in ``examples/accelerate_configs/`` are used unchanged on GPUs.  On CPU the harness
writes a derived copy into the launch's work directory (``mixed_precision: 'no'``, FSDP's
``sync_module_states``/``cpu_ram_efficient_loading`` off, ...) and sets the CPU-only environment
(``DS_ACCELERATOR=cpu``, ``CUDA_VISIBLE_DEVICES=''``, the FSDP shim through ``_site/sitecustomize.py``).

Every launch:
- runs in its own session; on timeout the launcher asks every descendant for a stack dump (SIGUSR1),
  then terminates and kills them all (the launcher, torchrun and each worker, which torchrun puts in
  sessions of their own), so a hung collective fails the test instead of hanging CI;
- captures each rank's own traceback (``TRL_HARNESS_ERROR_DIR``) so a failure reads as the worker's
  exception, not as torchrun's ``ChildFailedError``.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path


HARNESS_DIR = Path(__file__).resolve().parent
REPO_ROOT = HARNESS_DIR.parents[1]
CONFIG_DIR = REPO_ROOT / "examples" / "accelerate_configs"
SITE_DIR = HARNESS_DIR / "_site"

DEFAULT_TIMEOUT = int(os.environ.get("TRL_HARNESS_TIMEOUT", "300"))


@dataclass(frozen=True)
class Backend:
    name: str
    config: str = None  # file in examples/accelerate_configs (None: no launcher, single process)
    shards_params: bool = False  # whether each rank holds ~1/N of a (prepared) model's parameters
    family: str = "ddp"  # ddp | fsdp | deepspeed | dataparallel
    fsdp_version: int = None


BACKENDS = {
    "ddp": Backend("ddp", "multi_gpu.yaml"),
    "fsdp1": Backend("fsdp1", "fsdp1.yaml", True, "fsdp", 1),
    "fsdp2": Backend("fsdp2", "fsdp2.yaml", True, "fsdp", 2),
    "zero2": Backend("zero2", "deepspeed_zero2.yaml", False, "deepspeed"),
    "zero3": Backend("zero3", "deepspeed_zero3.yaml", True, "deepspeed"),
    "dataparallel": Backend("dataparallel", None, False, "dataparallel"),
}


class WorkerFailure(AssertionError):
    """A launch failed; the message carries each rank's own traceback and the output tail."""


def _yaml():
    import yaml  # PyYAML: a dependency of accelerate

    return yaml


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_count():
    """CUDA devices visible to torch in this process (0 without CUDA or without torch)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def derive_config(backend, dest_dir, *, device="cpu", num_processes=2, port=None):
    """Write the config accelerate should use for ``backend`` into ``dest_dir`` and return its path.

    ``device="cuda"``: the user config, with only the process count/port set (and, for ZeRO-3, the tiny
    model's parameter persistence threshold, see ``_zero3_tiny_model_config``).
    ``device="cpu"``: plus the CPU specifics (no mixed precision; FSDP without ``sync_module_states`` and
    ``cpu_ram_efficient_loading``, which need a GPU/meta-device flow).
    """
    spec = BACKENDS[backend] if isinstance(backend, str) else backend
    if spec.config is None:
        raise ValueError(f"backend {spec.name!r} is not launched through accelerate")
    yaml = _yaml()
    config = yaml.safe_load((CONFIG_DIR / spec.config).read_text())
    config["num_processes"] = num_processes
    config["main_process_port"] = port or free_port()
    if device == "cpu":
        config["mixed_precision"] = "no"
        config["use_cpu"] = False  # True would make accelerate drop DeepSpeed/FSDP; the env selects CPU
        config.pop("gpu_ids", None)
        if spec.family == "fsdp":
            config["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] = False
            if spec.fsdp_version == 1:  # obsolete (and warned about) under FSDP2
                config["fsdp_config"]["fsdp_sync_module_states"] = False
    elif spec.family == "ddp" and num_processes < 2:
        config["distributed_type"] = "NO"  # accelerate refuses MULTI_GPU with one process
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    if spec.name == "zero3":
        mixed_precision = config.pop("mixed_precision", "no")  # must live in the JSON file then
        config["deepspeed_config"] = _zero3_tiny_model_config(
            config["deepspeed_config"], dest_dir, device, mixed_precision
        )
    path = dest_dir / f"{spec.name}-{device}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=True))
    return path


def _zero3_tiny_model_config(ds, dest_dir, device, mixed_precision):
    """ZeRO-3 as in the user config, plus ``stage3_param_persistence_threshold: auto`` (= 10 * hidden size).

    DeepSpeed's default threshold (1e5 elements) keeps every parameter of a tiny fixture model whole on every
    rank, so ZeRO-3 would shard nothing; real models are far above it.  accelerate only takes that key from a
    DeepSpeed JSON file, so the harness writes one next to the derived config.
    """
    zero = {
        "stage": 3,
        "offload_optimizer": {"device": ds.get("offload_optimizer_device", "none")},
        "offload_param": {"device": ds.get("offload_param_device", "none")},
        "stage3_gather_16bit_weights_on_model_save": bool(ds.get("zero3_save_16bit_model", False)),
        "stage3_param_persistence_threshold": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "reduce_bucket_size": "auto",
    }
    ds_json = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
    }
    if mixed_precision in ("bf16", "fp16"):
        ds_json[mixed_precision] = {"enabled": "auto"}  # filled from TrainingArguments (--bf16 / --fp16)
    path = Path(dest_dir) / f"zero3-{device}.ds.json"
    path.write_text(json.dumps(ds_json, indent=2))
    kept = {k: v for k, v in ds.items() if k in ("deepspeed_multinode_launcher", "zero3_init_flag")}
    return dict(kept, deepspeed_config_file=str(path))


def harness_env(backend=None, *, device="cpu", error_dir=None, preload=(), extra=None):
    """Environment for a launch: offline hub, the start-up hook dir prepended to PYTHONPATH, CPU specifics."""
    spec = BACKENDS[backend] if isinstance(backend, str) else backend
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
    )
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("TRL_HARNESS_KEEP_GLOO_GROUPS", None)  # CPU launches only (below), never inherited
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["ACCELERATE_USE_CPU"] = "false"
        env["TRL_HARNESS_KEEP_GLOO_GROUPS"] = "1"  # torch's gloo group destructor can hang at exit (sitecustomize)
        if spec is not None and spec.family == "deepspeed":
            env["DS_ACCELERATOR"] = "cpu"
            env["TRL_HARNESS_DS_NO_SHM"] = "1"
        if spec is not None and spec.family == "fsdp":
            env["TRL_HARNESS_CPU_FSDP"] = "1"
    if error_dir is not None:
        env["TRL_HARNESS_ERROR_DIR"] = str(error_dir)
    if preload:
        env["TRL_HARNESS_PRELOAD"] = os.pathsep.join(str(p) for p in preload)
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class LaunchResult:
    backend: str
    cmd: list
    returncode: int
    duration: float
    timed_out: bool
    log_path: Path
    error_dir: Path
    output: str = ""
    tracebacks: dict = field(default_factory=dict)  # file name -> text
    stacks: dict = field(default_factory=dict)  # file name -> faulthandler dump (timeouts)

    @property
    def ok(self):
        return self.returncode == 0 and not self.timed_out

    def failure_text(self, tail_lines=60):
        lines = []
        if self.timed_out:
            lines.append(f"[{self.backend}] launch TIMED OUT after {self.duration:.0f}s (hung collective?)")
        else:
            lines.append(f"[{self.backend}] launch failed with exit code {self.returncode} after {self.duration:.0f}s")
        tracebacks = self.tracebacks
        # the launcher's own ChildFailedError / SignalException is noise next to the workers' own errors
        if self.timed_out or any("rankmain" not in name for name in tracebacks):
            tracebacks = {k: v for k, v in tracebacks.items() if "rankmain" not in k}
        shown = {}
        for name, text in sorted(tracebacks.items()):
            text = "\n".join(ln for ln in text.rstrip().splitlines() if ln.strip("^~ ") or not ln.strip())
            last = text.splitlines()[-1] if text else ""
            if last in shown:  # the same error on another rank: one line is enough
                lines.append(f"----- {name}: same error as {shown[last]}: {last}")
                continue
            shown[last] = name
            lines.append(f"----- worker traceback ({name}) -----")
            lines.append(text)
        worker_stacks = {k: v for k, v in self.stacks.items() if "rankmain" not in k} or self.stacks
        for name, text in sorted(worker_stacks.items()):
            lines.append(f"----- stacks at timeout ({name}) -----")
            lines.append("\n".join(text.rstrip().splitlines()[:40]))
        tail = "\n".join(self.output.rstrip().splitlines()[-tail_lines:])
        lines.append(f"----- output tail ({self.log_path}) -----")
        lines.append(tail)
        lines.append(f"----- command: {' '.join(map(str, self.cmd))}")
        return "\n".join(lines)

    def check(self):
        if not self.ok:
            raise WorkerFailure(self.failure_text())
        return self


def _descendants(pid):
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with accelerate
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_all(proc, procs, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:
        try:
            p.send_signal(sig)
        except Exception:
            pass


def _native_stacks(procs, error_dir, budget=60.0):
    """Every thread's C/C++ stack of each Python worker (gdb, when this machine has it and may attach): a hang
    inside a native destructor or collective shows no Python frame, only these do. ``budget`` seconds in all."""
    gdb = shutil.which("gdb")
    if gdb is None or error_dir is None:
        return
    deadline = time.monotonic() + budget
    for p in procs:
        left = deadline - time.monotonic()
        if left <= 1:
            break
        try:
            if "python" not in p.name().lower():
                continue
            ran = subprocess.run(
                [gdb, "-p", str(p.pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
                capture_output=True,
                text=True,
                timeout=left,
            )
            text = "\n".join(line for line in ran.stdout.splitlines() if line.startswith(("#", "Thread")))
            if not text:  # could not attach (ptrace not allowed here): say so once, in the file
                text = "gdb could not read the stacks: " + (ran.stderr.strip().splitlines() or ["no output"])[-1]
            (Path(error_dir) / f"native-{p.pid}.txt").write_text(text + "\n")
        except Exception:
            pass


def _terminate_tree(proc, dump_stacks=True, grace=10.0, error_dir=None):
    procs = _descendants(proc.pid)
    if dump_stacks and hasattr(signal, "SIGUSR1"):
        for p in procs:
            try:
                p.send_signal(signal.SIGUSR1)
            except Exception:
                pass
        time.sleep(2.0)
        _native_stacks(procs, error_dir)
    procs = list({p.pid: p for p in procs + _descendants(proc.pid)}.values())
    _signal_all(proc, procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not any(_alive(p) for p in procs):
            break
        time.sleep(0.2)
    _signal_all(proc, procs, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _kill_leftovers(procs, grace=3.0):
    alive = [p for p in procs if _alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in alive:
            try:
                p.send_signal(sig)  # psutil checks the process identity (no PID reuse accident)
            except Exception:
                pass
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _alive(p)]
            time.sleep(0.1)


def _alive(p):
    try:
        return p.is_running() and p.status() != "zombie"
    except Exception:
        return False


def _pump(stream, log, echo):
    for line in iter(stream.readline, b""):
        log.write(line)
        log.flush()
        text = line.decode(errors="replace")
        if echo(text):
            sys.stdout.write(text)
            sys.stdout.flush()


GLOO_ABORT = "terminate called without an active exception"


def aborted_by_gloo(output, error_dir):
    """Whether a failed launch failed only by gloo's rare C++ abort (see :func:`run_command`): ``output`` holds its
    message and no worker left a Python traceback in ``error_dir`` (the launch's ``TRL_HARNESS_ERROR_DIR``; the
    launcher's own, ``rankmain``, reports the failed child)."""
    worker_errors = [f for f in Path(error_dir).glob("traceback-*.txt") if "rankmain" not in f.name]
    return GLOO_ABORT in output and not worker_errors


def run_command(cmd, *, env, workdir, backend="-", timeout=DEFAULT_TIMEOUT, cwd=None, echo=None, fresh=()):
    """Run ``cmd`` in a new session with a hard timeout; collect output and the workers' tracebacks.

    ``echo``: optional ``line -> bool``; matching output lines are also printed live (the demo uses it).

    A worker of a gloo job on a loaded CPU was seen, rarely, to abort from C++ ("terminate called without an active
    exception", SIGABRT), once after training had finished: a launch that failed that way, with no Python traceback
    from a worker and no timeout, is run once more. Any other failure is returned as it is. ``fresh``: the files and
    folders the command writes its results to, removed before that second run, so that what the first run wrote never
    stands for the second's.
    """
    result = _run_command_once(cmd, env=env, workdir=workdir, backend=backend, timeout=timeout, cwd=cwd, echo=echo)
    if result.ok or result.timed_out or not aborted_by_gloo(result.output, result.error_dir):
        return result
    aborted_log = result.log_path.with_name("launch.aborted.log")
    result.log_path.replace(aborted_log)  # kept for a look; the second run writes launch.log
    # A warning, so that pytest's summary shows every launch that needed a second run
    warnings.warn(
        f"{backend}: a worker aborted ({GLOO_ABORT!r}, log: {aborted_log}); launched once more", stacklevel=2
    )
    for f in result.error_dir.glob("*.txt"):
        f.unlink()
    for path in map(Path, fresh):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return _run_command_once(cmd, env=env, workdir=workdir, backend=backend, timeout=timeout, cwd=cwd, echo=echo)


def run_benchmark(cmd, *, timeout, cwd=REPO_ROOT):
    """``subprocess.run(cmd)`` of a benchmark script that spawns its own gloo ranks (``torch.multiprocessing``),
    output captured. A run that failed with the gloo abort of :func:`run_command` (a rank killed by SIGABRT after
    printing it, no Python exception from a rank) is run once more, with a warning that carries the first run's last
    output lines. Any other failure is returned as it is."""

    def once():
        return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=cwd)

    done = once()
    output = done.stdout + done.stderr
    # how torch.multiprocessing's join() reports a rank killed by a signal
    aborted = GLOO_ABORT in output and re.search(
        r"ProcessExitedException: process \d+ terminated with signal SIGABRT", output
    )
    # a rank's Python exception reaches the parent as ProcessRaisedException ("terminated with the following error")
    if done.returncode == 0 or not aborted or "ProcessRaisedException" in output:
        return done
    tail = "\n".join(output.splitlines()[-20:])
    warnings.warn(
        f"{Path(str(cmd[1])).name}: a rank aborted ({GLOO_ABORT!r}); run once more. It ended:\n{tail}", stacklevel=2
    )
    return once()


def _run_command_once(cmd, *, env, workdir, backend, timeout, cwd, echo):
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    error_dir = Path(env.get("TRL_HARNESS_ERROR_DIR") or workdir / "errors")
    env = dict(env, TRL_HARNESS_ERROR_DIR=str(error_dir))
    error_dir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "launch.log"
    start = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(c) for c in cmd],
            env=env,
            cwd=str(cwd or REPO_ROOT),
            stdout=subprocess.PIPE if echo else log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        pump = None
        if echo:
            pump = threading.Thread(target=_pump, args=(proc.stdout, log, echo), daemon=True)
            pump.start()
        known = {}  # every descendant seen, so that orphans of a crashed launcher can be reaped too
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None:
                for p in _descendants(proc.pid):
                    known.setdefault(p.pid, p)
                if time.monotonic() > deadline:
                    timed_out = True
                    _terminate_tree(proc, error_dir=error_dir)
                    break
                time.sleep(0.5)
        except BaseException:  # KeyboardInterrupt, pytest-timeout: never leave workers behind
            _terminate_tree(proc, dump_stacks=False, grace=3.0)
            _kill_leftovers(known.values())
            raise
        _kill_leftovers(known.values())
        if pump is not None:
            pump.join(timeout=10)
    duration = time.monotonic() - start
    output = log_path.read_text(errors="replace")
    tracebacks, stacks = {}, {}
    for f in sorted(error_dir.glob("*.txt")):
        text = f.read_text(errors="replace")
        if not text.strip():
            continue
        (tracebacks if f.name.startswith("traceback-") else stacks)[f.name] = text
    return LaunchResult(
        backend=backend,
        cmd=list(cmd),
        returncode=proc.returncode if proc.returncode is not None else -9,
        duration=duration,
        timed_out=timed_out,
        log_path=log_path,
        error_dir=error_dir,
        output=output,
        tracebacks=tracebacks,
        stacks=stacks if timed_out else {},
    )


def launch(
    target,
    args=(),
    *,
    backend,
    workdir,
    num_processes=2,
    device="cpu",
    timeout=DEFAULT_TIMEOUT,
    module=False,
    preload=(),
    extra_env=None,
):
    """Run a script (``target`` path, or a module name with ``module=True``) under ``backend``.

    ``dataparallel`` runs one plain ``python`` process: the script itself sets ``args._n_gpu`` (see
    ``harness.dataparallel``) so that ``Trainer`` wraps the model in ``torch.nn.DataParallel``.
    Returns a :class:`LaunchResult`; call ``.check()`` to turn a failure into a ``WorkerFailure``.
    """
    spec = BACKENDS[backend]
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    env = harness_env(spec, device=device, error_dir=workdir / "errors", preload=preload, extra=extra_env)
    entry = ["-m", target] if module else [str(target)]
    if spec.config is None:
        cmd = [sys.executable, *entry, *args]
    else:
        config = derive_config(spec, workdir, device=device, num_processes=num_processes)
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(config),
            "--num_processes",
            str(num_processes),
            *(["-m"] if module else []),
            str(target),
            *args,
        ]
    return run_command(cmd, env=env, workdir=workdir, backend=backend, timeout=timeout)
