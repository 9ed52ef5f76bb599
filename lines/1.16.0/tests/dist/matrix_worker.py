"""One launch per backend for the 1.16.0 line's matrix: every trainer in turn, 2 optimizer steps each.

Launched by ``matrix116.py`` next to this file (``accelerate launch --num_processes 2``, CPU ranks over gloo, with the
harness shims of ``tests/harness/accelerate110.py``).  Trainers (``TRAINERS``): GRPO (reward model + reward function,
``beta > 0``), RLOO (reward model, ``beta > 0``), Online DPO (``trl.experimental.online_dpo``, reward model), GKD
(``trl.experimental.gkd``, teacher), DPO and KTO (reference model) and GRPO with a LoRA adapter (reward model; its
reference is the policy with the adapter disabled).

Each trainer runs in a ``try``: a failure records its first error line and the next trainer starts.  Between two
trainers the accelerator state is reset (``AcceleratorState._reset_state``, private accelerate API, test-only; the
process group is kept).  Per trainer and rank it writes ``<out>/<trainer>/rank<R>.json`` (rewritten at each stage,
so a crash or a hang leaves what was gathered so far):

- ``stage``: ``start`` -> ``initialized`` -> ``training`` -> ``trained`` (``...-failed`` with ``error`` and
  ``error_line`` on an exception);
- ``accelerator``: distributed type, device, number of processes; ``policy``: the trained model's wrappers when
  training begins (and, with LoRA, how many parameters are trainable);
- ``frozen``: for each frozen model (``ref_model``, ``reward_model``, ``teacher_model``) what this rank holds
  (``harness.facts.describe_model``: devices, local parameter count, train mode, requires_grad);
- ``prompts``: the token ids this rank generated from (generating trainers) or trained on (DPO, KTO), padding removed;
- ``global_step`` and ``log_history`` after training.
"""

import argparse
import gc
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO_ROOT / "tests"))  # import harness

TRAINERS = ("grpo", "rloo", "online_dpo", "gkd", "dpo", "kto", "grpo_lora")
FROZEN_NAMES = ("ref_model", "reward_model", "teacher_model")
COLLECTIVE_TIMEOUT_S = 90  # gloo collectives give up after this: a rank left alone in one fails instead of hanging


class Recorder:
    def __init__(self, out_dir, trainer, **base):
        self.rank = int(os.environ.get("RANK", "0"))
        self.path = Path(out_dir) / trainer / f"rank{self.rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.data = dict(base, trainer=trainer, rank=self.rank, world_size=int(os.environ.get("WORLD_SIZE", "1")))
        self.data.update(stage="start", started=time.time(), prompts=[], policy=None, error=None, error_line=None)
        self.flush()

    def flush(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


CURRENT = {"rec": None, "pad": None}  # the recorder of the trainer being run (read by the generate hook)


def _strip(rows, masks, pad):
    out = []
    for i, row in enumerate(rows):
        keep = masks[i] if masks is not None else [int(t != pad) for t in row]
        out.append([t for t, m in zip(row, keep) if m])
    return out


def _install_generate_recorder():
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate

    def generate(self, *args, **kwargs):
        rec = CURRENT["rec"]
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        if rec is not None and input_ids is not None:
            rows = input_ids.tolist()
            rec.data["prompts"] += _strip(rows, mask.tolist() if mask is not None else None, CURRENT["pad"])
        return original(self, *args, **kwargs)

    GenerationMixin.generate = generate


def _record_training_inputs(trainer, rec, pad):
    """DPO / KTO generate nothing: record the token ids of each batch they train on instead."""
    original = trainer.training_step

    def training_step(model, inputs, *args, **kwargs):
        for key in ("prompt_ids", "prompt_input_ids", "input_ids", "completion_input_ids"):
            value = inputs.get(key) if isinstance(inputs, dict) else None
            if value is not None and hasattr(value, "tolist"):
                rec.data["prompts"] += _strip(value.tolist(), None, pad)
                break
        return original(model, inputs, *args, **kwargs)

    trainer.training_step = training_step


def _trl_info():
    import trl

    try:
        from trl import _fork_info

        fixed = sorted(_fork_info.FIXED_ISSUES)
    except ImportError:
        fixed = []
    return {"file": trl.__file__, "version": trl.__version__, "fixed_issues": fixed}


def _jsonable_logs(log_history):
    return [
        {k: (v if not isinstance(v, float) or math.isfinite(v) else repr(v)) for k, v in entry.items()}
        for entry in log_history
    ]


def _first_error_line(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def build_trainer(kind, manifest, out_dir, steps, rec):
    import torch
    from datasets import load_dataset
    from harness import fixtures
    from harness.facts import describe_model, wrapper_chain
    from transformers import AutoTokenizer, TrainerCallback

    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = AutoTokenizer.from_pretrained(manifest["policy"])
    # TRL 1.x defaults to bf16=True; CPU ranks run in float32
    common = fixtures.training_kwargs(
        Path(out_dir) / kind, bf16=False, fp16=False, max_steps=steps, ddp_timeout=COLLECTIVE_TIMEOUT_S
    )

    class Facts(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            trainer = rec.trainer
            model = getattr(trainer, "model_wrapped", None) or trainer.model
            policy = {"wrappers": wrapper_chain(model), "n_gpu": args.n_gpu}
            # ZeRO-3 partitions parameters (numel() 0 outside a gather): count their full size (ds_numel)
            sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in trainer.model.parameters()]
            policy["numel"] = sum(n for n, _ in sizes)
            policy["trainable_numel"] = sum(n for n, trainable in sizes if trainable)
            policy["is_peft"] = hasattr(trainer.model, "peft_config")
            rec.data["policy"] = policy
            rec.data["stage"] = "training"
            rec.flush()

    def policy():
        return fixtures.load_policy(manifest)

    def reward():
        return fixtures.load_reward(manifest)

    def teacher():
        """The policy's architecture with other random weights: a teacher identical to the student gives a zero loss."""
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(1)  # the same teacher on every rank
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(manifest["policy"]))
        return model.eval()  # as from_pretrained returns it (GKD sets eval mode only in compute_loss)

    def length_reward(completions, **kwargs):
        return [float(len(c)) / 10.0 for c in completions]

    prompts = load_dataset(manifest["prompt_only"], split="train")
    preference = load_dataset(manifest["preference"], split="train")
    generation = dict(num_generations=2, max_completion_length=8, temperature=1.0, beta=0.04)

    if kind in ("grpo", "grpo_lora"):
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(**common, **generation)
        peft = {}
        if kind == "grpo_lora":
            from peft import LoraConfig

            peft["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        trainer = GRPOTrainer(
            model=policy(),
            reward_funcs=[reward(), length_reward],
            args=args,
            train_dataset=prompts,
            processing_class=tokenizer,
            reward_processing_classes=[tokenizer, None],
            callbacks=[Facts()],
            **peft,
        )
        frozen = {"ref_model": trainer.ref_model, "reward_model": trainer.reward_funcs[0]}
    elif kind == "rloo":
        from trl import RLOOConfig, RLOOTrainer

        args = RLOOConfig(**common, **generation)
        trainer = RLOOTrainer(
            model=policy(),
            reward_funcs=[reward(), length_reward],
            args=args,
            train_dataset=prompts,
            processing_class=tokenizer,
            reward_processing_classes=[tokenizer, None],
            callbacks=[Facts()],
        )
        frozen = {"ref_model": trainer.ref_model, "reward_model": trainer.reward_funcs[0]}
    elif kind == "online_dpo":
        from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

        args = OnlineDPOConfig(**common, max_new_tokens=8, max_length=64, beta=0.1)
        trainer = OnlineDPOTrainer(
            model=policy(),
            reward_funcs=[reward()],
            reward_processing_classes=[tokenizer],
            args=args,
            train_dataset=prompts,
            processing_class=tokenizer,
            callbacks=[Facts()],
        )
        frozen = {"ref_model": trainer.ref_model, "reward_model": trainer.reward_funcs[0]}
    elif kind == "gkd":
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        messages = preference.map(
            lambda row: {
                "messages": [
                    {"role": "user", "content": row["prompt"]},
                    {"role": "assistant", "content": row["chosen"]},
                ]
            },
            remove_columns=preference.column_names,
        )
        # lmbda=1: every step generates on-policy (so the teacher scores generated completions)
        args = GKDConfig(**common, max_new_tokens=8, max_length=64, lmbda=1.0, temperature=1.0)
        trainer = GKDTrainer(
            model=policy(),
            teacher_model=teacher(),
            args=args,
            train_dataset=messages,
            processing_class=tokenizer,
            callbacks=[Facts()],
        )
        frozen = {"teacher_model": trainer.teacher_model}
    elif kind == "dpo":
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**common, max_length=64, beta=0.1)
        trainer = DPOTrainer(
            model=policy(),
            ref_model=policy(),
            args=args,
            train_dataset=preference,
            processing_class=tokenizer,
            callbacks=[Facts()],
        )
        frozen = {"ref_model": trainer.ref_model}
    elif kind == "kto":
        from trl import KTOConfig, KTOTrainer
        from trl.data_utils import unpair_preference_dataset

        args = KTOConfig(**common, max_length=64, beta=0.1)
        trainer = KTOTrainer(
            model=policy(),
            ref_model=policy(),
            args=args,
            train_dataset=unpair_preference_dataset(preference),
            processing_class=tokenizer,
            callbacks=[Facts()],
        )
        frozen = {"ref_model": trainer.ref_model}
    else:
        raise ValueError(f"unknown trainer {kind!r}")

    if kind in ("dpo", "kto"):
        _record_training_inputs(trainer, rec, tokenizer.pad_token_id)
    accelerator = trainer.accelerator
    rec.data["accelerator"] = {
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "device": str(accelerator.device),
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
    }
    full = {"ref_model": manifest["policy_numel"], "teacher_model": manifest["policy_numel"]}
    full["reward_model"] = manifest["reward_numel"]
    rec.data["full_numel"] = full
    rec.data["frozen"] = {
        name: describe_model(model, accelerator.device) for name, model in frozen.items() if model is not None
    }
    rec.data["frozen_absent"] = sorted(name for name, model in frozen.items() if model is None)
    world_ok = accelerator.num_processes == world
    rec.data["world_matches"] = world_ok
    return trainer


def run_one(kind, manifest, out_dir, steps):
    import torch
    from harness.accelerate110 import reset_accelerate_state

    rec = Recorder(out_dir, kind, backend=os.environ.get("TRL_MATRIX_BACKEND", "?"), steps=steps)
    rec.data["trl"] = _trl_info()
    CURRENT["rec"] = rec
    rec.trainer = None
    try:
        reset_accelerate_state()
        torch.manual_seed(0)
        from transformers import AutoTokenizer

        CURRENT["pad"] = AutoTokenizer.from_pretrained(manifest["policy"]).pad_token_id
        rec.trainer = build_trainer(kind, manifest, out_dir, steps, rec)
        rec.data["stage"] = "initialized"
        rec.flush()
        rec.trainer.train()
        rec.data["global_step"] = rec.trainer.state.global_step
        rec.data["log_history"] = _jsonable_logs(rec.trainer.state.log_history)
        rec.data["stage"] = "trained"
    except Exception as exc:
        rec.data["error"] = traceback.format_exc()
        rec.data["error_line"] = _first_error_line(exc)
        rec.data["stage"] = f"{rec.data['stage']}-failed"
    finally:
        rec.data["seconds"] = round(time.time() - rec.data["started"], 1)
        rec.flush()
        CURRENT["rec"] = None
        rec.trainer = None
        gc.collect()
    _barrier(rec)


def _barrier(rec):
    """Both ranks finish a trainer before the next one starts (a rank whose trainer failed early waits here)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        except Exception as exc:  # the group is broken (a peer gave up in a collective): say so, carry on
            rec.data["barrier_error"] = _first_error_line(exc)
            rec.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fixtures", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--trainers", default=",".join(TRAINERS))
    a = parser.parse_args(argv)

    from harness.fixtures import load_manifest

    manifest = load_manifest(a.fixtures)
    _install_generate_recorder()
    for kind in a.trainers.split(","):
        run_one(kind, manifest, a.out, a.steps)

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
