"""One worker for every matrix cell: ``--trainer`` x ``--backend`` (launched by ``tests/harness/launcher.py``).

Builds the trainer on the tiny fixtures, records per-rank facts, trains ``--steps`` optimizer steps and
writes ``<out>/rank<R>.json`` (rewritten at each stage, so a failure still leaves the facts gathered so far):

- ``accelerator``: distributed type, device, world size of the trainer's accelerator;
- ``frozen``: for each frozen model (reference, reward) what this rank holds (``harness.facts``), right
  after ``__init__``;
- ``policy``: the trained model's wrapper chain when training begins (DDP, FSDP, DeepSpeedEngine, DataParallel);
- ``prompts``: the prompt token ids this rank passed to ``generate`` (padding stripped);
- ``generate``: what the generating model held on this rank during its first ``generate`` call;
- ``global_step`` and ``log_history`` (losses) after training.
"""

import argparse
import json
import math
import os
import sys
import traceback
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))  # import harness

TRAINERS = ("grpo", "online_dpo_judge", "online_dpo_rm", "rloo", "ppo")


class Recorder:
    def __init__(self, out_dir, **base):
        self.rank = int(os.environ.get("RANK", "0"))
        self.path = Path(out_dir) / f"rank{self.rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.data = dict(base, rank=self.rank, world_size=int(os.environ.get("WORLD_SIZE", "1")), stage="start")
        self.data.update(prompts=[], generate=None)
        self.trainer = None

    def flush(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def _install_generate_recorder(rec):
    """Record the prompts each rank generates from, and what the model holds while it generates."""
    from harness.facts import describe_model
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate

    def generate(self, *args, **kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        if input_ids is not None:
            for i, row in enumerate(input_ids.tolist()):
                keep = mask[i].tolist() if mask is not None else [1] * len(row)
                rec.data["prompts"].append([t for t, m in zip(row, keep) if m])
        if rec.data["generate"] is None:
            rec.data["generate"] = describe_model(self)
        return original(self, *args, **kwargs)

    GenerationMixin.generate = generate


def _trl_info():
    import trl

    try:
        from trl import _fork_info

        fixed = sorted(_fork_info.FIXED_ISSUES)
    except ImportError:
        fixed = []
    return {"file": trl.__file__, "version": trl.__version__, "fixed_issues": fixed}


def _jsonable_logs(log_history):
    out = []
    for entry in log_history:
        out.append({k: (v if not isinstance(v, float) or math.isfinite(v) else repr(v)) for k, v in entry.items()})
    return out


def build_trainer(kind, backend, manifest, out_dir, steps, rec):
    from datasets import load_dataset
    from harness import fixtures
    from harness.dataparallel import force_data_parallel
    from harness.fixtures import on_policy_kwargs, training_kwargs
    from harness.facts import describe_model, wrapper_chain
    from transformers import AutoTokenizer, TrainerCallback

    world = int(os.environ.get("WORLD_SIZE", "1"))
    n_devices = 2 if backend == "dataparallel" else world
    tokenizer = AutoTokenizer.from_pretrained(manifest["policy"])
    prompts = load_dataset(manifest["prompt_only"])
    common = training_kwargs(
        out_dir,
        # as users do: match the launcher's mixed precision ("no" on CPU; the GPU configs say bf16)
        bf16=os.environ.get("ACCELERATE_MIXED_PRECISION", "no") == "bf16",
        fp16=os.environ.get("ACCELERATE_MIXED_PRECISION", "no") == "fp16",
    )

    class Facts(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            trainer = rec.trainer
            model = getattr(trainer, "model_wrapped", None) or trainer.model
            rec.data["policy"] = {"wrappers": wrapper_chain(model), "n_gpu": args.n_gpu}
            rec.data["stage"] = "training"
            rec.flush()

    def load_policy():
        return fixtures.load_policy(manifest)

    def load_reward():
        return fixtures.load_reward(manifest)

    def finalize(args):
        if backend == "dataparallel":
            force_data_parallel(args, 2)
        return args

    if kind == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        args = finalize(
            GRPOConfig(
                **common,
                max_steps=steps,
                beta=0.04,
                num_generations=2,
                max_prompt_length=32,
                max_completion_length=8,
                temperature=1.0,
            )
        )

        def length_reward(completions, prompts=None, **kwargs):
            return [float(len(c)) / 10.0 for c in completions]

        trainer = GRPOTrainer(
            model=load_policy(),
            reward_funcs=[load_reward(), length_reward],
            args=args,
            train_dataset=prompts["train"],
            processing_class=tokenizer,
            callbacks=[Facts()],
        )
        frozen = {"ref_model": trainer.ref_model, "reward_model": trainer.reward_funcs[0]}
    elif kind in ("online_dpo_judge", "online_dpo_rm"):
        from trl import OnlineDPOConfig, OnlineDPOTrainer
        from trl.trainer.judges import BasePairwiseJudge

        class LongerIsBetterJudge(BasePairwiseJudge):
            """Local judge: prefers the longer completion (no API, deterministic)."""

            def judge(self, prompts, completions, shuffle_order=True):
                return [0 if len(a) >= len(b) else 1 for a, b in completions]

        args = finalize(OnlineDPOConfig(**common, max_steps=steps, max_new_tokens=8, max_length=64, beta=0.1))
        extra = (
            {"judge": LongerIsBetterJudge()}
            if kind == "online_dpo_judge"
            else {"reward_model": load_reward(), "reward_processing_class": tokenizer}
        )
        # TRL 0.16.1 refuses create_reference_model() under ZeRO-3 (patch 0034 loads the checkpoint again instead);
        # the cell passes its own reference model so that base and fork build the same trainer
        if backend == "zero3":
            extra["ref_model"] = load_policy()
        trainer = OnlineDPOTrainer(
            model=load_policy(),
            args=args,
            train_dataset=prompts["train"],
            processing_class=tokenizer,
            callbacks=[Facts()],
            **extra,
        )
        frozen = {"ref_model": trainer.ref_model}
        if trainer.reward_model is not None:
            frozen["reward_model"] = trainer.reward_model
    elif kind in ("rloo", "ppo"):
        from trl import PPOConfig, PPOTrainer, RLOOConfig, RLOOTrainer

        def tokenize(batch):
            return {"input_ids": tokenizer(batch["prompt"])["input_ids"]}

        train = prompts["train"].map(tokenize, batched=True, remove_columns=["prompt"])
        evals = prompts["test"].map(tokenize, batched=True, remove_columns=["prompt"])
        on_policy = on_policy_kwargs(common, total_episodes=steps * common["per_device_train_batch_size"] * world)
        if kind == "rloo":
            args = finalize(RLOOConfig(**on_policy, rloo_k=2))
            trainer = RLOOTrainer(
                config=args,
                processing_class=tokenizer,
                policy=load_policy(),
                ref_policy=load_policy(),
                reward_model=load_reward(),
                train_dataset=train,
                eval_dataset=evals,
                callbacks=[Facts()],
            )
            frozen = {"ref_model": trainer.ref_policy, "reward_model": trainer.reward_model}
        else:
            args = finalize(PPOConfig(**on_policy))
            trainer = PPOTrainer(
                args=args,
                processing_class=tokenizer,
                model=load_policy(),
                ref_model=load_policy(),
                reward_model=load_reward(),
                value_model=load_reward(),
                train_dataset=train,
                eval_dataset=evals,
                callbacks=[Facts()],
            )
            frozen = {"ref_model": trainer.ref_model, "reward_model": trainer.reward_model}
    else:
        raise ValueError(f"unknown trainer {kind!r}")

    accelerator = trainer.accelerator
    rec.data["accelerator"] = {
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "device": str(accelerator.device),
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
        "n_devices": n_devices,
    }
    rec.data["full_numel"] = {"ref_model": manifest["policy_numel"], "reward_model": manifest["reward_numel"]}
    rec.data["frozen"] = {name: describe_model(m, accelerator.device) for name, m in frozen.items()}
    return trainer


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trainer", choices=TRAINERS, required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--fixtures", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=2)
    a = parser.parse_args(argv)

    rec = Recorder(a.out, trainer=a.trainer, backend=a.backend, steps=a.steps)
    try:
        from harness.fixtures import load_manifest

        manifest = load_manifest(a.fixtures)
        rec.data["trl"] = _trl_info()
        _install_generate_recorder(rec)
        rec.trainer = build_trainer(a.trainer, a.backend, manifest, a.out, a.steps, rec)
        rec.data["stage"] = "initialized"
        rec.flush()
        rec.trainer.train()
        rec.data["global_step"] = rec.trainer.state.global_step
        rec.data["log_history"] = _jsonable_logs(rec.trainer.state.log_history)
        rec.data["stage"] = "trained"
        rec.flush()
    except BaseException:
        rec.data["error"] = traceback.format_exc()
        rec.data["stage"] = f"{rec.data['stage']}-failed"
        rec.flush()
        raise
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another one still uses it
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
