"""Parameter memory and decode speed of generation under ZeRO-3, FSDP1 and FSDP2, per unwrapping mode (issue #7).

N ranks on the CPU (gloo). A randomly initialised Qwen2 causal LM built in code (default: 12 layers, hidden 768,
vocab 16k, tied embeddings: ~97M parameters, fp32) is wrapped the way accelerate wraps it (one unit per decoder
layer plus the root), then generates greedily inside ``trl.models.utils.unwrap_model_for_generation``:

- ``plain``: no wrapper, a full copy of the model on every rank, plain ``model.generate`` (the speed reference);
  every variant generates with ``synced_gpus=True``, as ``generate()`` does by itself under ZeRO-3 and FSDP;
- ``default``: the context manager's default mode (parameters gathered once for the generation);
- ``disabled``: ``disable_unwrapping=True`` (parameters stay sharded, gathered one unit / layer at a time);
- ``budget P%``: the same with ``gather_budget_mb`` at P % of the model (issue #17: the units that fit stay gathered
  for the whole generation); only when the ``trl`` benchmarked has that argument (``--budgets``, default 25,50,100).

Per rank and variant:

- peak parameter bytes while generating: the bytes of every distinct storage holding parameter data, sampled in
  forward pre and post hooks of every module during one generation: parameters (also while gathered), ZeRO-3
  partitions (``ds_tensor``), FSDP1 local shards and padded unsharded flat parameters, FSDP2 padded shards and
  all-gather outputs. Views count once, through their storage.
- resident bytes: the same, outside of generation (between steps).
- decode speed: generated tokens per second of ``generate()`` on a run without the hooks, ``--repeats`` generations
  after one warm-up, each right after one of the plain model (turns, so that both see the same machine load); the
  ratio to plain is the median of the per-turn ratios ("vs plain"), also with the gather before the generation and
  the reshard after it counted ("with gather").

Targets (issues #7 and #17): with unwrapping disabled, peak <= full / N + budget + the largest unit + 10 % of the
full model (FSDP: units are the decoder layers and the root's own parameters; ZeRO-3: the modules that own
parameters); the default mode's decode speed >= 90 % of ``plain``; speed grows with the budget.

ZeRO-3 runs with the DeepSpeed settings a Hugging Face config usually has (``auto``: persistence threshold
10 x hidden, prefetch bucket 0.9 x hidden^2; ``stage3_max_live_parameters`` / ``stage3_max_reuse_distance`` at
their 1e9 defaults) as ``zero3``, and with the last two at 0 as ``zero3-release`` (DeepSpeed releases each module's
parameters after its forward), and as ``zero3-prefetch`` with the live parameters at two layers, the reuse distance at
0 and the prefetch bucket at one layer (DeepSpeed prefetches the next layer). Backends: ``fsdp1``, ``fsdp2``,
``zero3``, ``zero3-release``, ``zero3-prefetch``.

Usage (10 to 20 minutes on 2 shared CPU cores with the defaults):
    python benchmarks/generation_memory.py --trl /path/to/fork/trl-src [--json out.json]
    python benchmarks/generation_memory.py --backends fsdp1 --layers 4 --new-tokens 8     # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import functools
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

from _common import deepspeed_on_cpu, free_port, set_rank_env


BACKENDS = ("fsdp1", "fsdp2", "zero3", "zero3-release", "zero3-prefetch")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trl", default=None, help="directory holding the `trl` package to benchmark")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--budgets",
        default="25,50,100",
        help="gather budgets to run in keep-sharded mode, in %% of the model (budget 0 is the `disabled` variant); "
        "skipped when the `trl` benchmarked has no `gather_budget_mb`",
    )
    parser.add_argument(
        "--default-only",
        action="store_true",
        help="only the default mode, entered as TRL 0.16.1's callers enter it (no new argument), no timing: the "
        "peak per rank while generating, for the do-no-harm memory gate (tests/harness/memory_gate.py)",
    )
    parser.add_argument("--json", default=None, help="write the results to this file")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------- measurement


def _param_storage_bytes(model):
    """Bytes of the distinct storages holding parameter data reachable from ``model`` (see the module docstring)."""
    import torch

    storages = {}

    def add(tensor):
        if not isinstance(tensor, torch.Tensor):
            return
        tensor = getattr(tensor, "_local_tensor", tensor)  # DTensor
        storage = tensor.untyped_storage()
        if storage.nbytes():
            storages[storage.data_ptr()] = storage.nbytes()

    for param in model.parameters():
        add(param)
        add(getattr(param, "ds_tensor", None))
    for module in model.modules():
        handle = module.__dict__.get("_handle")  # FSDP1
        if handle is not None and hasattr(handle, "flat_param"):
            flat = handle.flat_param
            add(flat)
            add(getattr(flat, "_local_shard", None))
            add(getattr(flat, "_full_param_padded", None))
        get_state = getattr(type(module), "_get_fsdp_state", None)  # FSDP2
        if get_state is not None:
            for group in get_state(module)._fsdp_param_groups:
                # All-gather outputs not yet copied out (a prefetch), or kept until the next copy-out (FSDP2's
                # implicit forward prefetching frees a layer's all-gather output only after the next one's)
                add(getattr(getattr(group, "_all_gather_result", None), "all_gather_output", None))
                state = getattr(getattr(group, "comm_ctx", None), "all_gather_state", None)
                add(getattr(getattr(state, "all_gather_result", None), "all_gather_output", None))
                for fsdp_param in group.fsdp_params:
                    add(fsdp_param._sharded_param_data)
                    for output in fsdp_param.all_gather_outputs:
                        add(output)
                    add(getattr(fsdp_param, "_unsharded_param", None))
        for value in module.__dict__.values():  # FSDP1 without use_orig_params sets views as plain attributes
            add(value)
    return sum(storages.values())


class _PeakSampler:
    def __init__(self, model, root):
        self.root = root
        self.peak = 0
        self.handles = []
        for module in model.modules():
            self.handles.append(module.register_forward_pre_hook(self._sample))
            self.handles.append(module.register_forward_hook(self._sample))

    def _sample(self, *_):
        self.peak = max(self.peak, _param_storage_bytes(self.root))

    def remove(self):
        for handle in self.handles:
            handle.remove()


# ----------------------------------------------------------------------------------------------- the workers


def _build_model(a):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.heads,
        max_position_embeddings=a.prompt + a.new_tokens + 8,
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    return Qwen2ForCausalLM(config).eval()


def _wrap(backend, model, a):
    import torch

    if backend == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Qwen2DecoderLayer})
        return FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu")), None
    if backend == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model, None
    import deepspeed

    zero = {
        "stage": 3,
        "stage3_param_persistence_threshold": 10 * a.hidden,
        "stage3_prefetch_bucket_size": int(0.9 * a.hidden * a.hidden),
    }
    if backend == "zero3-release":
        zero.update(stage3_max_live_parameters=0, stage3_max_reuse_distance=0)
    if backend == "zero3-prefetch":
        # Released after each forward, and the next layer prefetched: at most two layers gathered by DeepSpeed
        layer = sum(p.numel() for p in model.model.layers[0].parameters())
        zero.update(
            stage3_max_live_parameters=2 * layer, stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=layer
        )
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero, "zero_allow_untested_optimizer": True}
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)  # ZeRO-3 hooks are those of a training engine
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, 3


def _largest_unit_numel(backend, model):
    if backend.startswith("zero3"):
        return max(sum(p.numel() for p in module.parameters(recurse=False)) for module in model.modules())
    layers = [sum(p.numel() for p in layer.parameters()) for layer in model.model.layers]
    root = sum(p.numel() for p in model.parameters()) - sum(layers)  # embedding (tied head) and final norm
    return max(layers + [root])


def _worker(rank, world_size, backend, port, a, out_dir):
    set_rank_env(rank, world_size, port)
    os.environ["DS_ACCELERATOR"] = "cpu"
    if a.trl:
        sys.path.insert(0, a.trl)
    import torch
    import torch.distributed as dist
    from accelerate.utils import extract_model_from_parallel

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=600))
    if backend.startswith("zero3"):
        deepspeed_on_cpu()  # plain gloo, and async gathers completed before use (benchmarks/_common.py)
    from transformers import GenerationConfig

    import trl
    from trl.models.utils import unwrap_model_for_generation

    result = {"rank": rank, "backend": backend, "trl": trl.__file__}
    model = _build_model(a)
    full_numel = sum(p.numel() for p in model.parameters())
    result.update(
        full_bytes=4 * full_numel, full_numel=full_numel, largest_unit_bytes=4 * _largest_unit_numel(backend, model)
    )
    generator = torch.Generator().manual_seed(1)
    prompts = torch.randint(10, a.vocab, (a.batch, a.prompt), generator=generator)
    generation_config = GenerationConfig(
        max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    new_tokens = a.batch * a.new_tokens

    def decode(model, timings):
        start = time.perf_counter()
        # Every variant, plain included, steps in sync with the other ranks as generate() does by itself under ZeRO-3
        # and FSDP (`synced_gpus`), so that only the way the parameters are held differs
        output = model.generate(prompts, generation_config=generation_config, synced_gpus=True)
        timings["decode"] = timings.get("decode", 0.0) + time.perf_counter() - start
        return output

    def interleaved(run):
        """Times ``run`` and the plain model in turns (the machine's load drifts), after one warm-up of each."""
        run({})
        decode(plain, {})
        plain_decode, decode_s, block_s = [], [], []
        for _ in range(a.repeats):
            dist.barrier()
            timings = {}
            decode(plain, timings)
            plain_decode.append(timings["decode"])
            dist.barrier()
            timings = {}
            start = time.perf_counter()
            run(timings)
            block_s.append(time.perf_counter() - start)
            decode_s.append(timings["decode"])
        return {
            "tokens_per_s": new_tokens * a.repeats / sum(decode_s),  # generate() alone
            "block_tokens_per_s": new_tokens * a.repeats / sum(block_s),  # with the gather before, the reshard after
            "gather_and_release_s": (sum(block_s) - sum(decode_s)) / a.repeats,
            "plain_tokens_per_s": new_tokens * a.repeats / sum(plain_decode),  # measured in the same turns
            # speed relative to plain, turn by turn (robust to the load of a shared machine): the median
            "speed_ratio": statistics.median(p / d for p, d in zip(plain_decode, decode_s)),
            "block_speed_ratio": statistics.median(p / b for p, b in zip(plain_decode, block_s)),
        }

    # plain: a full copy on each rank, no context manager
    plain = copy.deepcopy(model)
    sampler = _PeakSampler(plain, plain)
    expected = plain.generate(prompts, generation_config=generation_config, synced_gpus=True)
    sampler.remove()
    result["plain"] = {"peak_bytes": sampler.peak}

    wrapped, zero_stage = _wrap(backend, model, a)
    accelerator = SimpleNamespace(
        state=SimpleNamespace(deepspeed_plugin=None if zero_stage is None else SimpleNamespace(zero_stage=zero_stage)),
        unwrap_model=extract_model_from_parallel,
    )
    result["resident_bytes"] = _param_storage_bytes(wrapped)
    parameters = inspect.signature(unwrap_model_for_generation.__wrapped__).parameters
    budget_mb = {p: p / 100 * 4 * full_numel / 2**20 for p in a.budgets}
    if "disable_unwrapping" in parameters:  # the 0.16.1 line: a default and a keep-sharded mode, budgets in the latter
        result["default_gathers"] = True
        variants = [("default", {"disable_unwrapping": False}, None), ("disabled", {"disable_unwrapping": True}, None)]
        if "gather_budget_mb" in parameters:
            variants += [
                (f"budget {p}%", {"disable_unwrapping": True, "gather_budget_mb": budget_mb[p]}, p) for p in a.budgets
            ]
    else:
        # TRL 1.x: ZeRO-3 gathers the whole model by default and lets DeepSpeed gather each module at each forward
        # with `gather_deepspeed3_params=False`; FSDP has one mode, every layer gathered at each forward. The budget
        # (the 1.16.0 line of the fork) also goes to 0
        result["default_gathers"] = backend.startswith("zero3")
        variants = [("default", {}, None)]
        if backend.startswith("zero3"):
            variants.append(("sharded", {"gather_deepspeed3_params": False}, None))
        if "gather_budget_mb" in parameters:
            budget_mb.setdefault(0, 0.0)
            variants += [(f"budget {p}%", {"gather_budget_mb": budget_mb[p]}, p) for p in sorted(budget_mb)]
    if a.default_only:
        variants = [("default", {}, None)]
    result["variants"] = [name for name, *_ in variants]
    root_context = contextlib.nullcontext
    if backend == "fsdp1" and "disable_unwrapping" not in parameters:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        # As TRL 1.x's trainers do: the root's own parameters unsharded for generate, the layers gather themselves
        root_context = functools.partial(FSDP.summon_full_params, wrapped, recurse=False)
    for mode, kwargs, budget_percent in variants:

        def generate(timings, sample=False, kwargs=kwargs):
            with unwrap_model_for_generation(wrapped, accelerator, **kwargs) as unwrapped_model, root_context():
                sampler = _PeakSampler(unwrapped_model, wrapped) if sample else None
                try:
                    return decode(unwrapped_model, timings), sampler
                finally:
                    if sampler is not None:
                        sampler.remove()

        output, sampler = generate({}, sample=True)
        result[mode] = {
            "budget_bytes": 0 if budget_percent is None else budget_percent / 100 * 4 * full_numel,
            "peak_bytes": sampler.peak,
            "matches_plain": bool(torch.equal(output, expected)),
            "resident_after_bytes": _param_storage_bytes(wrapped),
            **({} if a.default_only else interleaved(generate)),
        }
    with open(os.path.join(out_dir, f"{backend}-rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------- report


def _mib(n):
    return f"{n / 2**20:,.1f}"


def summarize(results, ranks):
    rows, checks = [], []
    for backend, per_rank in results.items():
        r0 = per_rank[0]
        full, unit = r0["full_bytes"], r0["largest_unit_bytes"]
        plain_peak = max(r["plain"]["peak_bytes"] for r in per_rank)
        rows.append((backend, "plain", plain_peak, plain_peak / full, None, None, None, None))
        ratios = {}
        default_gathers = r0.get("default_gathers", True)
        for variant in r0.get("variants", ["default", "disabled"]):
            peak = max(r[variant]["peak_bytes"] for r in per_rank)
            speed = min(r[variant]["tokens_per_s"] for r in per_rank)
            plain_speed = min(r[variant]["plain_tokens_per_s"] for r in per_rank)
            ratio = min(r[variant]["speed_ratio"] for r in per_rank)
            block_ratio = min(r[variant]["block_speed_ratio"] for r in per_rank)
            gather = max(r[variant]["gather_and_release_s"] for r in per_rank)
            ratios[variant] = ratio
            rows.append((backend, variant, peak, peak / full, speed, ratio, block_ratio, gather, plain_speed))
            if variant == "default" and default_gathers:
                continue
            # Targets: peak <= 1/N + budget + the largest unit + 10 % of the model (issues #7 and #17)
            bound = full / ranks + r0[variant].get("budget_bytes", 0) + unit + 0.10 * full
            checks.append(
                {
                    "backend": backend,
                    "variant": variant,
                    "full_bytes": full,
                    "largest_unit_bytes": unit,
                    "resident_bytes": max(r["resident_bytes"] for r in per_rank),
                    "peak_bytes": peak,
                    "bound_bytes": bound,
                    "peak_ok": peak <= bound,
                    "speed_ratio": ratio,
                    "outputs_match_plain": all(r[variant]["matches_plain"] for r in per_rank),
                }
            )
        if not default_gathers:  # TRL 1.x under FSDP: the default mode keeps the model sharded, checked above
            continue
        checks.append(
            {
                "backend": backend,
                "variant": "default",
                "speed_ratio": ratios["default"],
                "default_speed_ok": ratios["default"] >= 0.9,
                "outputs_match_plain": all(r["default"]["matches_plain"] for r in per_rank),
            }
        )
    return rows, checks


def main(argv=None):
    a = parse_args(argv)
    import torch.multiprocessing as mp

    a.budgets = [int(b) for b in a.budgets.split(",") if b]
    backends = [b for b in a.backends.split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise SystemExit(f"unknown backend(s) {sorted(unknown)}; choose from {BACKENDS}")
    results = {}
    with tempfile.TemporaryDirectory() as out_dir:
        for backend in backends:
            start = time.time()
            mp.start_processes(
                _worker, args=(a.ranks, backend, free_port(), a, out_dir), nprocs=a.ranks, start_method="spawn"
            )
            per_rank = []
            for rank in range(a.ranks):
                with open(os.path.join(out_dir, f"{backend}-rank{rank}.json")) as f:
                    per_rank.append(json.load(f))
            results[backend] = per_rank
            print(f"[{backend}] done in {time.time() - start:.0f}s", flush=True)
    if a.default_only:
        for backend, per_rank in results.items():
            peaks = ", ".join(f"rank {r['rank']} {_mib(r['default']['peak_bytes'])} MiB" for r in per_rank)
            print(f"{backend:<16}default mode, peak while generating: {peaks}; trl from {per_rank[0]['trl']}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"args": vars(a), "results": results}, f, indent=1)
        return 0
    rows, checks = summarize(results, a.ranks)
    r0 = next(iter(results.values()))[0]
    print(
        f"\nmodel: {r0['full_numel'] / 1e6:.1f}M parameters ({_mib(r0['full_bytes'])} MiB fp32), {a.ranks} ranks, trl from {r0['trl']}"
    )
    print(
        f"generation: batch {a.batch}, prompt {a.prompt}, {a.new_tokens} new tokens, greedy, {a.repeats} timed runs\n"
    )
    header = (
        "backend",
        "variant",
        "peak MiB/rank",
        "of model",
        "decode tok/s",
        "plain tok/s",
        "vs plain",
        "with gather",
    )
    print(f"{header[0]:<16}{header[1]:<13}" + "".join(f"{h:>14}" for h in header[2:]) + f"{'gather s':>10}")
    for row in rows:
        backend, variant, peak, share = row[:4]
        line = f"{backend:<16}{variant:<13}{_mib(peak):>14}{share:>14.0%}"
        if row[4] is not None:
            speed, ratio, block_ratio, gather, plain_speed = row[4:]
            line += f"{speed:>14.1f}{plain_speed:>14.1f}{ratio:>14.0%}{block_ratio:>14.0%}{gather:>10.2f}"
        print(line)
    print()
    for c in checks:
        if c["variant"] == "default" and "default_speed_ok" in c:
            print(
                f"{c['backend']:<16}default: speed {c['speed_ratio']:.0%} of plain "
                f"({'OK' if c['default_speed_ok'] else 'MISSED'}, target 90 %); outputs match plain: "
                f"{c['outputs_match_plain']}"
            )
            continue
        print(
            f"{c['backend']:<16}{c['variant']}: peak {_mib(c['peak_bytes'])} MiB <= bound {_mib(c['bound_bytes'])} MiB "
            f"(1/N + budget + largest unit {_mib(c['largest_unit_bytes'])} MiB + 10%): "
            f"{'OK' if c['peak_ok'] else 'MISSED'}; speed {c['speed_ratio']:.0%} of plain; outputs match plain: "
            f"{c['outputs_match_plain']}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results, "checks": checks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
