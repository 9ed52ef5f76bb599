"""Demo-only start-up hook of ``run_vllm_demo.py``: what each rank's vLLM engine scores after every weight sync.

Loaded into the ``trl grpo`` processes by the harness start-up hook (``TRL_HARNESS_PRELOAD``, see
``tests/harness/_site/sitecustomize.py``). It wraps ``VLLMGeneration.check_sync`` (the fork's sync check, patch 0025,
which the run turns on with ``--vllm_sync_check_tolerance``) and ``GRPOTrainer.__init__`` / ``train`` when their
modules are imported. After each check it has the rank's own engine score the check's probe text once more and
compares that with the checkpoint's log-probabilities (the model on disk, scored once in float32 on this rank): how far
the weights vLLM generates with have moved from the checkpoint. Next to the check's gap (vLLM against the policy),
that is what shows the sync landed: vLLM follows the policy, not the checkpoint. It prints one line per check and
writes ``$TRL_DEMO_REPORT_DIR/rank<R>.json`` for the demo's summary. Nothing here changes what the run does: the
extra scoring is local to the rank (colocate mode: one engine per process), makes no collective, leaves the process's
random state as it was (a seed of its own, the CPU state restored) and, when it fails, is reported, not raised; it
leaves the probe in the engine's prefix cache, as the check itself does. With ``TRL_DEMO_STALE_SYNC=1`` (the demo's
second run) it replaces ``VLLMGeneration.sync_weights`` by a no-op: a sync that silently moves nothing. Never used
outside the demo.
"""

import json
import os
import sys
from pathlib import Path

from trl_harness_hooks import after_import  # tests/harness/_site, on PYTHONPATH in demo processes


_TESTS = Path(__file__).resolve().parents[2] / "tests"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

RANK = int(os.environ.get("RANK", "0"))
record = {"rank": RANK, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "stage": "starting", "checks": []}
_trainer = []  # the GRPOTrainer of this process, once built
_checkpoint_logprobs = {}  # probe ids (tuple) -> the checkpoint's log-probabilities of them


def _report():
    directory = os.environ.get("TRL_DEMO_REPORT_DIR")
    if directory:  # written whole or not at all: the demo reads it after a rank may have been killed
        path = Path(directory) / f"rank{RANK}.json"
        path.with_suffix(".tmp").write_text(json.dumps(record, indent=1, default=str))
        os.replace(path.with_suffix(".tmp"), path)


def _probe(generation):
    from trl.generation.vllm_generation import SYNC_CHECK_PROBE

    tokenizer = getattr(generation.processing_class, "tokenizer", generation.processing_class)
    return tokenizer(SYNC_CHECK_PROBE)["input_ids"]


def _vllm_logprobs(generation, probe):
    from vllm import SamplingParams

    # the token sampled comes from the request's own generator (seed); the caller restores the CPU random state
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, seed=0)
    (output,) = generation.llm.generate([{"prompt_token_ids": probe}], params, use_tqdm=False)
    return [entry[token].logprob for entry, token in zip(output.prompt_logprobs[1:], probe[1:], strict=True)]


def _checkpoint(probe):
    """The checkpoint's log-probabilities of ``probe``: the model on disk (``TRL_DEMO_CHECKPOINT``), float32."""
    key = tuple(probe)
    if key not in _checkpoint_logprobs:
        import torch
        import transformers
        from safetensors.torch import load_file

        # Built from its class, not `from_pretrained`, which would partition it under ZeRO-3 (this copy is local)
        checkpoint = Path(os.environ["TRL_DEMO_CHECKPOINT"])
        config = transformers.AutoConfig.from_pretrained(checkpoint)
        model = getattr(transformers, config.architectures[0])(config).float().eval()
        model.load_state_dict(load_file(checkpoint / "model.safetensors"), strict=False)  # a tied head is not on disk
        model.tie_weights()
        with torch.no_grad():
            ids = torch.tensor([probe])
            logits = model(input_ids=ids).logits[0, :-1]
        _checkpoint_logprobs[key] = logits.log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0].tolist()
    return _checkpoint_logprobs[key]


def _patch_generation(module):
    cls = module.VLLMGeneration
    original = cls.check_sync

    def check_sync(self, model):
        try:
            gap = original(self, model)
        except Exception as exc:
            record["checks"].append({"step": _step(), "error": f"{type(exc).__name__}: {exc}"})
            _report()
            raise
        entry = {"step": _step(), "gap": gap, "tolerance": self.sync_check_tolerance}
        if self.mode == "colocate":
            import torch

            # Local to this rank: a failure is reported, never raised (the other rank would wait for this one). The
            # process's CPU random state, which the training draws from and vLLM's CPU engine uses, is restored after
            try:
                with torch.random.fork_rng(devices=[]):
                    probe = _probe(self)
                    scored, reference = _vllm_logprobs(self, probe), _checkpoint(probe)
                entry["from_checkpoint"] = sum(abs(a - b) for a, b in zip(scored, reference, strict=True)) / len(
                    scored
                )
            except Exception as exc:
                entry["from_checkpoint_error"] = f"{type(exc).__name__}: {exc}"
        record["checks"].append(entry)
        moved = f"{entry['from_checkpoint']:.2e}" if "from_checkpoint" in entry else "-"
        print(
            f"[demo] rank {RANK}: sync check at step {entry['step']}: vLLM vs the policy {gap:.2e} "
            f"(tolerance {self.sync_check_tolerance:g}); vLLM vs the checkpoint {moved}",
            flush=True,
        )
        _report()
        return gap

    cls.check_sync = check_sync
    if os.environ.get("TRL_DEMO_STALE_SYNC") == "1":  # the demo's second run: a sync that sends nothing

        def sync_weights(self):
            print(f"[demo] rank {RANK}: weight sync replaced by nothing (vLLM keeps the weights it has)", flush=True)

        cls.sync_weights = sync_weights


def _step():
    return _trainer[0].state.global_step if _trainer else None


def _patch_trainer(module):
    from harness.facts import describe_model

    cls = module.GRPOTrainer
    original_init, original_train = cls.__init__, cls.train

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        _trainer.append(self)
        acc = self.accelerator
        record["backend"] = str(acc.distributed_type).split(".")[-1]
        record["vllm_mode"] = self.args.vllm_mode
        record["stage"] = "built"
        _report()

    def train(self, *args, **kwargs):
        record["stage"] = "training"
        _report()
        result = original_train(self, *args, **kwargs)
        record["stage"] = "trained"
        record["global_step"] = self.state.global_step
        record["policy"] = describe_model(self.model_wrapped, self.accelerator.device)  # as trained: FSDP-wrapped
        logged = [e["vllm/sync_logprob_gap"] for e in self.state.log_history if "vllm/sync_logprob_gap" in e]
        record["logged_gaps"] = logged
        record["losses"] = [e["loss"] for e in self.state.log_history if "loss" in e]
        _report()
        return result

    cls.__init__, cls.train = __init__, train


after_import("trl.generation.vllm_generation", _patch_generation)
after_import("trl.trainer.grpo_trainer", _patch_trainer)
