"""GRPO's weight sync to ``trl vllm-serve``: one request per bucket (the fork) vs one request per tensor (0.16.1).

Issue #15. Patch 0023 gives ``trl vllm-serve`` a batched endpoint: ``POST /update_named_params/`` with the metadata
of one bucket, one broadcast of the bucket as a flat ``uint8`` buffer, one ``load_weights`` per bucket. TRL 0.16.1's
protocol makes one ``POST /update_named_param/``, one broadcast and one barrier per tensor. This script times both
with the real server and the real client, without vLLM and without a GPU:

- server: a separate process runs the real ``trl.scripts.vllm_serve.main`` (FastAPI app, uvicorn, the real
  ``WeightSyncWorker``) on 127.0.0.1, with vLLM's pieces replaced by stand-ins: the engine (``LLM``) owns one
  ``WeightSyncWorker`` whose model is a Qwen2 model built from the config in ``model`` (``load_weights`` copies each
  weight into it by its ``state_dict`` name, as vLLM's loaders do), ``StatelessProcessGroup`` is a gloo group over a
  ``TCPStore`` and ``PyNcclCommunicator`` broadcasts on it. A middleware counts the requests by path; a few
  ``/bench/`` routes (never counted) report the counts, zero the weights and digest them;
- trainer: 2 CPU ranks (gloo) hold a randomly initialised Qwen2 model (about 100M parameters by default) prepared by
  ``accelerate`` under FSDP1 (FULL_SHARD, one unit per decoder layer, ``use_orig_params``), run through the test
  harness's CPU shim (tests/harness/cpu_shims.py: accelerate 1.6 would otherwise run CPU ranks as ``MULTI_CPU``).
  The sync is GRPO's own ``GRPOTrainer._move_model_to_vllm``, called on a stub trainer; rank 0 holds the real
  ``VLLMClient``. *per-tensor* forces 0.16.1's protocol on it (``client._batched_updates = False``), *batched* uses
  the new endpoint.

Before timing, each mode syncs once into zeroed server weights and every weight the server then holds is checked
against the trainer's full state dict (same names, dtypes, shapes and bytes: BLAKE2 digests of the raw bytes); the
script fails otherwise. Then, per mode, median over ``--reps`` interleaved repetitions, on rank 0:

- time: wall time of ``_move_model_to_vllm`` (what GRPO waits for; both ranks start together). *server loaded*: until
  the server has loaded every weight (its last ``load_weights`` runs after the client's broadcast returned);
- requests: HTTP requests the server received during the sync (``/update_named_param(s)/`` and
  ``/reset_prefix_cache/``); buckets: the buckets GRPO handed to ``VLLMClient.update_named_params``; tensors sent;
- peak extra: rank 0's peak resident memory during the sync minus its resident memory before it (``VmHWM`` reset
  through ``/proc/self/clear_refs``; glibc told to ``mmap`` blocks of 64 KiB or more, so that freed buffers leave the
  resident set at once), against ``vllm_sync_bucket_size_mb`` (``--bucket-mb``).

A third row, *gather-only*, runs the same sync with a client that drops what it is given: the floor both modes
share (FSDP gathers, GRPO's copies of each bucket); the time each mode spends sending is its time minus that floor.

Targets (issue #15): batched requests <= buckets + 2; batched time <= 0.5 x per-tensor time; peak extra <= bucket +
10 %. The weights cross a gloo group over loopback TCP here, where NCCL would use NVLink or PCIe: on CPU the bytes
weigh more, against the per-request round trips, than they would on GPUs.

Usage:
    PYTHONPATH=lines/0.16.1/trl-src python benchmarks/vllm_server_sync.py [--reps 3] [--bucket-mb 128] [--json out.json]
    PYTHONPATH=lines/0.16.1/trl-src python benchmarks/vllm_server_sync.py --size 500m --reps 1
``--size 500m`` is 32 layers, hidden 1024, intermediate 3712, vocabulary 16000 (498.5M parameters, largest tensor
62.5 MiB); ``--layers/--hidden/--intermediate/--vocab`` override either size. About 1 minute on 2 shared CPU cores
with the defaults (100M, 3 reps), about 2 minutes with ``--size 500m`` (3 reps).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import warnings
from datetime import timedelta
from types import SimpleNamespace
from unittest import mock

from _common import (
    MIB,
    add_model_args,
    build_qwen2,
    free_port,
    mmap_large_blocks,
    peak_extra,
    qwen2_config,
    set_rank_env,
)


HOST = "127.0.0.1"
MODES = ("per-tensor", "batched")
FLOOR = "gather-only"  # reference: GRPO's sync with a client that sends nothing
SIZES = {
    "100m": {"layers": 12, "hidden": 768, "intermediate": 2048, "vocab": 16000},
    "500m": {"layers": 32, "hidden": 1024, "intermediate": 3712, "vocab": 16000},
}
GROUP_TIMEOUT_S = 300  # gloo groups (trainer ranks; client and server worker)
SERVER_START_TIMEOUT_S = 300
LOAD_TIMEOUT_S = 300  # the server's last load_weights after a sync


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="100m", help="model size (default 100m)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=None, help="vllm_sync_bucket_size_mb (fork's default)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before the run is killed")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    add_model_args(parser, vocab=16000)
    known, _ = parser.parse_known_args(argv)
    parser.set_defaults(**SIZES[known.size])  # explicit --layers/--hidden/... still win
    return parser.parse_args(argv)


def _digest(tensor):
    """dtype, shape and a digest of the raw bytes of ``tensor``: equal digests mean bitwise equal tensors."""
    import torch

    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return [str(tensor.dtype), list(tensor.shape), hashlib.blake2b(data, digest_size=16).hexdigest()]


# ----------------------------------------------------------------------------------------------- vLLM stand-ins


class GlooGroup:
    """Stand-in for vLLM's ``StatelessProcessGroup``: a gloo group of the client and the server's worker on
    127.0.0.1 (the host the client passes to the server, 0.0.0.0, is ignored)."""

    def __init__(self, pg):
        self.pg = pg

    @classmethod
    def create(cls, host, port, rank, world_size):
        import torch.distributed as dist

        timeout = timedelta(seconds=GROUP_TIMEOUT_S)
        store = dist.TCPStore(HOST, port, world_size, is_master=rank == 0, timeout=timeout)
        return cls(dist.ProcessGroupGloo(store, rank, world_size, timeout))

    def barrier(self):
        self.pg.barrier().wait()


class GlooCommunicator:
    """Stand-in for vLLM's ``PyNcclCommunicator``: broadcasts on the gloo group."""

    def __init__(self, group, device):
        self.group = group

    def broadcast(self, tensor, src, stream=None):
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = src
        self.group.pg.broadcast([tensor], options).wait()


VLLM_STAND_INS = {
    "is_vllm_available": lambda: True,
    "StatelessProcessGroup": GlooGroup,
    "PyNcclCommunicator": GlooCommunicator,
}


# ----------------------------------------------------------------------------------------------- server


_SERVER = SimpleNamespace(llm=None, requests={}, lock=threading.Lock())


class ServedModel:
    """The engine's model: a Qwen2 model built from the config in ``model_dir``, weights zeroed (no checkpoint);
    ``load_weights`` copies each weight into it by its ``state_dict`` name, as vLLM's loaders do (a name the model
    lacks is a ``KeyError``, a wrong shape an error)."""

    def __init__(self, model_dir):
        import torch
        from transformers import AutoConfig, Qwen2ForCausalLM

        with torch.device("meta"):
            model = Qwen2ForCausalLM(AutoConfig.from_pretrained(model_dir))
        self.model = model.to_empty(device="cpu")
        self.state = self.model.state_dict()
        self.load_calls = self.tensors_loaded = 0
        self.zero()

    def zero(self):
        for tensor in self.state.values():
            tensor.zero_()

    def load_weights(self, weights):
        count = 0
        for name, weight in weights:
            target = self.state[name]
            if target.shape != weight.shape:
                raise ValueError(f"{name}: shape {tuple(weight.shape)} sent, {tuple(target.shape)} expected")
            target.copy_(weight)
            count += 1
        with _SERVER.lock:
            self.load_calls += 1
            self.tensors_loaded += count


class StandInLLM:
    """Stand-in for ``vllm.LLM``: one worker of the server's ``worker_cls`` (the real ``WeightSyncWorker``), in the
    server process, on the CPU."""

    def __init__(self, worker_cls, model, **kwargs):
        import torch

        self.worker = worker_cls()
        self.worker.device = torch.device("cpu")
        self.worker.model_runner = SimpleNamespace(model=ServedModel(model))
        self.llm_engine = SimpleNamespace(
            parallel_config=SimpleNamespace(tensor_parallel_size=1), reset_prefix_cache=lambda: True
        )
        _SERVER.llm = self

    def collective_rpc(self, method, args=()):
        return [getattr(self.worker, method)(*args)]


class CountRequests:
    """ASGI middleware: counts the HTTP requests by path."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            with _SERVER.lock:
                _SERVER.requests[scope["path"]] = _SERVER.requests.get(scope["path"], 0) + 1
        await self.app(scope, receive, send)


def _fastapi_app(*args, **kwargs):
    """``trl vllm-serve``'s FastAPI app, plus the request counter and the benchmark's own routes."""
    from fastapi import FastAPI

    app = FastAPI(*args, **kwargs)
    app.add_middleware(CountRequests)

    def model():
        return _SERVER.llm.worker.model_runner.model

    @app.get("/bench/stats/")
    def stats():
        with _SERVER.lock:
            return {
                "requests": dict(_SERVER.requests),
                "load_calls": model().load_calls,
                "tensors_loaded": model().tensors_loaded,
            }

    @app.post("/bench/zero/")
    def zero():
        model().zero()
        return {}

    @app.get("/bench/digests/")
    def digests():
        return {name: _digest(tensor) for name, tensor in model().state.items()}

    return app


def _serve(model_dir, port, log_path):
    """The server process: the real ``trl vllm-serve`` main with vLLM's pieces stood in (runs until killed)."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)  # uvicorn's access log: one line per request, as a real server writes it
    os.dup2(log, 2)
    import torch

    torch.set_num_threads(1)
    import trl.scripts.vllm_serve as vllm_serve

    patches = {
        **VLLM_STAND_INS,
        "LLM": StandInLLM,
        "require_vllm": lambda *args, **kwargs: None,
        "get_world_group": lambda: SimpleNamespace(rank=0),
        "FastAPI": _fastapi_app,
    }
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch.object(vllm_serve, name, value, create=True))
        vllm_serve.main(vllm_serve.ScriptArguments(model=model_dir, host=HOST, port=port))


def _get(port, path, timeout=600):
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as response:
        return json.load(response)


def _post(port, path, timeout=600):
    request = urllib.request.Request(f"http://{HOST}:{port}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def _wait_for_server(process, port):
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if not process.is_alive():
            raise RuntimeError(f"the server process exited (code {process.exitcode})")
        try:
            _get(port, "/health/", timeout=5)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"the server did not answer /health/ within {SERVER_START_TIMEOUT_S} s")


def _stop(process, timeout=15):
    if process.is_alive():
        process.terminate()
        process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join(timeout)


# ----------------------------------------------------------------------------------------------- trainer ranks


def _fsdp_accelerator():
    """An ``Accelerator`` running FSDP1 on CPU ranks, through the test harness's shim (see the module docstring)."""
    import importlib

    harness = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "harness")
    sys.path.insert(0, os.path.abspath(harness))
    import cpu_shims
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    os.environ["ACCELERATE_USE_FSDP"] = "true"
    cpu_shims._patch_state_module(importlib.import_module("accelerate.state"))
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=1,
        reshard_after_forward="FULL_SHARD",  # FSDP1's sharding strategy
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Qwen2DecoderLayer"],
        use_orig_params=True,
        sync_module_states=False,
        cpu_ram_efficient_loading=False,
    )
    return Accelerator(fsdp_plugin=plugin)


def _full_state_digests(model, is_main):
    """The trainer's full state dict (FSDP ``FULL_STATE_DICT``, rank 0 only), digested; ``None`` off rank 0."""
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # state_dict_type: deprecated, in favour of get_state_dict
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
            state_dict = model.state_dict()
    return {name: _digest(tensor) for name, tensor in state_dict.items()} if is_main else None


def _connect(server_port):
    """The real ``VLLMClient`` of rank 0, with vLLM's group and communicator stood in while it connects."""
    import trl.extras.vllm_client as vllm_client

    with contextlib.ExitStack() as stack:
        for name, value in VLLM_STAND_INS.items():
            stack.enter_context(mock.patch.object(vllm_client, name, value, create=True))
        client = vllm_client.VLLMClient(HOST, server_port, group_port=free_port(), connection_timeout=60)
    atexit.unregister(client.close_communicator)  # closed by the benchmark, while the server is still up
    return client


def _wait_for_loads(server_port, before, count):
    """Waits until the server has loaded ``count`` more tensors than ``before`` (its stats); returns its stats."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while True:
        stats = _get(server_port, "/bench/stats/")
        if stats["tensors_loaded"] - before["tensors_loaded"] >= count:
            return stats
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server loaded {stats['tensors_loaded'] - before['tensors_loaded']} of {count}")
        time.sleep(0.005)


def _sync_requests(before, after):
    """Requests per path between two stats of the server, the benchmark's own routes left out."""
    paths = set(before["requests"]) | set(after["requests"])
    counts = {p: after["requests"].get(p, 0) - before["requests"].get(p, 0) for p in sorted(paths)}
    return {p: n for p, n in counts.items() if n and not p.startswith("/bench/")}


def _bench(rank, server_port, options):
    import torch.distributed as dist

    from trl.extras.vllm_weight_sync import DEFAULT_SYNC_BUCKET_SIZE_MB
    from trl.trainer.grpo_trainer import GRPOTrainer

    is_main = rank == 0
    bucket_mb = options["bucket_mb"] if options["bucket_mb"] is not None else DEFAULT_SYNC_BUCKET_SIZE_MB
    accelerator = _fsdp_accelerator()
    model = build_qwen2(options)
    num_params = sum(p.numel() for p in model.parameters())
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    largest_param = max(p.numel() * p.element_size() for p in model.parameters())
    model = accelerator.prepare_model(model)
    expected = _full_state_digests(model, is_main)
    gc.collect()

    client = _connect(server_port) if is_main else None
    buckets = []  # tensors per bucket handed to the client during the current sync
    clients = {mode: client for mode in MODES}
    if client is not None:
        update_named_params = client.update_named_params

        def counted(params):
            buckets.append(len(params))
            return update_named_params(params)

        client.update_named_params = counted
        # the floor both modes share (gathers, GRPO's copies): a client that drops what it is given
        clients[FLOOR] = SimpleNamespace(update_named_params=lambda params: buckets.append(len(params)))
        clients[FLOOR].reset_prefix_cache = lambda: None
    trainer = SimpleNamespace(
        model=model,
        accelerator=accelerator,
        args=SimpleNamespace(vllm_sync_bucket_size_mb=bucket_mb, report_to=[]),
        vllm_client=None,
    )

    def sync(mode):
        """One sync of GRPO, on every rank together; rank 0 returns its measurements."""
        before = None
        trainer.vllm_client = clients.get(mode)
        if is_main:
            client._batched_updates = mode == "batched"  # False: 0.16.1's protocol, one request per tensor
            buckets.clear()
            before = _get(server_port, "/bench/stats/")
        gc.collect()
        dist.barrier()
        with peak_extra() as peak:
            start = time.perf_counter()
            GRPOTrainer._move_model_to_vllm(trainer)
            elapsed = time.perf_counter() - start
        result = {"peak_extra_bytes": peak.bytes}
        if is_main:
            after = _wait_for_loads(server_port, before, 0 if mode == FLOOR else sum(buckets))
            loaded = time.perf_counter() - start
            requests = _sync_requests(before, after)
            result |= {
                "time_s": elapsed,
                "loaded_s": None if mode == FLOOR else loaded,
                "requests": sum(requests.values()),
                "requests_by_path": requests,
                "buckets": len(buckets),
                "tensors_sent": sum(buckets),
                "load_calls": after["load_calls"] - before["load_calls"],
            }
        dist.barrier()
        return result

    try:
        # Check: one sync into zeroed server weights gives the trainer's full state dict, bit for bit
        for mode in MODES:
            if is_main:
                _post(server_port, "/bench/zero/")
            sync(mode)
            if is_main:
                received = _get(server_port, "/bench/digests/")
                if set(received) != set(expected):
                    missing, extra = sorted(set(expected) - set(received)), sorted(set(received) - set(expected))
                    raise AssertionError(f"{mode}: names differ, missing {missing[:5]}, unexpected {extra[:5]}")
                wrong = [name for name in expected if received[name] != expected[name]]
                if wrong:
                    raise AssertionError(f"{mode}: {len(wrong)} weights differ on the server: {wrong[:5]}")
                print(f"[check] {mode}: the server holds the trainer's {len(expected)} weights exactly", flush=True)

        timed = (*MODES, FLOOR)
        runs = {mode: [] for mode in timed}
        for _ in range(options["reps"]):
            for mode in timed:
                runs[mode].append(sync(mode))
        peaks = [None] * dist.get_world_size()  # every rank's peak extra per mode and repetition
        dist.all_gather_object(peaks, {m: [r["peak_extra_bytes"] for r in runs[m]] for m in timed})
        if not is_main:
            return None
        rows = []
        for mode in timed:
            reps = runs[mode]
            last = reps[-1]
            rows.append(
                {
                    "mode": mode,
                    "num_params": num_params,
                    "model_bytes": model_bytes,
                    "largest_param_bytes": largest_param,
                    "layers": options["layers"],
                    "hidden": options["hidden"],
                    "intermediate": options["intermediate"],
                    "vocab": options["vocab"],
                    "bucket_mb": bucket_mb,
                    "reps": len(reps),
                    "time_s": statistics.median(r["time_s"] for r in reps),
                    "times_s": [r["time_s"] for r in reps],
                    "loaded_s": None if mode == FLOOR else statistics.median(r["loaded_s"] for r in reps),
                    "requests": statistics.median(r["requests"] for r in reps),
                    "requests_by_path": last["requests_by_path"],
                    "buckets": statistics.median(r["buckets"] for r in reps),
                    "tensors_sent": last["tensors_sent"],
                    "load_calls": last["load_calls"],
                    "peak_extra_bytes": int(statistics.median(r["peak_extra_bytes"] for r in reps)),
                    "peak_extra_max_bytes": max(r["peak_extra_bytes"] for r in reps),
                    "peak_extra_by_rank_bytes": [p[mode] for p in peaks],
                }
            )
        return rows
    finally:
        if client is not None:
            with contextlib.suppress(Exception):  # (the server may be gone: keep the error that got us here)
                client.close_communicator()


def _rank(rank, world_size, port, server_port, options, result_path):
    set_rank_env(rank, world_size, port)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    try:
        rows = _bench(rank, server_port, options)
        if rows is not None:
            with open(result_path, "w") as f:
                json.dump(rows, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    mmap_large_blocks()  # before any process starts: glibc reads it once
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import multiprocessing

    import torch.multiprocessing as mp

    options = vars(args)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        qwen2_config(options).save_pretrained(model_dir)  # the server reads the config there, as vLLM would
        server_port = free_port()
        log_path = os.path.join(tmp, "server.log")
        server = multiprocessing.get_context("spawn").Process(
            target=_serve, args=(model_dir, server_port, log_path), daemon=True
        )
        server.start()
        ranks = None
        try:
            _wait_for_server(server, server_port)
            result_path = os.path.join(tmp, "rows.json")
            rank_args = (2, free_port(), server_port, options, result_path)
            ranks = mp.start_processes(_rank, args=rank_args, nprocs=2, join=False, start_method="spawn")
            deadline = start + args.timeout
            while not ranks.join(timeout=5):
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"the benchmark did not finish within {args.timeout} s")
                if not server.is_alive():
                    raise RuntimeError(f"the server process exited (code {server.exitcode})")
            with open(result_path) as f:
                rows = json.load(f)
        except BaseException:
            with open(log_path, errors="replace") as f:
                print("server log (last 40 lines):\n" + "".join(f.readlines()[-40:]), file=sys.stderr)
            raise
        finally:
            if ranks is not None:
                for process in ranks.processes:
                    if process.is_alive():
                        process.kill()
                    process.join(15)
            _stop(server)
    print(f"[run: {time.perf_counter() - start:.0f}s]", file=sys.stderr)
    print_rows(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def print_rows(rows):
    by_mode = {r["mode"]: r for r in rows}
    per_tensor, batched, floor = by_mode["per-tensor"], by_mode["batched"], by_mode[FLOOR]
    print(
        "| model params | mode | time s | x per-tensor | requests | buckets | peak extra MiB | bucket MiB | tensors "
        "| server loaded s |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        loaded = "-" if r["loaded_s"] is None else f"{r['loaded_s']:.2f}"
        print(
            f"| {r['num_params'] / 1e6:.1f}M | {r['mode']} | {r['time_s']:.2f} | {r['time_s'] / per_tensor['time_s']:.2f} "
            f"| {r['requests']:g} | {r['buckets']:g} | {r['peak_extra_bytes'] / MIB:.1f} | {r['bucket_mb']:g} "
            f"| {r['tensors_sent']} | {loaded} |"
        )

    def target(ok, text):
        print(f"- {'met' if ok else 'NOT met'}: {text}")

    print()
    target(
        batched["requests"] <= batched["buckets"] + 2,
        f"batched requests <= buckets + 2 ({batched['requests']:g} <= {batched['buckets'] + 2:g}; per-tensor: "
        f"{per_tensor['requests']:g})",
    )
    ratio = batched["time_s"] / per_tensor["time_s"]
    target(ratio <= 0.5, f"batched time <= 0.5 x per-tensor ({batched['time_s']:.2f} s = {ratio:.2f} x)")
    sending = [r["time_s"] - floor["time_s"] for r in (per_tensor, batched)]
    print(
        f"  (without the gathers and copies both modes share, the {FLOOR} row: per-tensor sends in {sending[0]:.2f} s, "
        f"batched in {sending[1]:.2f} s = {sending[1] / sending[0]:.2f} x)"
    )
    for r in (per_tensor, batched):
        bound = 1.1 * r["bucket_mb"]
        peak = r["peak_extra_bytes"] / MIB
        target(
            peak <= bound,
            f"{r['mode']} peak extra <= bucket + 10 % ({peak:.1f} <= {bound:.1f} MiB; largest parameter "
            f"{r['largest_param_bytes'] / MIB:.1f} MiB)",
        )


if __name__ == "__main__":
    main()
