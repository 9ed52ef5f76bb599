"""Weight sync to vLLM: time and per-rank peak extra memory, streamed (the fork) vs a naive full-state-dict gather.

Issue #8. At N CPU ranks (gloo), for FSDP1, FSDP2 and DeepSpeed ZeRO-3, with and without PEFT (LoRA), the script
builds a randomly initialised Qwen2 model of about 100M parameters in code, shards it the way accelerate does for
training (one FSDP unit per decoder layer plus the root; ``deepspeed.initialize`` with ZeRO-3), and sends its
weights to a stand-in vLLM client that only reads each tensor, as GRPO does (``main_process_only``: the main
process receives the weights, the other ranks take part in the collectives):

- ``naive``: gather the full state dict at once, then send it: FSDP1's ``FULL_STATE_DICT`` (``rank0_only``),
  FSDP2's ``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` (rank 0 keeps it), one
  ``GatheredParameters`` over every parameter under ZeRO-3 (what TRL 0.16.1 does with PEFT); with PEFT the
  adapters are then merged layer by layer from the gathered weights.
- ``stream``: ``trl.extras.vllm_weight_sync.iter_full_params_for_sync`` (bucket ``--bucket-mb``, the default of
  ``vllm_sync_bucket_size_mb``).
- ``stream-per-param``: the same with a bucket of one byte, one parameter (PEFT layer) per gather round, to see
  whether per-parameter messages dominate.

Measured per rank, median over ``--reps`` interleaved repetitions:

- time: wall time of one sync (all ranks start together, after a barrier);
- peak extra: the process's peak resident memory during the sync minus its resident memory right before it
  (``VmHWM`` after resetting it through ``/proc/self/clear_refs``; glibc is told to ``mmap`` every block of 64 KiB
  or more, so freed buffers leave the resident set at once);
- messages: collectives per sync (gloo operations recorded by ``torch.profiler``, one extra untimed run), gather
  rounds (buckets, or parameters, gathered in one go) and tensors sent to the client.

Before timing, every method's output is checked against the others: same names (Hugging Face checkpoint names),
same values (per-tensor float64 sums, to 1e-6 relative).

Targets (issue #8): stream's peak extra <= the bucket (a larger parameter alone) + 10 %, where the naive path needs
the whole model; stream's time <= 1.2 x naive. For comparison, the FSDP1 rows also report what summoning the largest
unit alone costs (FSDP's own unsharding, which an earlier version of the sync used).

Usage:
    PYTHONPATH=<fork tree> python benchmarks/vllm_sync_memory.py [--json out.json] [--backends fsdp1,zero3]
About 12 minutes on 2 shared CPU cores with the defaults (3 backends x 2 PEFT settings x 3 reps).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

from _common import (
    MIB,
    add_model_args,
    build_qwen2,
    deepspeed_on_cpu,
    free_port,
    mmap_large_blocks,
    peak_extra,
    set_rank_env,
)


BACKENDS = ("fsdp1", "fsdp2", "zero3")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--peft", default="off,on", help="off, on, or off,on")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=None, help="default: the fork's default")
    add_model_args(parser, vocab=16000)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--json", default=None, help="write the results to this file")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------- measurement


def _peak_extra(fn):
    """Runs ``fn`` on every rank together; returns (wall time of the slowest rank, this rank's peak extra bytes)."""
    import torch.distributed as dist

    gc.collect()
    dist.barrier()
    with peak_extra() as peak:
        start = time.perf_counter()
        fn()
    dist.barrier()
    return time.perf_counter() - start, peak.bytes


def _collectives(fn):
    """Number of backend collectives (gloo/nccl operations) ``fn`` issues on this rank."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith(("gloo:", "nccl:")))


# ----------------------------------------------------------------------------------------------- the model


def _build_model(options, peft):
    model = build_qwen2(options)
    if peft:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        lora = LoraConfig(r=options["lora_r"], lora_alpha=2 * options["lora_r"], target_modules=targets)
        lora.init_lora_weights = False  # non-zero adapters: merging changes the weights
        model = get_peft_model(model, lora)
    return model


def _shard(model, backend):
    import torch

    if backend == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

        return FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy({Qwen2DecoderLayer}),
            use_orig_params=True,
            device_id=torch.device("cpu"),
        )
    if backend == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

        for module in model.modules():
            if isinstance(module, Qwen2DecoderLayer):
                fully_shard(module)
        fully_shard(model)
        return model
    import deepspeed

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine.module


def _unit_bytes(model):
    """Full bytes of the largest FSDP unit as the benchmark wraps it: a decoder layer, or the rest (the root's)."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    total = sum(p.numel() * p.element_size() for p in model.parameters())
    layers = [
        sum(p.numel() * p.element_size() for p in m.parameters())
        for m in model.modules()
        if isinstance(m, Qwen2DecoderLayer)
    ]
    return max(max(layers), total - sum(layers)), total


# ----------------------------------------------------------------------------------------------- the syncs


def _merge_from_state_dict(state_dict, peft_model):
    """Naive PEFT handling: names of the base model, each LoRA layer merged from the gathered weights."""
    from peft.tuners.lora import LoraLayer

    merged = {}
    layers = {
        name.replace("_fsdp_wrapped_module.", ""): m
        for name, m in peft_model.named_modules()
        if isinstance(m, LoraLayer)
    }
    for name, tensor in state_dict.items():
        if "lora_" in name:
            continue
        if name.endswith(".base_layer.weight"):
            prefix = name[: -len(".base_layer.weight")]
            layer = layers[prefix]
            a = state_dict[f"{prefix}.lora_A.default.weight"]
            b = state_dict[f"{prefix}.lora_B.default.weight"]
            tensor = tensor + (b @ a) * layer.scaling["default"]
        merged[name.removeprefix("base_model.model.").replace(".base_layer", "")] = tensor
    return merged


def _naive(model, backend, peft, main_only, send):
    import torch.distributed as dist

    is_main = dist.get_rank() == 0
    if backend in ("fsdp1", "fsdp2"):
        if backend == "fsdp1":  # (get_model_state_dict's cpu_offload crashes FSDP1 on CPU parameters)
            from torch.distributed.fsdp import FullStateDictConfig, StateDictType
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            config = FullStateDictConfig(offload_to_cpu=False, rank0_only=main_only)
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
                state_dict = model.state_dict()
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            options = StateDictOptions(full_state_dict=True, cpu_offload=main_only)
            state_dict = get_model_state_dict(model, options=options)
        if is_main or not main_only:
            if peft:
                state_dict = _merge_from_state_dict(state_dict, model)
            for name, tensor in state_dict.items():
                send(name.removeprefix("_orig_mod."), tensor)
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        if dist.get_backend() == "gloo":  # see trl/extras/vllm_weight_sync.py: DeepSpeed's gather is racy on gloo
            dist.barrier()
        if is_main or not main_only:
            state_dict = {name: p.data for name, p in model.named_parameters()}
            if peft:
                state_dict = _merge_from_state_dict(state_dict, model)
            for name, tensor in state_dict.items():
                send(name, tensor)


def _stream(model, main_only, send, bucket_mb):
    from trl.extras.vllm_weight_sync import iter_full_params_for_sync

    for name, tensor in iter_full_params_for_sync(model, bucket_size_mb=bucket_mb, main_process_only=main_only):
        if tensor is not None:
            send(name, tensor)


def _gather_rounds(model, backend, method, bucket_mb):
    """Gather rounds of one streamed sync: buckets (None for the naive path)."""
    if method == "naive":
        return None
    from trl.extras import vllm_weight_sync as sync

    model = sync._unwrap_model(model)
    # FSDP1 hides the parameters in flat parameters: their sizes are in its metadata
    nbytes = sync._fsdp1_nbytes(sync._fsdp1_layouts(model)) if backend == "fsdp1" else None
    return len(list(sync._buckets(sync._collect_blocks(model), bucket_mb, nbytes)))


# ----------------------------------------------------------------------------------------------- worker


def _bench(options, backend, peft, methods, bucket_mb, rank, world_size):
    import torch
    import torch.distributed as dist

    model = _build_model(options, peft)
    num_params = sum(p.numel() for p in model.parameters())
    unit, total = _unit_bytes(model)
    largest_param = max(p.numel() * p.element_size() for p in model.parameters())
    model = _shard(model, backend)
    gc.collect()
    buckets = {"naive": None, "stream": bucket_mb, "stream-per-param": 1 / MIB}

    def run(method, send, main_only=True):
        if method == "naive":
            _naive(model, backend, peft, main_only, send)
        else:
            _stream(model, main_only, send, buckets[method])

    # Check: every method sends the same names and values (to the main process)
    sums = {}
    for method in methods:
        got = {}
        run(method, lambda name, t, got=got: got.__setitem__(name, t.double().sum().item()))
        sums[method] = got
    if rank == 0:
        reference = sums["naive"]
        for method in methods[1:]:
            assert set(sums[method]) == set(reference), (method, sorted(set(sums[method]) ^ set(reference))[:5])
            for name, value in reference.items():
                assert abs(sums[method][name] - value) <= 1e-6 * max(1.0, abs(value)), (method, name)

    def touch(name, tensor):  # a client reads what it sends
        tensor.view(-1)[-1].item()

    collectives = {method: _collectives(lambda method=method: run(method, touch)) for method in methods}
    # For comparison, what gathering the largest FSDP1 unit alone takes (FSDP's summon); and the floor, what one gloo
    # all-gather of the largest parameter takes (gloo receives into a temporary flat buffer, then copies it out)
    floor = {}
    if backend == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        units = [m for m in model.modules() if isinstance(m, FSDP) and m._handle is not None]
        largest_unit = max(units, key=lambda m: sum(m._handle.flat_param._numels))

        def summon_largest():
            with FSDP.summon_full_params(largest_unit, recurse=False, writeback=False):
                pass

        floor["unit_summon"] = statistics.median(_peak_extra(summon_largest)[1] for _ in range(options["reps"]))
    numel = largest_param // 4
    shard = torch.ones(-(-numel // world_size))

    def all_gather():
        dist.all_gather_into_tensor(torch.empty(shard.numel() * world_size), shard)

    floor["param_all_gather"] = statistics.median(_peak_extra(all_gather)[1] for _ in range(options["reps"]))
    times, peaks = {m: [] for m in methods}, {m: [] for m in methods}
    for _ in range(options["reps"]):
        for method in methods:
            elapsed, peak = _peak_extra(lambda method=method: run(method, touch))
            times[method].append(elapsed)
            peaks[method].append(peak)
    rows = []
    for method in methods:
        if method == "naive":
            bound = total
        else:
            bound = max(buckets[method] * MIB, largest_param)
        rows.append(
            {
                "backend": backend,
                "peft": peft,
                "method": method,
                "rank": rank,
                "world_size": world_size,
                "num_params": num_params,
                "model_bytes": total,
                "largest_unit_bytes": unit,
                "bucket_mb": buckets[method],
                "bound_bytes": int(bound),
                "time_s": statistics.median(times[method]),
                "times_s": times[method],
                "peak_extra_bytes": int(statistics.median(peaks[method])),
                "peak_extra_max_bytes": int(max(peaks[method])),
                "largest_param_bytes": largest_param,
                "unit_summon_peak_bytes": floor.get("unit_summon"),
                "param_all_gather_peak_bytes": floor["param_all_gather"],
                "collectives": collectives[method],
                "gather_rounds": _gather_rounds(model, backend, method, buckets[method]),
                "tensors_sent": len(sums[method]) if rank == 0 else 0,
            }
        )
    return rows


def _worker(rank, world_size, port, options, backend, result_path):
    set_rank_env(rank, world_size, port)
    if backend == "zero3":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch.distributed as dist

    from trl.extras.vllm_weight_sync import DEFAULT_SYNC_BUCKET_SIZE_MB

    torch.set_num_threads(1)
    if backend == "zero3":
        import deepspeed

        deepspeed_on_cpu()  # plain gloo, and async gathers completed before use (benchmarks/_common.py)
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    bucket_mb = options["bucket_mb"] if options["bucket_mb"] is not None else DEFAULT_SYNC_BUCKET_SIZE_MB
    methods = ["naive", "stream", "stream-per-param"]
    rows = []
    for peft in options["peft"]:
        rows += _bench(options, backend, peft, methods, bucket_mb, rank, world_size)
        gc.collect()
    with open(f"{result_path}.{rank}", "w") as f:
        json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    # Every block of 64 KiB or more gets its own mapping, returned to the system when freed: the resident size then
    # follows the live tensors (set before the workers start: glibc reads it once)
    mmap_large_blocks()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.multiprocessing as mp

    options = vars(args)
    options["peft"] = [p == "on" for p in args.peft.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            path = os.path.join(tmp, backend)
            start = time.perf_counter()
            mp.spawn(_worker, args=(args.ranks, free_port(), options, backend, path), nprocs=args.ranks)
            for rank in range(args.ranks):
                with open(f"{path}.{rank}") as f:
                    rows.extend(json.load(f))
            print(f"[{backend}: {time.perf_counter() - start:.0f}s]", file=sys.stderr)
            print_rows([r for r in rows if r["backend"] == backend])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def staged_bound(row):
    """The bound once the backend's own staging is counted: the bucket, at least one all-gather of the largest
    parameter."""
    return max(row["bound_bytes"], row["param_all_gather_peak_bytes"])


def print_rows(rows):
    print(
        f"{'backend':>7} {'peft':>4} {'method':>16} {'rank':>4} {'time s':>7} {'x naive':>7} {'peak MiB':>8} "
        f"{'bound':>7} {'+stage':>7} {'model':>7} {'ok':>3} {'coll.':>5} {'rounds':>6} {'sent':>5}"
    )
    for r in rows:
        key = (r["backend"], r["peft"], r["rank"], "naive")
        naive = next(x for x in rows if (x["backend"], x["peft"], x["rank"], x["method"]) == key)
        ratio = r["time_s"] / naive["time_s"]
        if r["method"] == "naive":
            ok = ""
        elif r["peak_extra_bytes"] <= 1.1 * r["bound_bytes"]:
            ok = "yes"
        elif r["peak_extra_bytes"] <= 1.1 * staged_bound(r):
            ok = "stg"  # within the bound plus the backend's staging of one collective
        else:
            ok = "NO"
        print(
            f"{r['backend']:>7} {'on' if r['peft'] else 'off':>4} {r['method']:>16} {r['rank']:>4} {r['time_s']:7.2f} "
            f"{ratio:7.2f} {r['peak_extra_bytes'] / MIB:8.1f} {r['bound_bytes'] / MIB:7.1f} "
            f"{staged_bound(r) / MIB:7.1f} {r['model_bytes'] / MIB:7.1f} {ok:>3} {r['collectives']:>5} "
            f"{r['gather_rounds'] or '-':>6} {r['tensors_sent']:>5}"
        )


if __name__ == "__main__":
    main()
