"""Seconds and peak extra memory per weight sync into a real vLLM (its CPU build) on the 1.16.0 line (issue #37 item 6).

For each model size (``--sizes``: ``100m`` is 12 layers, hidden 768, intermediate 2048, vocabulary 16,000, about 100M
parameters; ``500m`` is 28 layers, hidden 1024, intermediate 4096, vocabulary 32,000, about 505M; untied head,
float32), each backend (``--backends``: FSDP2, ZeRO-3; the patches' CPU helpers wrap the policy as a trainer does)
and each mode (``--modes``), 2 training processes (gloo) sync a freshly wrapped policy ``--reps`` times with
``VLLMGeneration.sync_weights``, the fork's path:

- ``colocate``: a vLLM engine in each training process (patch 0022: vLLM's own reload on its CPU platform);
- ``server``: a real ``trl vllm-serve --weight_transfer_backend gloo`` (patch 0027), one worker; the main process
  streams the weights to it over gloo, the other takes part in the gathers.

Measured on every process, for each sync: its wall time (both processes start together, after a barrier) and its
peak extra resident memory (``VmHWM`` reset through ``/proc/<pid>/clear_refs`` right before the sync, minus the
resident size then; glibc told to ``mmap`` blocks of 64 KiB or more, so freed buffers leave at once); in server mode
also the server's worker processes' (the highest). The floor: a plain in-process copy of the same bytes, one
float32 model's ``state_dict`` loaded into another (``load_state_dict``, in place), in this process.

The first sync of a freshly wrapped policy also collects the names, dtypes and shapes it streams (one more walk of
the parameters under FSDP2 and ZeRO-3); the table gives the first and the last sync.

Needs vLLM's CPU build (``make venv-vllm``) and the 1.16.0 line's tree (its tests hold the CPU helpers):
    PYTHONPATH=lines/1.16.0/trl-src HF_HUB_OFFLINE=1 lines/1.16.0/.venv-vllm/bin/python benchmarks/vllm_real_sync.py \\
        [--sizes 100m,500m] [--backends fsdp2,zero3] [--modes colocate,server] [--reps 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
import tempfile
import time

from _common import MIB, build_qwen2, mmap_large_blocks, peak_extra


SIZES = {
    "tiny": {"layers": 2, "hidden": 256, "intermediate": 512, "vocab": 1000},  # for the benchmark's own test
    "100m": {"layers": 12, "hidden": 768, "intermediate": 2048, "vocab": 16000},
    "500m": {"layers": 28, "hidden": 1024, "intermediate": 4096, "vocab": 32000},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100m,500m")
    parser.add_argument("--backends", default="fsdp2,zero3")
    parser.add_argument("--modes", default="colocate,server")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the rows to this file")
    return parser.parse_args(argv)


def _tree_root():
    """The root of the tree ``trl`` is imported from: its ``tests`` package holds the patches' test helpers."""
    import trl

    root = os.path.dirname(os.path.dirname(os.path.abspath(trl.__file__)))
    if not os.path.exists(os.path.join(root, "tests", "test_vllm_gloo_weight_transfer.py")):
        sys.exit(f"{root}/tests: not the 1.16.0 line's tree with patch 0027's tests (PYTHONPATH=lines/1.16.0/trl-src)")
    return root


def _proc_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def _descendants(pid):
    """Every live process below ``pid`` (the server's engine and worker processes)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                pass
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _bench(mode, backend, model_dir, base_url, server_pid, reps, out_dir):
    import torch
    import torch.distributed as dist
    from transformers import Qwen2ForCausalLM

    from tests.test_generation_gather_budget import ZERO3, make_accelerator
    from tests.test_prepare_fsdp import free_port, make_fsdp_plugin, make_tokenizer, use_fsdp_on_cpu
    from trl.generation.vllm_generation import VLLMGeneration

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if backend == "zero3":
        import deepspeed

        accelerator = make_accelerator("zero3")
        model = Qwen2ForCausalLM.from_pretrained(model_dir)
        deepspeed.initialize(model=model, config=ZERO3)
    else:
        from accelerate import Accelerator

        use_fsdp_on_cpu(make_fsdp_plugin(2))
        accelerator = Accelerator()
        model = Qwen2ForCausalLM.from_pretrained(model_dir)
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
    kwargs = {"max_model_length": 64, "gpu_memory_utilization": 0.5}
    if mode == "server":
        kwargs = {"server_base_url": base_url, "group_port": free_port() if accelerator.is_main_process else 0}
    generation = VLLMGeneration(model, accelerator, make_tokenizer(), mode=mode, **kwargs)
    server = _descendants(server_pid) if server_pid and accelerator.is_main_process else []
    syncs = []
    for _ in range(reps):
        gc.collect()
        before = {}
        for pid in server:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
            before[pid] = _proc_kib(pid, "VmRSS")
        dist.barrier()
        with peak_extra() as peak:
            start = time.perf_counter()
            generation.sync_weights()
            seconds = time.perf_counter() - start
        server_peak = max(((_proc_kib(pid, "VmHWM") - before[pid]) * 1024 for pid in server), default=None)
        syncs.append({"seconds": seconds, "peak_extra": peak.bytes, "server_peak_extra": server_peak})
    with open(os.path.join(out_dir, f"{dist.get_rank()}.json"), "w") as f:
        json.dump({"rank": dist.get_rank(), "syncs": syncs}, f)


def _floor(size):
    """A plain in-process copy of the same bytes: the model's state dict loaded into another model, in place (both
    built in memory: a model loaded from its files may still be mapped, and its first reading would count)."""
    import torch

    source, target = build_qwen2(SIZES[size]), build_qwen2(SIZES[size])
    state = source.state_dict()
    with torch.no_grad(), peak_extra() as peak:
        start = time.perf_counter()
        target.load_state_dict(state)
        seconds = time.perf_counter() - start
    total = sum(t.numel() * t.element_size() for t in state.values())
    del source, target, state
    gc.collect()
    return seconds, peak.bytes, total


def main(argv=None):
    options = parse_args(argv)
    mmap_large_blocks()
    sys.path.insert(0, _tree_root())
    from tests.test_prepare_fsdp import make_tokenizer, run_distributed
    from tests.test_vllm_gloo_weight_transfer import Server

    rows = []
    print(
        "| size | mode | backend | sync | seconds (max of 2 processes) | peak extra, trainer (max) | peak extra, server |"
    )
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    for size in options.sizes.split(","):
        with tempfile.TemporaryDirectory() as model_dir:
            build_qwen2(SIZES[size]).save_pretrained(model_dir)
            make_tokenizer().save_pretrained(model_dir)
            seconds, extra, total = _floor(size)
            rows.append({"size": size, "mode": "floor", "seconds": seconds, "peak_extra": extra, "bytes": total})
            print(
                f"| {size} ({total / 4 / 1e6:.0f}M, {total / MIB:.0f} MiB) | in-process copy | - | - | {seconds:.2f} | "
                f"{extra / MIB:.0f} MiB | - |",
                flush=True,
            )
            for mode in options.modes.split(","):
                server = Server(model_dir, os.path.join(model_dir, "server.log")) if mode == "server" else None
                try:
                    for backend in options.backends.split(","):
                        with tempfile.TemporaryDirectory() as out_dir:
                            args = (
                                mode,
                                backend,
                                model_dir,
                                server and server.base_url,
                                server and server.process.pid,
                            )
                            try:
                                run_distributed(_bench, *args, options.reps, out_dir, world_size=2, timeout=1800)
                            except Exception as exc:
                                error = str(exc).splitlines()[-1][:150]
                                rows.append({"size": size, "mode": mode, "backend": backend, "error": error})
                                print(f"| {size} | {mode} | {backend} | fails: {error} |", flush=True)
                                continue
                            results = []
                            for rank in range(2):
                                with open(os.path.join(out_dir, f"{rank}.json")) as f:
                                    results.append(json.load(f))
                        for index in sorted({0, options.reps - 1}):
                            syncs = [r["syncs"][index] for r in results]
                            row = {
                                "size": size,
                                "mode": mode,
                                "backend": backend,
                                "sync": index + 1,
                                "seconds": max(s["seconds"] for s in syncs),
                                "peak_extra": max(s["peak_extra"] for s in syncs),
                                "server_peak_extra": syncs[0]["server_peak_extra"],
                            }
                            rows.append(row)
                            server_extra = row["server_peak_extra"]
                            print(
                                f"| {size} | {mode} | {backend} | {index + 1} | {row['seconds']:.2f} | "
                                f"{row['peak_extra'] / MIB:.0f} MiB | "
                                f"{'-' if server_extra is None else f'{server_extra / MIB:.0f} MiB'} |",
                                flush=True,
                            )
                finally:
                    if server is not None:
                        server.stop()
    if options.json:
        with open(options.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
