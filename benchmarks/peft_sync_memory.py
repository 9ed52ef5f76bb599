"""Peak extra memory of a LoRA policy's weight sync to vLLM on the 1.16.0 line: pristine TRL 1.16.0 vs the fork.

Issue #28. At N CPU ranks (gloo), for ZeRO-3, FSDP1 and FSDP2, the script builds a randomly initialised Qwen2 model
(``--sizes``: ``100m`` is 12 layers, hidden 768, vocabulary 16,000, about 100M parameters; ``500m`` is 28 layers,
hidden 1024, intermediate 4096, vocabulary 32,000, about 500M), puts LoRA (rank 16, random adapters) on every linear
layer of the decoder, wraps it as a trainer does (under FSDP, Accelerate with the test harness's FSDP-on-CPU shim,
the decoder layers wrapped, and under FSDP1 PEFT's wrap policy, which ``Trainer`` installs for a PEFT model there:
each LoRA adapter a unit of its own; under ZeRO-3, ``deepspeed.initialize``, every parameter partitioned), and streams its weights with
``VLLMGeneration._iter_named_params`` to a stand-in that reads each tensor on the main process, as GRPO's sync does
(the other ranks take part in the gathers):

- ``fork``: the fork's path (patch 0012): one unit gathered at a time, each LoRA layer merged into a copy; the first
  sync of the freshly wrapped model, then ``fork again``, the second one;
- ``pristine``: TRL 1.16.0's path, which the fork keeps for other PEFT methods (``_merges_per_unit`` forced off): every
  parameter gathered at once (ZeRO-3), ``merge_adapter()`` in place, read, ``unmerge_adapter()``. Measured after
  ``fork``, as it modifies the weights.

Before any measurement, each process calls Accelerate's ``is_peft_model`` on the policy, as ``GRPOTrainer.__init__``
does: it imports DeepSpeed, a one-time cost a trainer's process has paid before its first sync (printed at the end).

Peak extra per rank: the process's peak resident memory during the sync minus its resident memory right before it
(``VmHWM`` after resetting it; glibc ``mmap``s every block of 64 KiB or more, so freed buffers leave at once).
Also measured, ``one unit``: gathering each unit alone with the backend's own mechanism (``GatheredParameters`` of a
ZeRO-3 unit with its adapters, FSDP1 ``summon_full_params(unit, recurse=False)``, FSDP2 ``unshard()``), nothing read or
merged; the row gives the most any unit costs. On CPU (gloo) a gather costs more than the unit's bytes (the
collective's own buffers). Target (issue #28): ``fork`` <= the largest unit + 10 %, where the largest unit is taken as
``one unit`` measures it (its bytes are printed too: the decoder layers with their adapters, and under FSDP the root's
embeddings, head and norm; under ZeRO-3 each other module's own parameters). The fork's sync is checked against the pristine one: same names, same values
(per-tensor float32 sums, read without a copy, 1e-4 relative: the two merge in a different order).

Needs the 1.16.0 line's environment (``lines/1.16.0/.venv``, its tree's tests for the FSDP-on-CPU shim):
    lines/1.16.0/.venv/bin/python benchmarks/peft_sync_memory.py [--sizes 100m,500m] [--backends zero3,fsdp1,fsdp2]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import MIB, build_qwen2, mmap_large_blocks, peak_extra, status_kib


BACKENDS = ("zero3", "fsdp1", "fsdp2")
SIZES = {
    "100m": {"layers": 12, "hidden": 768, "intermediate": 2048, "vocab": 16000},
    "500m": {"layers": 28, "hidden": 1024, "intermediate": 4096, "vocab": 32000},
    "tiny": {"layers": 4, "hidden": 256, "intermediate": 512, "vocab": 4000},  # the test's (tests/benchmarks)
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sizes", default="100m,500m")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--json", default=None, help="write the results to this file")
    return parser.parse_args(argv)


def _tree_root():
    """The root of the tree ``trl`` is imported from: its ``tests`` package holds the patches' test helpers."""
    import trl

    root = os.path.dirname(os.path.dirname(os.path.abspath(trl.__file__)))
    if not os.path.exists(os.path.join(root, "tests", "test_vllm_peft_sync_per_unit.py")):
        sys.exit(f"{root}/tests: not the 1.16.0 line's tree with patch 0012's tests (run with lines/1.16.0/.venv)")
    return root


def _wrap(backend, model):
    """The policy wrapped as a trainer wraps it; returns (the module VLLMGeneration holds, the accelerator)."""
    import torch
    from accelerate import Accelerator

    from tests.test_generation_gather_budget import ZERO3, make_accelerator
    from tests.test_prepare_fsdp import make_fsdp_plugin, use_fsdp_on_cpu

    if backend == "zero3":
        import deepspeed

        accelerator = make_accelerator("zero3")
        return deepspeed.initialize(model=model, config=ZERO3)[0].module, accelerator
    plugin = make_fsdp_plugin(int(backend[-1]))
    plugin.use_orig_params = True  # PEFT under FSDP1 needs original parameters
    use_fsdp_on_cpu(plugin)
    accelerator = Accelerator()
    if backend == "fsdp1":
        # As `Trainer` prepares a PEFT model under FSDP1 (not FSDP2): PEFT's wrap policy, each adapter a unit of its own
        from transformers.distributed.fsdp import update_fsdp_plugin_peft

        update_fsdp_plugin_peft(model, accelerator)
    accelerator.prepare(model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0))
    return model, accelerator


def _largest_unit(model, backend):
    """Bytes of the largest unit (a decoder layer with its adapters; under FSDP the root's own parameters, under
    ZeRO-3 each other module's own), and of the base model."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    def size(params):
        return sum(p.numel() * p.element_size() for p in params)

    total = size(p for n, p in model.named_parameters() if "lora_" not in n)
    layers = [m for m in model.modules() if isinstance(m, Qwen2DecoderLayer)]
    in_layers = {id(p) for m in layers for p in m.parameters()}
    rest = [[p for p in m.parameters(recurse=False) if id(p) not in in_layers] for m in model.modules()]
    rest = [size(params) for params in rest] if backend == "zero3" else [size(p for ps in rest for p in ps)]
    return max(max(size(m.parameters()) for m in layers), *rest), total


def _bench(size, backend, out_dir):
    import torch
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model

    sys.path.insert(0, _tree_root())
    import trl.generation.vllm_generation as vllm_generation
    from trl.distributed import DistributedBackend

    torch.set_num_threads(1)
    # A start once more (gloo aborted a process): what the first start wrote must not stand for this one's results.
    # Every process clears them all before its first collective; each writes its own after its last.
    for path in Path(out_dir).glob("*.json"):
        path.unlink(missing_ok=True)
    options = SIZES[size]
    model = build_qwen2(options)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=targets, init_lora_weights=False)
    model = get_peft_model(model, lora)
    largest_unit, total = _largest_unit(model, backend)
    inner, accelerator = _wrap(backend, model)
    # What a trainer's process has done before its first sync: GRPOTrainer.__init__ asks Accelerate's `is_peft_model`,
    # which imports DeepSpeed where it is installed, a one-time cost of the process that would otherwise count as the
    # first sync's under FSDP (under ZeRO-3 DeepSpeed is imported already)
    from accelerate.utils import is_peft_model

    before = status_kib("VmRSS")
    assert is_peft_model(inner)
    trainer_init = (status_kib("VmRSS") - before) * 1024
    generation = vllm_generation.VLLMGeneration.__new__(vllm_generation.VLLMGeneration)
    generation.model, generation.accelerator = inner, accelerator
    generation._dist = DistributedBackend(accelerator)
    rank = dist.get_rank()

    def sync():
        sums = {}
        for name, tensor in generation._iter_named_params():
            if rank == 0:  # the main process reads what it sends
                sums[name] = float(tensor.sum())  # fp32 model: no copy
        return sums

    results = {"one unit": _one_unit_at_a_time(generation)}
    merges_per_unit = vllm_generation._merges_per_unit
    for variant in ("fork", "fork again", "pristine"):
        vllm_generation._merges_per_unit = merges_per_unit if variant.startswith("fork") else (lambda model: False)
        gc.collect()
        dist.barrier()
        error = None
        with peak_extra() as peak:
            start = time.perf_counter()
            try:
                sums = sync()
            except Exception as exc:
                error, sums = f"{type(exc).__name__}: {str(exc)[:120]}", None
            seconds = time.perf_counter() - start
        results[variant] = {"peak_extra": peak.bytes, "seconds": seconds, "error": error, "sums": sums}
        if error is not None:
            break  # the processes are no longer in step
        dist.barrier()
    result = {"rank": rank, "largest_unit": largest_unit, "total": total, "is_peft_model": trainer_init, **results}
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(result, f)


def _one_unit_at_a_time(generation):
    """Peak extra of gathering each unit alone, as the backend gathers it; the largest over the units."""
    import torch.distributed as dist
    from peft.tuners.lora import LoraLayer
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from trl.generation.vllm_generation import _fsdp1_wrapper
    from trl.models.utils import _deepspeed3_units, _lazy_init_fsdp_roots, _outermost

    model, dist_backend = generation.model, generation._dist
    if dist_backend.is_zero3:
        import deepspeed

        lora = {id(p): m for m in model.modules() if isinstance(m, LoraLayer) for p in m.get_base_layer().parameters()}
        units = []
        for unit in _deepspeed3_units(model):
            extra = [p for param in unit if id(param) in lora for p in lora[id(param)].parameters()]
            units.append(list({id(p): p for p in [*unit, *extra]}.values()))

        def gather(unit):
            with deepspeed.zero.GatheredParameters(unit):
                pass

    elif dist_backend.fsdp_version == 1:
        root = _fsdp1_wrapper(model, generation.accelerator)
        _lazy_init_fsdp_roots([root])
        units = FSDP.fsdp_modules(root)

        def gather(unit):
            with FSDP.summon_full_params(unit, recurse=False, writeback=False):
                pass

    else:
        from torch.distributed.fsdp import FSDPModule

        units = [module for module in model.modules() if isinstance(module, FSDPModule)]
        _lazy_init_fsdp_roots(_outermost(units))

        def gather(unit):
            unit.unshard()
            unit.reshard()

    peak, start = 0, time.perf_counter()
    for unit in units:
        gc.collect()
        dist.barrier()
        with peak_extra() as measured:
            gather(unit)
        peak = max(peak, measured.bytes)
    return {"peak_extra": peak, "seconds": time.perf_counter() - start, "error": None, "sums": None}


def run(size, backend, ranks):
    from tests.test_prepare_fsdp import run_distributed

    with tempfile.TemporaryDirectory() as out_dir:
        try:
            # (started once more if gloo aborts a process, as the patches' tests are)
            run_distributed(_bench, size, backend, out_dir, world_size=ranks, timeout=1800)
        except Exception as exc:  # a process that crashed: what the others wrote is still reported
            print(f"[{size} {backend}] {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
        results = []
        for rank in range(ranks):
            path = os.path.join(out_dir, f"{rank}.json")
            if os.path.exists(path):
                with open(path) as f:
                    results.append(json.load(f))
    return results


def check_same(results):
    main = next(r for r in results if r["rank"] == 0)
    fork, pristine = main["fork"]["sums"], (main.get("pristine") or {}).get("sums")
    if fork is None or pristine is None:
        return "n/a"
    if sorted(fork) != sorted(pristine):
        return f"names differ: {sorted(set(fork) ^ set(pristine))[:4]}"
    worst = max(abs(fork[n] - pristine[n]) / max(1.0, abs(pristine[n])) for n in fork)
    return f"same ({worst:.0e})" if worst < 1e-4 else f"values differ ({worst:.1e})"


def main(argv=None):
    options = parse_args(argv)
    mmap_large_blocks()
    sys.path.insert(0, _tree_root())
    rows, imports = [], []
    print(
        "| size | backend | params | largest unit | variant | peak extra / rank (max) | <= one unit + 10 % | time | output |"
    )
    print("| --- | --- | ---: | ---: | --- | ---: | --- | ---: | --- |")
    for size in options.sizes.split(","):
        for backend in options.backends.split(","):
            results = run(size, backend, options.ranks)
            if not results:
                print(f"| {size} | {backend} | | | | no result | | | |")
                continue
            same = check_same(results)
            imports.append((size, backend, max(r["is_peft_model"] for r in results)))
            unit, total = results[0]["largest_unit"], results[0]["total"]
            one_unit = max(r["one unit"]["peak_extra"] for r in results)
            for variant in ("one unit", "fork", "fork again", "pristine"):
                per_rank = [r.get(variant) for r in results]
                if any(v is None for v in per_rank):
                    continue
                errors = [v["error"] for v in per_rank if v["error"]]
                peak = max(v["peak_extra"] for v in per_rank)
                seconds = max(v["seconds"] for v in per_rank)
                bound = 1.1 * one_unit
                verdict = "fails: " + errors[0] if errors else ("ok" if peak <= bound else "over")
                verdict = "-" if variant == "one unit" else verdict
                row = dict(
                    size=size,
                    backend=backend,
                    params=total // 4,
                    largest_unit=unit,
                    variant=variant,
                    peak_extra=peak,
                    seconds=seconds,
                    verdict=verdict,
                    output=same,
                )
                rows.append(row)
                print(
                    f"| {size} | {backend} | {total / 4 / 1e6:.1f}M | {unit / MIB:.1f} MiB | {variant} | "
                    f"{peak / MIB:.1f} MiB ({peak / unit:.0%} of the unit, {peak / total:.0%} of the model) | "
                    f"{verdict} | {seconds:.1f} s | {same if variant != 'one unit' else ''} |",
                    flush=True,
                )
    if imports:
        print("\n| size | backend | resident memory added by `is_peft_model` before measuring (rank max) |")
        print("| --- | --- | ---: |")
        for size, backend, added in imports:
            print(f"| {size} | {backend} | {added / MIB:.1f} MiB |")
    if options.json:
        with open(options.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
