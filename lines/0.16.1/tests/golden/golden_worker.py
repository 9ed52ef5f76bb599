"""One golden-equivalence run on the 0.16.1 line: build one of its trainers on the tiny fixtures; the shared worker
(``tests/harness/golden_worker.py``) trains a few steps and records what it did.

Launched by ``test_golden.py`` (``harness.golden``) once per (trainer, mode, tree): ``mode`` ``single`` is one plain
``python`` process, ``ddp`` is ``accelerate launch --num_processes 2`` (gloo). The tree (pristine TRL 0.16.1 or
the fork) is chosen by ``PYTHONPATH``; nothing here knows which one it runs on, and no fork option is set.
"""

import os
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))  # import harness

from harness import golden_worker  # noqa: E402


TRAINERS = ("grpo", "online_dpo_judge", "online_dpo_rm", "rloo", "ppo", "gkd", "dpo", "kto")
N_ROWS = 24  # training rows each run tokenizes (enough for 3 steps x 2 ranks x batch 2)


def build_trainer(kind, manifest, out_dir, steps):
    import datasets
    import torch
    from datasets import Dataset, load_dataset
    from harness.fixtures import load_policy, load_reward, on_policy_kwargs, training_kwargs
    from transformers import AutoTokenizer

    datasets.disable_caching()  # no cross-run (or cross-tree) map cache: every run tokenizes its data itself
    tokenizer = AutoTokenizer.from_pretrained(manifest["policy"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    common = training_kwargs(out_dir, max_steps=steps)
    prompts = load_dataset(manifest["prompt_only"], split="train").select(range(N_ROWS))
    preference = load_dataset(manifest["preference"], split="train").select(range(N_ROWS))

    if kind == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        def length_reward(completions, **kwargs):
            return [float(len(c)) / 10.0 for c in completions]

        args = GRPOConfig(
            **common, beta=0.04, num_generations=2, max_prompt_length=32, max_completion_length=8, temperature=1.0
        )
        return GRPOTrainer(
            model=load_policy(manifest),
            reward_funcs=[load_reward(manifest), length_reward],
            args=args,
            train_dataset=prompts,
            processing_class=tokenizer,
        )
    if kind in ("online_dpo_judge", "online_dpo_rm"):
        from trl import OnlineDPOConfig, OnlineDPOTrainer
        from trl.trainer.judges import BasePairwiseJudge

        class LongerIsBetterJudge(BasePairwiseJudge):
            """Deterministic local judge: prefers the longer completion."""

            def judge(self, prompts, completions, shuffle_order=True):
                return [0 if len(a) >= len(b) else 1 for a, b in completions]

        extra = (
            {"judge": LongerIsBetterJudge()}
            if kind == "online_dpo_judge"
            else {"reward_model": load_reward(manifest), "reward_processing_class": tokenizer}
        )
        args = OnlineDPOConfig(**common, max_new_tokens=8, max_length=64, beta=0.1)
        return OnlineDPOTrainer(
            model=load_policy(manifest), args=args, train_dataset=prompts, processing_class=tokenizer, **extra
        )
    if kind in ("rloo", "ppo"):
        from trl import PPOConfig, PPOTrainer, RLOOConfig, RLOOTrainer

        def tokenize(batch):
            return {"input_ids": tokenizer(batch["prompt"])["input_ids"]}

        train = prompts.map(tokenize, batched=True, remove_columns=["prompt"])
        evals = load_dataset(manifest["prompt_only"], split="test").map(
            tokenize, batched=True, remove_columns=["prompt"]
        )
        on_policy = on_policy_kwargs(common, total_episodes=steps * common["per_device_train_batch_size"] * world)
        del on_policy["max_steps"]  # the on-policy trainers count episodes
        if kind == "rloo":
            return RLOOTrainer(
                config=RLOOConfig(**on_policy, rloo_k=2),
                processing_class=tokenizer,
                policy=load_policy(manifest),
                ref_policy=load_policy(manifest),
                reward_model=load_reward(manifest),
                train_dataset=train,
                eval_dataset=evals,
            )
        return PPOTrainer(
            args=PPOConfig(**on_policy),
            processing_class=tokenizer,
            model=load_policy(manifest),
            ref_model=load_policy(manifest),
            reward_model=load_reward(manifest),
            value_model=load_reward(manifest),
            train_dataset=train,
            eval_dataset=evals,
        )
    if kind == "gkd":
        from transformers import AutoConfig, AutoModelForCausalLM

        from trl import GKDConfig, GKDTrainer

        torch.manual_seed(1234)  # a teacher that differs from the student, the same in every run
        teacher = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(manifest["policy"]))
        messages = [
            [{"role": "user", "content": p}, {"role": "assistant", "content": c.strip()}]
            for p, c in zip(preference["prompt"], preference["chosen"])
        ]
        args = GKDConfig(**common, max_new_tokens=8, max_length=64)
        return GKDTrainer(
            model=load_policy(manifest),
            teacher_model=teacher,
            args=args,
            train_dataset=Dataset.from_dict({"messages": messages}),
            processing_class=tokenizer,
        )
    if kind == "dpo":
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**common, max_length=64, max_prompt_length=32, beta=0.1)
        return DPOTrainer(model=load_policy(manifest), args=args, train_dataset=preference, processing_class=tokenizer)
    if kind == "kto":
        from trl import KTOConfig, KTOTrainer

        args = KTOConfig(**common, max_length=64, max_prompt_length=32, beta=0.1)
        return KTOTrainer(model=load_policy(manifest), args=args, train_dataset=preference, processing_class=tokenizer)
    raise ValueError(f"unknown trainer {kind!r}")


if __name__ == "__main__":
    golden_worker.main(build=build_trainer, trainers=TRAINERS)
