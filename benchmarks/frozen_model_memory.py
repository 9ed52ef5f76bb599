"""Memory of a frozen model (reference / reward / teacher) per rank, pristine TRL vs the fork, on either line.

Issues #6 (0.16.1 line) and #27 (1.16.0 line). For FSDP1, FSDP2 and DeepSpeed ZeRO-3 at N ranks on the CPU (gloo),
the script prepares a randomly initialised Qwen2 model of about 125M parameters the way a trainer prepares its frozen
models, runs forward passes, and reports per rank:

- resident: bytes of the frozen model's state held by the rank between forward passes;
- peak: the most bytes of model state held at any point of a forward pass;
- heap peak: resident + the largest growth of the process heap during the forward pass (this one also counts
  activations, logits and communication buffers).

Variants (each in fresh processes; the line is the one of the `trl` given with ``--fork-trl``):

- ``base``: ``accelerator.prepare_model(model, evaluation_mode=True)``, a full replica on every rank. TRL 0.16.1:
  the reference models of GRPO / KTO / BCO / GKD (Online DPO / PPO / RLOO: ``model.to(device)``, the same bytes);
  TRL 1.16.0: the reward models of GRPO / RLOO / Online DPO and the teachers of GKD / distillation / GOLD / IW-OPD.
- ``base-dpo``: pristine ``trl.models.prepare_fsdp``, taken from the pristine tree given with ``--base-trl``.
  TRL 0.16.1: DPO's reference model (FSDP1 only); TRL 1.16.0: every reference model under FSDP (FSDP1: per layer,
  the root kept gathered; FSDP2: ``fully_shard`` on the root only).
- ``root-only`` (FSDP2, 0.16.1 line): ``fully_shard`` on the root module only, as later upstream releases do.
- ``fork``: ``trl.models.prepare_frozen_model`` from the tree given with ``--fork-trl`` (default: the importable trl).
- ZeRO-3 (``--backends zero3``): ``base-dpo`` is the pristine tree's ``prepare_deepspeed`` (what pristine TRL uses
  for these models under ZeRO-3), ``fork`` is ``prepare_frozen_model``, which calls the fork's (unchanged)
  ``prepare_deepspeed``.

Measurement (CPU, no allocator statistics there):

- model state = the bytes of every distinct storage reachable from the model's modules: parameters, buffers, tensor
  attributes (FSDP1 sets the unsharded views as plain attributes), and FSDP's own buffers: FSDP1's local shard and
  padded unsharded flat parameter, FSDP2's padded local shard and all-gather outputs (the unsharded parameters),
  ZeRO-3's partitions (``ds_tensor``) and gathered parameters.
  Views count once, through their storage, so a gathered unit counts at its full size. It is sampled in forward pre
  and post hooks on every module (registered after FSDP's / DeepSpeed's own hooks, so a unit is sampled while
  gathered), before and after the forward.
- heap = glibc ``mallinfo2()`` bytes in use (all arenas and mmapped chunks): exact live bytes of the process, sampled
  at the same points. Not RSS, which does not go down when memory is freed.

Targets checked (issues #6 and #27, on model state): resident <= (1/N + 5 %) of the full model; peak <= resident +
the largest unit + 10 % of the full model, the unit being one decoder layer or the parameters outside the decoder
layers (embeddings, output head, final norm), whichever is larger.

Usage (each line with its own virtual environment):
    lines/0.16.1/.venv/bin/python benchmarks/frozen_model_memory.py \
        --fork-trl lines/0.16.1/trl-src --base-trl lines/0.16.1/build/trees/base
    lines/1.16.0/.venv/bin/python benchmarks/frozen_model_memory.py \
        --fork-trl lines/1.16.0/trl-src --base-trl lines/1.16.0/build/trees/base
Short runs: 2 forward passes of a 2 x 64 token batch per variant; 1 to 3 minutes per variant on 2 shared CPU cores.
Results: lines/0.16.1/docs/frozen_models.md (0.16.1 line), lines/1.16.0/docs/frozen_models.md (1.16.0 line).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import tempfile

from _common import add_model_args, build_qwen2, deepspeed_on_cpu, free_port, set_rank_env, use_fsdp_on_cpu


VARIANTS = {
    "0.16.1": {
        "fsdp1": ("base", "base-dpo", "fork"),
        "fsdp2": ("base", "root-only", "fork"),
        "zero3": ("base-dpo", "fork"),
    },
    "1.16.0": {
        "fsdp1": ("base", "base-dpo", "fork"),
        "fsdp2": ("base", "base-dpo", "fork"),
        "zero3": ("base-dpo", "fork"),
    },
}
ZERO3 = {
    "train_micro_batch_size_per_gpu": 1,
    "zero_allow_untested_optimizer": True,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backends", default="fsdp1,fsdp2,zero3", help="comma-separated subset of fsdp1,fsdp2,zero3")
    parser.add_argument("--variants", default=None, help="comma-separated subset of base,base-dpo,root-only,fork")
    parser.add_argument("--fork-trl", default=None, help="directory holding the fork's `trl` package")
    parser.add_argument("--base-trl", default=None, help="directory holding pristine TRL 0.16.1 (for base-dpo)")
    add_model_args(parser, vocab=32000)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--json", default=None, help="write the results to this file")
    return parser.parse_args(argv)


def trl_line(trl_dir):
    """The line (base release) of the `trl` in `trl_dir` (or the importable one): "0.16.1" or "1.16.0"."""
    import subprocess

    code = "import trl, sys; sys.stdout.write(trl.__version__)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [trl_dir, os.environ.get("PYTHONPATH")])))
    version = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    for line in VARIANTS:
        if version.split("+")[0] == line:
            return line
    raise SystemExit(f"trl {version} is neither line of the fork ({', '.join(VARIANTS)})")


# ----------------------------------------------------------------------------------------------- measurement


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
        + ("keepcost",)
    ]


def _heap_reader():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return lambda: None

    def in_use():
        info = libc.mallinfo2()
        return info.uordblks + info.hblkhd

    return in_use


def model_state_bytes(model) -> int:
    import torch

    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        DTensor = ()
    storages = {}

    def add(tensor):
        if DTensor and isinstance(tensor, DTensor):
            tensor = tensor._local_tensor
        if not isinstance(tensor, torch.Tensor):
            return
        storage = tensor.untyped_storage()
        if storage.nbytes() > 0:
            storages[storage.data_ptr()] = storage.nbytes()

    for module in model.modules():
        for tensor in list(module._parameters.values()) + list(module._buffers.values()):
            add(tensor)
            # ZeRO-3: this rank's partition (`tensor` itself is empty unless gathered)
            add(getattr(tensor, "ds_tensor", None))
        for value in list(vars(module).values()):
            add(value)
        handle = getattr(module, "_handle", None)  # FSDP1
        flat_param = getattr(handle, "flat_param", None)
        if flat_param is not None:
            add(flat_param)
            add(getattr(flat_param, "_local_shard", None))
            add(getattr(flat_param, "_full_param_padded", None))
        get_fsdp_state = getattr(module, "_get_fsdp_state", None)  # FSDP2
        if get_fsdp_state is not None:
            state = get_fsdp_state()
            groups = getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]
            for group in groups:
                for fsdp_param in getattr(group, "fsdp_params", []):
                    # the local shard stays allocated while the parameter is gathered, and is then unregistered
                    add(getattr(fsdp_param, "_sharded_param_data", None))
                    for tensor in getattr(fsdp_param, "all_gather_outputs", []):
                        add(tensor)
    return sum(storages.values())


def _is_unit(module):
    """An FSDP unit, or (ZeRO-3) a module with parameters of its own, which DeepSpeed gathers in its forward."""
    if type(module).__name__ == "FullyShardedDataParallel" or type(module).__name__.startswith("FSDP"):
        return True
    return any(hasattr(p, "ds_id") for p in module.parameters(recurse=False))


# ----------------------------------------------------------------------------------------------- worker


def _worker(rank, world_size, port, options, variant, backend, result_dir):
    set_rank_env(rank, world_size, port)
    trl_dir = options["base_trl"] if variant == "base-dpo" else options["fork_trl"]
    if trl_dir:
        sys.path.insert(0, os.path.abspath(trl_dir))

    import torch

    torch.set_num_threads(1)
    if backend == "zero3":
        accelerator = _zero3_accelerator()
    else:
        accelerator = _fsdp_accelerator(int(backend[-1]))
    heap = _heap_reader()

    model = build_qwen2(options)
    model.eval()
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    num_params = sum(p.numel() for p in model.parameters())
    # The unit of the target: one decoder layer, or the parameters outside the decoder layers (the root's own)
    largest_unit = max(
        sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters()),
        full_bytes - sum(p.numel() * p.element_size() for p in model.model.layers.parameters()),
    )

    if variant == "base":
        frozen = accelerator.prepare_model(model, evaluation_mode=True)
    elif variant == "base-dpo":
        import trl.models

        if hasattr(trl.models, "prepare_frozen_model"):
            raise SystemExit("--base-trl must point to a pristine TRL release")
        if backend == "zero3":
            frozen = trl.models.prepare_deepspeed(model, accelerator)
        else:
            frozen = trl.models.prepare_fsdp(model, accelerator)
    elif variant == "root-only":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, reshard_after_forward=True)  # resharded after each forward, like the fork
        frozen = model
    elif variant == "fork":
        from trl.models import prepare_frozen_model

        frozen = prepare_frozen_model(model, accelerator)
    else:
        raise ValueError(variant)
    del model
    gc.collect()

    samples = []

    def sample(*_):
        samples.append((model_state_bytes(frozen), heap()))

    handles = []
    for module in frozen.modules():
        handles.append(module.register_forward_pre_hook(sample))
        handles.append(module.register_forward_hook(sample))

    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, options["vocab"], (options["batch"], options["seq"]), generator=generator)
    results = []
    with torch.no_grad():
        for _ in range(2):  # the first forward pass also runs FSDP's lazy initialization
            gc.collect()
            samples.clear()
            sample()
            heap_before = samples[0][1]
            frozen(input_ids=input_ids)
            gc.collect()
            sample()
            results.append(
                {
                    "resident_before": samples[0][0],
                    "resident_after": samples[-1][0],
                    "peak": max(s[0] for s in samples),
                    "heap_growth": (max(s[1] for s in samples) - heap_before) if heap_before is not None else None,
                }
            )
    for handle in handles:
        handle.remove()

    measured = results[-1]
    resident = max(measured["resident_before"], measured["resident_after"])
    row = {
        "variant": variant,
        "backend": backend,
        "rank": rank,
        "world_size": world_size,
        "num_params": num_params,
        "full_bytes": full_bytes,
        "largest_unit_bytes": largest_unit,
        "resident_bytes": resident,
        "resident_after_first_forward": max(results[0]["resident_after"], results[1]["resident_before"]),
        "peak_bytes": measured["peak"],
        "first_peak_bytes": results[0]["peak"],  # the first forward also runs FSDP's lazy initialization
        "heap_peak_bytes": resident + measured["heap_growth"] if measured["heap_growth"] is not None else None,
        "wrapped_units": sum(_is_unit(m) for m in frozen.modules()),
    }
    row["resident_ok"] = row["resident_bytes"] <= (1 / world_size + 0.05) * full_bytes
    row["peak_ok"] = row["peak_bytes"] <= row["resident_bytes"] + largest_unit + 0.10 * full_bytes
    with open(os.path.join(result_dir, f"{variant}-{backend}-{rank}.json"), "w") as f:
        json.dump(row, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _fsdp_accelerator(fsdp_version):
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=fsdp_version,
        auto_wrap_policy="transformer_based_wrap",
        reshard_after_forward=True if fsdp_version == 2 else "FULL_SHARD",
        state_dict_type="SHARDED_STATE_DICT",
        sync_module_states=False,
        cpu_ram_efficient_loading=False,
    )
    use_fsdp_on_cpu(plugin)  # Accelerate selects MULTI_CPU without an accelerator
    return Accelerator(cpu=True)


def _zero3_accelerator():
    """What `prepare_frozen_model` reads of the accelerator under DeepSpeed ZeRO-3 (its type, the plugin's config and
    stage, the main process): a stand-in, since Accelerate only selects DeepSpeed with an accelerator (or, from 1.10,
    drops the plugin with ``ACCELERATE_USE_CPU``)."""
    from types import SimpleNamespace

    import deepspeed
    import torch
    from accelerate.utils import DistributedType

    deepspeed_on_cpu()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    plugin = SimpleNamespace(deepspeed_config=json.loads(json.dumps(ZERO3)), zero_stage=3)
    return SimpleNamespace(
        distributed_type=DistributedType.DEEPSPEED,
        state=SimpleNamespace(deepspeed_plugin=plugin),
        device=torch.device("cpu"),
        num_processes=torch.distributed.get_world_size(),
        is_main_process=torch.distributed.get_rank() == 0,
    )


# ----------------------------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    import torch.multiprocessing as mp

    options = vars(args)
    if args.fork_trl is None:
        print("note: --fork-trl not given, using the importable trl for the fork variant", file=sys.stderr)
    line = trl_line(args.fork_trl)
    print(f"line {line}: trl from {args.fork_trl or 'the environment'}", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as result_dir:
        for backend in args.backends.split(","):
            if backend not in VARIANTS[line]:
                raise SystemExit(f"unknown backend {backend!r}: choose from {', '.join(VARIANTS[line])}")
            for variant in VARIANTS[line][backend]:
                if args.variants and variant not in args.variants.split(","):
                    continue
                if variant == "base-dpo" and not args.base_trl:
                    print("skipping base-dpo: --base-trl not given", file=sys.stderr)
                    continue
                mp.spawn(
                    _worker,
                    args=(args.ranks, free_port(), options, variant, backend, result_dir),
                    nprocs=args.ranks,
                )
                for rank in range(args.ranks):
                    with open(os.path.join(result_dir, f"{variant}-{backend}-{rank}.json")) as f:
                        rows.append(dict(json.load(f), line=line))
                print_rows([r for r in rows if r["variant"] == variant and r["backend"] == backend])
    print("\nSummary (rank 0; MiB; % of the full model)")
    print_rows([r for r in rows if r["rank"] == 0], header=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def print_rows(rows, header=False):
    mib = 1 << 20
    if header:
        print(
            f"{'line':>6} {'backend':>7} {'variant':>10} {'rank':>4} {'units':>5} {'full':>7} {'resident':>15} {'peak fwd':>15} "
            f"{'1st fwd':>15} "
            f"{'heap peak':>15} {'largest unit':>12} {'targets':>8}"
        )
    for r in rows:
        full = r["full_bytes"]
        heap = r["heap_peak_bytes"]
        print(
            f"{r['line']:>6} {r['backend']:>7} {r['variant']:>10} {r['rank']:>4} {r['wrapped_units']:>5} {full / mib:7.1f} "
            f"{r['resident_bytes'] / mib:8.1f} ({100 * r['resident_bytes'] / full:3.0f}%) "
            f"{r['peak_bytes'] / mib:8.1f} ({100 * r['peak_bytes'] / full:3.0f}%) "
            f"{r['first_peak_bytes'] / mib:8.1f} ({100 * r['first_peak_bytes'] / full:3.0f}%) "
            + (f"{heap / mib:8.1f} ({100 * heap / full:3.0f}%) " if heap is not None else f"{'n/a':>15} ")
            + f"{r['largest_unit_bytes'] / mib:12.1f} "
            f"{('ok' if r['resident_ok'] else 'RES') + '/' + ('ok' if r['peak_ok'] else 'PEAK'):>8}"
        )


if __name__ == "__main__":
    main()
