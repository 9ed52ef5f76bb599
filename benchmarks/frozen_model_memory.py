"""Memory of a frozen model (reference / reward / teacher) per rank under FSDP, base TRL 0.16.1 vs the fork.

Issue #6. For FSDP1 and FSDP2 at N ranks on the CPU (gloo), the script prepares a randomly initialised Qwen2 model of
about 125M parameters the way a trainer prepares its reference model, runs reference forward passes, and reports per
rank:

- resident: bytes of the frozen model's state held by the rank between forward passes;
- peak: the most bytes of model state held at any point of a forward pass;
- heap peak: resident + the largest growth of the process heap during the forward pass (this one also counts
  activations, logits and communication buffers).

Variants (each in fresh processes):

- ``base``: TRL 0.16.1's GRPO / KTO / BCO / GKD path, ``accelerator.prepare_model(model, evaluation_mode=True)`` (the
  Online DPO / PPO / RLOO path, ``model.to(device)``, holds the same bytes): a full replica on every rank.
- ``base-dpo`` (FSDP1): TRL 0.16.1's ``prepare_fsdp`` (DPO), taken from the pristine tree given with ``--base-trl``.
- ``root-only`` (FSDP2): ``fully_shard`` on the root module only, as the FSDP2 path of later upstream releases does.
- ``fork``: ``trl.models.prepare_frozen_model`` from the tree given with ``--fork-trl`` (default: the importable trl).

Measurement (CPU, no allocator statistics there):

- model state = the bytes of every distinct storage reachable from the model's modules: parameters, buffers, tensor
  attributes (FSDP1 sets the unsharded views as plain attributes), and FSDP's own buffers: FSDP1's local shard and
  padded unsharded flat parameter, FSDP2's padded local shard and all-gather outputs (the unsharded parameters).
  Views count once, through their storage, so a gathered unit counts at its full size. It is sampled in forward pre
  and post hooks on every module (registered after FSDP's own hooks, so a unit is sampled while gathered), before and
  after the forward.
- heap = glibc ``mallinfo2()`` bytes in use (all arenas and mmapped chunks): exact live bytes of the process, sampled
  at the same points. Not RSS, which does not go down when memory is freed.

Targets checked (issue #6, on model state): resident <= (1/N + 5 %) of the full model; peak <= resident + the largest
unit + 10 % of the full model, the unit being one decoder layer or the parameters outside the decoder layers
(embeddings, output head, final norm), whichever is larger.

Usage:
    python benchmarks/frozen_model_memory.py --fork-trl trl-src --base-trl build/trees/base [--json out.json]
Short runs: 2 forward passes of a 2 x 64 token batch per variant; 1 to 3 minutes per variant on 2 shared CPU cores.
Results: docs/frozen_models.md.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import tempfile

from _common import add_model_args, build_qwen2, free_port, set_rank_env


VARIANTS = {1: ("base", "base-dpo", "fork"), 2: ("base", "root-only", "fork")}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--fsdp-versions", default="1,2")
    parser.add_argument("--variants", default=None, help="comma-separated subset of base,base-dpo,root-only,fork")
    parser.add_argument("--fork-trl", default=None, help="directory holding the fork's `trl` package")
    parser.add_argument("--base-trl", default=None, help="directory holding pristine TRL 0.16.1 (for base-dpo)")
    add_model_args(parser, vocab=32000)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--json", default=None, help="write the results to this file")
    return parser.parse_args(argv)


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


def _is_fsdp_unit(module):
    return type(module).__name__ == "FullyShardedDataParallel" or type(module).__name__.startswith("FSDP")


# ----------------------------------------------------------------------------------------------- worker


def _worker(rank, world_size, port, options, variant, fsdp_version, result_dir):
    set_rank_env(rank, world_size, port)
    trl_dir = options["base_trl"] if variant == "base-dpo" else options["fork_trl"]
    if trl_dir:
        sys.path.insert(0, os.path.abspath(trl_dir))

    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    torch.set_num_threads(1)
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=fsdp_version,
        auto_wrap_policy="transformer_based_wrap",
        reshard_after_forward=True if fsdp_version == 2 else "FULL_SHARD",
        state_dict_type="SHARDED_STATE_DICT",
        sync_module_states=False,
        cpu_ram_efficient_loading=False,
    )
    # Accelerate selects MULTI_CPU without an accelerator: configure the state as FSDP on the CPU explicitly.
    init = AcceleratorState.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.fsdp_plugin = plugin
        self.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        self.device = PartialState._shared_state["device"] = torch.device("cpu")

    AcceleratorState.__init__ = __init__
    accelerator = Accelerator(cpu=True)
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
            raise SystemExit("--base-trl must point to pristine TRL 0.16.1")
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
        "fsdp_version": fsdp_version,
        "rank": rank,
        "world_size": world_size,
        "num_params": num_params,
        "full_bytes": full_bytes,
        "largest_unit_bytes": largest_unit,
        "resident_bytes": resident,
        "resident_after_first_forward": max(results[0]["resident_after"], results[1]["resident_before"]),
        "peak_bytes": measured["peak"],
        "heap_peak_bytes": resident + measured["heap_growth"] if measured["heap_growth"] is not None else None,
        "wrapped_units": sum(_is_fsdp_unit(m) for m in frozen.modules()),
    }
    row["resident_ok"] = row["resident_bytes"] <= (1 / world_size + 0.05) * full_bytes
    row["peak_ok"] = row["peak_bytes"] <= row["resident_bytes"] + largest_unit + 0.10 * full_bytes
    with open(os.path.join(result_dir, f"{variant}-{fsdp_version}-{rank}.json"), "w") as f:
        json.dump(row, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


# ----------------------------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    import torch.multiprocessing as mp

    options = vars(args)
    if args.fork_trl is None:
        print("note: --fork-trl not given, using the importable trl for the fork variant", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as result_dir:
        for fsdp_version in [int(v) for v in args.fsdp_versions.split(",")]:
            for variant in VARIANTS[fsdp_version]:
                if args.variants and variant not in args.variants.split(","):
                    continue
                if variant == "base-dpo" and not args.base_trl:
                    print("skipping base-dpo: --base-trl not given", file=sys.stderr)
                    continue
                mp.spawn(
                    _worker,
                    args=(args.ranks, free_port(), options, variant, fsdp_version, result_dir),
                    nprocs=args.ranks,
                )
                for rank in range(args.ranks):
                    with open(os.path.join(result_dir, f"{variant}-{fsdp_version}-{rank}.json")) as f:
                        rows.append(json.load(f))
                print_rows([r for r in rows if r["variant"] == variant and r["fsdp_version"] == fsdp_version])
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
            f"{'FSDP':>4} {'variant':>10} {'rank':>4} {'units':>5} {'full':>7} {'resident':>15} {'peak fwd':>15} "
            f"{'heap peak':>15} {'largest unit':>12} {'targets':>8}"
        )
    for r in rows:
        full = r["full_bytes"]
        heap = r["heap_peak_bytes"]
        print(
            f"{r['fsdp_version']:>4} {r['variant']:>10} {r['rank']:>4} {r['wrapped_units']:>5} {full / mib:7.1f} "
            f"{r['resident_bytes'] / mib:8.1f} ({100 * r['resident_bytes'] / full:3.0f}%) "
            f"{r['peak_bytes'] / mib:8.1f} ({100 * r['peak_bytes'] / full:3.0f}%) "
            + (f"{heap / mib:8.1f} ({100 * heap / full:3.0f}%) " if heap is not None else f"{'n/a':>15} ")
            + f"{r['largest_unit_bytes'] / mib:12.1f} "
            f"{('ok' if r['resident_ok'] else 'RES') + '/' + ('ok' if r['peak_ok'] else 'PEAK'):>8}"
        )


if __name__ == "__main__":
    main()
