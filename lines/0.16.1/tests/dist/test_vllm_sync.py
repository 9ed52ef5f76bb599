"""GRPO with ``use_vllm=True`` under FSDP1, FSDP2 and DeepSpeed ZeRO-3, with and without PEFT (issue #8).

vLLM cannot run here: a recording stand-in replaces ``VLLMClient`` in the launched workers (the harness runs
them on 2 CPU ranks over gloo with ``accelerate launch``, see ``tests/harness/README.md``).  The policy trains
with ``learning_rate=0.0``, so the weights vLLM must receive at each sync are the initial ones, merged with the
LoRA adapters under PEFT: the stand-in compares every tensor it gets, exactly, with that expected copy, by its
Hugging Face checkpoint name.  While each message is sent it also measures what the sync holds gathered on the
main process: under FSDP1 the unsharded units (there should be none) plus the ranges of flat parameters the sync
gathered and still holds, under ZeRO-3 the gathered partitioned parameters; under FSDP2 it counts the full
parameters the sync swaps in while it merges a PEFT layer (the rest is gathered into buffers of its own, bounded
by the bucket like the others).

This file is both the pytest module and the worker script the launches run (``__main__``).

    pytest lines/0.16.1/tests/dist/test_vllm_sync.py                      # the 6 cells
    pytest lines/0.16.1/tests/dist/test_vllm_sync.py -k "fsdp1 and not peft"

On the pristine base the FSDP1 and FSDP2 cells fail (flat-shard names / DTensor shards sent to vLLM; with PEFT
under FSDP1 the merge itself crashes on the flat shards) and so does ZeRO-3 with PEFT (the whole model gathered
at once); they carry strict ``known_broken(8)`` marks.
ZeRO-3 without PEFT already syncs correctly on the base (one parameter at a time) and is a plain test.
"""

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))  # import harness

from harness.launcher import launch
from harness.marks import CellFailure, fixed_issues, known_broken, marks_for


BACKENDS = ("fsdp1", "fsdp2", "zero3")
STEPS = 3  # weights are sent before generating, from the second step on: 2 syncs
BUCKET_MB = 0.04  # ZeRO-3/FSDP2 bucket for the tiny policy (~155 KB): about a quarter of the model
MEMORY_SLACK = 0.10

# Failure texts on the base (regex), each naming the problem the stand-in reports
WRONG_NAMES = r"received unexpected names: \[.*_fsdp_wrapped_module"
MISSING_NAMES = r"never received: \["
SHARDS_SENT = r"received a (DTensor|shard|wrongly shaped tensor)"
WHOLE_MODEL_GATHERED = r"held \d+ bytes gathered at once while sending, more than"
MERGE_ON_FLAT_SHARDS = r"_move_model_to_vllm.*merge_adapter.*RuntimeError: inconsistent tensor size"


# --------------------------------------------------------------------------------------------------- worker


class RecordingVLLMClient:
    """Stand-in for ``trl.extras.vllm_client.VLLMClient`` (main process only, as GRPO creates it)."""

    expected = None  # name -> tensor, set by the worker
    probe = None  # callable -> bytes gathered right now on this rank
    report = None  # dict flushed to JSON
    completion_ids = None

    def __init__(self, *args, **kwargs):
        self.current = []

    def update_named_param(self, name, weights):
        import torch

        report = type(self).report
        report["max_gathered_bytes"] = max(report["max_gathered_bytes"], type(self).probe())
        expected = type(self).expected.get(name)
        if type(weights) is not torch.Tensor:
            report["problems"].append(f"received a {type(weights).__name__} for {name}, not a full tensor")
        elif expected is not None and tuple(weights.shape) != tuple(expected.shape):
            report["problems"].append(
                f"received a wrongly shaped tensor for {name}: {tuple(weights.shape)}, expected {tuple(expected.shape)}"
            )
        elif expected is not None and not torch.equal(weights.detach().cpu(), expected):
            report["problems"].append(f"received wrong values for {name}")
        self.current.append(name)

    def update_named_params(self, params):  # one request per bucket (the fork's batched protocol)
        for name, weights in params:
            self.update_named_param(name, weights)

    def reset_prefix_cache(self):  # GRPO calls it at the end of every sync
        report = type(self).report
        expected = set(type(self).expected)
        names = self.current
        unexpected = sorted(set(names) - expected)
        if unexpected:
            report["problems"].append(f"received unexpected names: {unexpected[:6]}")
        missing = sorted(expected - set(names))
        if missing:
            report["problems"].append(f"never received: {missing[:6]}")
        if len(names) != len(set(names)):
            report["problems"].append("received a weight twice in one sync")
        report["messages_per_sync"].append(len(names))
        self.current = []
        _flush(report)

    def generate(self, prompts, n=1, max_tokens=16, **kwargs):
        return [type(self).completion_ids[:max_tokens] for _ in range(len(prompts) * n)]


def _flush(report):
    path = Path(report["path"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(path)


def _expected_weights(model):
    """The model's own state_dict (Hugging Face names), the second name of a tied weight left out."""
    weights, storages = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in storages:
            storages.add(tensor.data_ptr())
            weights[name] = tensor.detach().clone().cpu()
    return weights


def _track_flat_ranges():
    """A function that returns the bytes still allocated for the FSDP1 flat-parameter ranges the sync gathered."""
    import weakref

    from trl.extras import vllm_weight_sync

    ranges = []  # weak references to the gathered ranges (a range may outlive its memory: the sync frees storage)
    gather = getattr(vllm_weight_sync, "_gather_flat_range", None)
    if gather is not None:  # (absent on the pristine base)

        def recording_gather(*args, **kwargs):
            full = gather(*args, **kwargs)
            if full is not None:
                ranges.append(weakref.ref(full))
            return full

        vllm_weight_sync._gather_flat_range = recording_gather
    return lambda: sum(t.untyped_storage().nbytes() for t in (ref() for ref in ranges) if t is not None)


def _gathered_bytes_probe(backend, trainer, bound):
    """What the sync holds gathered on this rank right now (see the module docstring)."""
    flat_ranges = _track_flat_ranges() if backend == "fsdp1" else None

    def probe():
        model = trainer.model  # as prepared for training (wrapped/sharded in train(), not at init)
        if backend == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            handles = [m._handle for m in model.modules() if isinstance(m, FSDP) and m._handle is not None]
            # a unit is unsharded while its flat parameter is larger than this rank's shard
            unsharded = sum(
                h.flat_param.numel() * h.flat_param.element_size()
                for h in handles
                if h.flat_param.numel() != h.flat_param._sharded_size.numel()
            )
            # gloo's worker thread drops its reference to a collective's tensor shortly after the collective
            # returns: give it a moment before counting more than the bound
            deadline = time.monotonic() + 10
            while unsharded + flat_ranges() > bound and time.monotonic() < deadline:
                time.sleep(0.001)
            return unsharded + flat_ranges()
        if backend == "zero3":
            from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

            return sum(
                p.ds_numel * p.element_size()
                for p in model.parameters()
                if hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.AVAILABLE and not p.ds_persist
            )
        # fsdp2: the model's parameters stay sharded DTensors; the sync swaps full ones in for the PEFT layer it
        # merges (PEFT merges in place), and gathers the others into buffers of its own
        from torch.distributed.tensor import DTensor

        params = list(model.parameters())
        if not any(isinstance(p, DTensor) for p in params):
            return sum(p.numel() * p.element_size() for p in params)  # not sharded at all
        return sum(p.numel() * p.element_size() for p in params if not isinstance(p, DTensor))

    return probe


def _measure_while_copying(report):
    """The fork sends one bucket per request once the bucket is released (patch 0023), so the client sees nothing
    gathered: measure also while GRPO copies each streamed tensor into the bucket it sends (patch 0028's
    ``FlatBucket``), when the bucket is gathered. On the base, the client's per-tensor probe is the measurement."""
    import trl.extras.vllm_client as vllm_client

    flat_bucket = getattr(vllm_client, "FlatBucket", None)
    if flat_bucket is None:
        return
    append = flat_bucket.append
    report["measured_while_copying"] = 0

    def measuring_append(bucket, name, tensor):
        report["max_gathered_bytes"] = max(report["max_gathered_bytes"], RecordingVLLMClient.probe())
        report["measured_while_copying"] += 1
        return append(bucket, name, tensor)

    flat_bucket.append = measuring_append


def _memory_bound(backend, reference, bucket_bytes):
    """Bytes the sync may hold gathered at once: the bucket (or the largest parameter, sent alone)."""
    total = sum(p.numel() * p.element_size() for p in reference.parameters())
    largest = max(bucket_bytes, max(p.numel() * p.element_size() for p in reference.parameters()))
    return int(largest * (1 + MEMORY_SLACK)), total


def worker(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=BACKENDS, required=True)
    parser.add_argument("--fixtures", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--peft", action="store_true")
    a = parser.parse_args(argv)

    import torch
    from harness.fixtures import load_manifest, load_prompt_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import trl
    import trl.trainer.grpo_trainer as grpo_module

    rank = int(os.environ.get("RANK", "0"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        from trl import _fork_info

        fixed = sorted(_fork_info.FIXED_ISSUES)
    except ImportError:
        fixed = []
    report = {
        "path": str(out / f"rank{rank}.json"),
        "rank": rank,
        "stage": "start",
        "trl": {"file": trl.__file__, "fixed_issues": fixed},
        "problems": [],
        "messages_per_sync": [],
        "max_gathered_bytes": 0,
    }
    _flush(report)

    manifest = load_manifest(a.fixtures)
    tokenizer = AutoTokenizer.from_pretrained(manifest["policy"])
    # Built before the training arguments: under ZeRO-3 they would make from_pretrained partition the model
    model = AutoModelForCausalLM.from_pretrained(manifest["policy"])
    if a.peft:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(0)  # same adapters on every rank; non-zero, so that merging changes the weights
        # Biases of the adapted layers trained too (bias="lora_only"): without any trainable parameter in the
        # Trainer's no-weight-decay group, DeepSpeed drops that empty group and torch's LR scheduler then fails
        # on the group count (`zip() argument 2 is longer than argument 1`), sync or not.
        lora = LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "v_proj", "down_proj"],
            bias="lora_only",
            init_lora_weights=False,
        )
        model = get_peft_model(model, lora)
        reference = copy.deepcopy(model).merge_and_unload()
    else:
        reference = copy.deepcopy(model)
    expected = _expected_weights(reference)
    bucket_bytes = int(BUCKET_MB * 2**20)
    report["memory_bound"], report["model_bytes"] = _memory_bound(a.backend, reference, bucket_bytes)

    # The stand-in vLLM: GRPO checks that vLLM is importable (and, in fork builds, its version) at init
    grpo_module.is_vllm_available = lambda: True
    grpo_module.require_vllm = lambda *args, **kwargs: "0.8.0"
    grpo_module.VLLMClient = RecordingVLLMClient
    RecordingVLLMClient.expected = expected
    RecordingVLLMClient.report = report
    RecordingVLLMClient.completion_ids = tokenizer(" one two three four")["input_ids"] + [tokenizer.eos_token_id]

    from harness.fixtures import training_kwargs
    from trl import GRPOConfig, GRPOTrainer

    kwargs = training_kwargs(
        out,
        use_vllm=True,
        num_generations=2,
        max_prompt_length=32,
        max_completion_length=8,
        max_steps=STEPS,
        learning_rate=0.0,  # the weights vLLM must receive stay the initial ones
        beta=0.0,
        bf16=False,
    )
    if "vllm_sync_bucket_size_mb" in GRPOConfig.__dataclass_fields__:  # absent on the base
        kwargs["vllm_sync_bucket_size_mb"] = BUCKET_MB
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [float(len(c)) / 10.0 for c in completions],
        args=GRPOConfig(**kwargs),
        train_dataset=load_prompt_dataset(manifest),
        processing_class=tokenizer,
    )
    report["stage"] = "training"
    report["distributed_type"] = str(trainer.accelerator.distributed_type).split(".")[-1]
    _flush(report)
    RecordingVLLMClient.probe = _gathered_bytes_probe(a.backend, trainer, report["memory_bound"])
    _measure_while_copying(report)
    trainer.train()
    report["stage"] = "trained"
    report["global_step"] = trainer.state.global_step
    _flush(report)


# ---------------------------------------------------------------------------------------------------- tests

KNOWN_ON_BASE = {
    ("fsdp1", False): known_broken(
        8, match=f"{WRONG_NAMES}|{MISSING_NAMES}|{SHARDS_SENT}", why="FSDP1: flat-shard names sent to vLLM"
    ),
    ("fsdp1", True): known_broken(8, match=MERGE_ON_FLAT_SHARDS, why="FSDP1 + PEFT: adapters merged into flat shards"),
    ("fsdp2", False): known_broken(8, match=SHARDS_SENT, why="FSDP2: DTensor shards sent to vLLM"),
    ("fsdp2", True): known_broken(8, match=SHARDS_SENT, why="FSDP2: DTensor shards sent to vLLM"),
    ("zero3", True): known_broken(8, match=WHOLE_MODEL_GATHERED, why="ZeRO-3 + PEFT gathers the whole model"),
}
FAST = {("fsdp1", False)}


def _cases():
    for backend in BACKENDS:
        for peft in (False, True):
            marks = [pytest.mark.dist]
            if (backend, peft) not in FAST:
                marks.append(pytest.mark.slow)
            entry = KNOWN_ON_BASE.get((backend, peft))
            marks += marks_for([entry] if entry else [])
            yield pytest.param(backend, peft, marks=marks, id=f"grpo-vllm-{backend}-{'peft' if peft else 'full'}")


@pytest.mark.parametrize("backend,peft", list(_cases()))
def test_vllm_weight_sync(backend, peft, tiny_fixtures_dir, tmp_path):
    out = tmp_path / "out"
    args = ["--backend", backend, "--fixtures", str(tiny_fixtures_dir), "--out", str(out)]
    result = launch(Path(__file__), args + (["--peft"] if peft else []), backend=backend, workdir=tmp_path)
    ranks = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    problems = list(ranks[0]["problems"]) if ranks else []
    if not problems:
        result.check()
    if len(ranks) != 2:
        problems.append(f"expected 2 rank reports, got {len(ranks)}")
    if os.environ.get("TRL_HARNESS_FIXED_ISSUES") is None:
        for r in ranks:
            assert r["trl"]["fixed_issues"] == sorted(fixed_issues()), f"workers imported {r['trl']}: PYTHONPATH?"
    for r in ranks:
        if r.get("stage") != "trained" or r.get("global_step") != STEPS:
            problems.append(f"rank {r['rank']} stopped at stage {r.get('stage')!r}")
    main = ranks[0] if ranks else {}
    syncs = main.get("messages_per_sync", [])
    print(
        f"{backend} peft={peft}: messages per sync {syncs}; held at most {main.get('max_gathered_bytes')} bytes "
        f"gathered (bound {main.get('memory_bound')}, whole model {main.get('model_bytes')})"
    )
    if len(syncs) != STEPS - 1 or len(set(syncs)) != 1:
        problems.append(f"expected {STEPS - 1} syncs of equal size, got messages per sync {syncs}")
    copied = main.get("measured_while_copying")
    if copied == 0 or (copied and backend == "fsdp1" and not main["max_gathered_bytes"]):
        problems.append(f"the memory probe saw nothing while the sync copied {copied} tensors: it measures nothing")
    if main and main["max_gathered_bytes"] > main["memory_bound"]:
        problems.append(
            f"held {main['max_gathered_bytes']} bytes gathered at once while sending, more than the bound "
            f"{main['memory_bound']} (whole model: {main['model_bytes']})"
        )
    if problems:
        raise CellFailure(problems)


if __name__ == "__main__":
    worker()
