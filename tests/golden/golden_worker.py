"""One golden-equivalence run: build one trainer on the tiny fixtures, train a few steps, record what it did.

Launched by ``tests/golden/test_golden.py`` once per (trainer, mode, tree): ``mode`` ``single`` is one plain
``python`` process, ``ddp`` is ``accelerate launch --num_processes 2`` (gloo). The tree (pristine TRL 0.16.1 or
the fork) is chosen by ``PYTHONPATH``; nothing here knows which one it runs on, and no fork option is set.

Rank 0 writes ``<out>/result.json``:

- ``trl``: the file, version and ``FIXED_ISSUES`` of the imported ``trl`` (the test checks it ran the right tree);
- ``logs``: every ``log_history`` entry (Python floats round-trip exactly through JSON);
- ``weights``: ``sha256`` over every tensor of the trained model's state dict (name, dtype, shape, bytes) and
  the same per tensor; the tensors themselves go to ``<out>/weights.pt`` so a difference can be measured.

A failure writes ``result.json`` with ``error`` (the traceback) and exits non-zero.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import traceback
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> import harness

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


def weight_checksums(model):
    """sha256 of the whole state dict and of each tensor (name, dtype, shape and bytes), plus the tensors."""
    import torch

    total = hashlib.sha256()
    per_tensor, tensors = {}, {}
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        raw = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header = f"{name}|{t.dtype}|{tuple(t.shape)}|".encode()
        per_tensor[name] = hashlib.sha256(header + raw).hexdigest()
        total.update(header + raw)
        tensors[name] = t.clone()
    return {"sha256": total.hexdigest(), "tensors": per_tensor}, tensors


def saved_files(folder):
    """{file: {"sha256": ..., "tensors": {name: "dtype shape"}}} of every ``*.safetensors`` in ``folder``."""
    from safetensors import safe_open

    files = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            tensors = {name: f"{f.get_slice(name).get_dtype()} {f.get_slice(name).get_shape()}" for name in f.keys()}
        files[path.name] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "tensors": tensors}
    return files


def _jsonable(log_history):
    return [
        {k: v if not isinstance(v, float) or math.isfinite(v) else repr(v) for k, v in e.items()} for e in log_history
    ]


def _trl_info():
    import trl

    try:
        from trl import _fork_info

        fixed = sorted(_fork_info.FIXED_ISSUES)
    except ImportError:
        fixed = None
    return {"file": trl.__file__, "version": trl.__version__, "fixed_issues": fixed}


def main(argv=None, *, build=build_trainer, trainers=TRAINERS):
    """``build(kind, manifest, out_dir, steps)`` makes the trainer; another line's worker passes its own."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainer", choices=trainers, required=True)
    parser.add_argument("--fixtures", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    a = parser.parse_args(argv)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    result = {"trainer": a.trainer, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "steps": a.steps}
    try:
        import torch
        from harness.fixtures import load_manifest

        result["trl"] = _trl_info()
        trainer = build(a.trainer, load_manifest(a.fixtures), out, a.steps)
        trainer.train()
        result["global_step"] = trainer.state.global_step
        result["logs"] = _jsonable(trainer.state.log_history)
        result["weights"], tensors = weight_checksums(trainer.accelerator.unwrap_model(trainer.model))
        if rank == 0:
            torch.save(tensors, out / "weights.pt")
        # The final save as the scripts do it (every rank), apart from training (0.16.1's PPO cannot save under DDP):
        # each weight file it writes, its sha256 and its tensors' names, dtypes and shapes (#40: the same files)
        try:
            trainer.save_model(str(out / "saved"))
        except Exception as exc:
            result["save_error"] = f"{type(exc).__name__}: {exc}"
        else:
            if rank == 0:
                result["saved"] = saved_files(out / "saved")
    except BaseException:
        result["error"] = traceback.format_exc()
        raise
    finally:
        if rank == 0:
            (out / "result.json").write_text(json.dumps(result, indent=1))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another one still uses it
        dist.destroy_process_group()
    # Everything is written. The interpreter's shutdown after a 2-process gloo run was seen to hang one rank (2 of 32
    # DDP launches in one CI run, on pristine 0.16.1 as on the fork, after training had finished): leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
