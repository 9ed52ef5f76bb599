#!/usr/bin/env python
# Copyright 2026 The TRL fork maintainers. Licensed under the Apache License, Version 2.0.
"""RLOO, PPO or GKD with frozen models (reference, reward, value, teacher) that the backend shards.

TRL 0.16.1: RLOO, PPO and GKD. TRL 1.16.0: GKD (``trl.experimental.gkd``) only; its RLOO is another trainer, run
through the script behind ``trl rloo`` (``trl.scripts.rloo``), and it has no PPO.

    accelerate launch --config_file examples/accelerate_configs/fsdp2.yaml examples/scripts/rl_sharded.py \
        --trainer rloo --model_name_or_path <SFT model> --reward_model_name_or_path <reward model> \
        --dataset_name <prompt-only dataset> --output_dir rloo --log_level info

- ``--trainer rloo``: policy + reference policy (a copy of the model) + reward model; prompt-only dataset.
- ``--trainer ppo``: the same plus a value model (``--value_model_name_or_path``, default: the reward model).
- ``--trainer gkd``: student + ``--teacher_model_name_or_path``; a dataset with a ``messages`` column.

The training arguments are those of RLOOConfig, PPOConfig or GKDConfig (``--total_episodes``, ``--rloo_k``,
``--lmbda``, ...). With ``--log_level info`` the main process logs where each frozen model lives. The recipe
``examples/recipes/sharded_frozen_models.sh`` calls this script; see README "Run it on GPUs".
"""

import sys
from dataclasses import dataclass, field
from typing import Optional

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

import trl
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config
from trl.data_utils import is_conversational
from trl.scripts.utils import init_trl_logging


if trl.__version__.startswith("0."):  # the 0.16.1 line
    from trl import GKDConfig, GKDTrainer, PPOConfig, PPOTrainer, RLOOConfig, RLOOTrainer

    CONFIGS = {"rloo": RLOOConfig, "ppo": PPOConfig, "gkd": GKDConfig}
    ELSEWHERE = {}
else:  # the 1.16.0 line
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    CONFIGS = {"gkd": GKDConfig}
    ELSEWHERE = {"rloo": "its RLOO runs through `trl rloo` (trl.scripts.rloo)", "ppo": "it has no PPO trainer"}


@dataclass
class RLScriptArguments(ScriptArguments):
    trainer: str = field(
        default="rloo", metadata={"help": "rloo, ppo or gkd (TRL 1.16.0: gkd).", "choices": sorted(CONFIGS)}
    )
    reward_model_name_or_path: Optional[str] = field(default=None, metadata={"help": "RLOO / PPO reward model."})
    value_model_name_or_path: Optional[str] = field(default=None, metadata={"help": "PPO value model."})


def tokenize_prompts(dataset, tokenizer):
    def tokenize(row):
        if is_conversational(row):
            text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        else:
            text = row["prompt"]
        return {"input_ids": tokenizer(text, add_special_tokens=False)["input_ids"]}

    return dataset.map(tokenize, remove_columns=dataset.column_names)


def main(script_args, training_args, model_args):
    init_trl_logging(training_args)
    kind = script_args.trainer
    # ModelConfig on 0.16.1, the training arguments on 1.16.0
    trust = bool(getattr(model_args, "trust_remote_code", None) or getattr(training_args, "trust_remote_code", None))
    kwargs = dict(trust_remote_code=trust)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left", **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    train = dataset[script_args.dataset_train_split]

    def causal_lm():
        return AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)

    if kind == "gkd":
        trainer = GKDTrainer(
            model=model_args.model_name_or_path,
            teacher_model=training_args.teacher_model_name_or_path,
            args=training_args,
            train_dataset=train,
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
        )
    else:
        if script_args.reward_model_name_or_path is None:
            raise SystemExit(f"error: --trainer {kind} needs --reward_model_name_or_path")

        def scorer(path):
            return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **kwargs)

        train = tokenize_prompts(train, tokenizer)
        split = script_args.dataset_test_split
        evals = tokenize_prompts(dataset[split], tokenizer) if split in dataset else train.select(range(8))
        common = dict(processing_class=tokenizer, train_dataset=train, eval_dataset=evals)
        reward_model = scorer(script_args.reward_model_name_or_path)
        if kind == "rloo":
            trainer = RLOOTrainer(
                config=training_args, policy=causal_lm(), ref_policy=causal_lm(), reward_model=reward_model, **common
            )
        else:
            value_path = script_args.value_model_name_or_path or script_args.reward_model_name_or_path
            trainer = PPOTrainer(
                args=training_args,
                model=causal_lm(),
                ref_model=causal_lm(),
                reward_model=reward_model,
                value_model=scorer(value_path),
                peft_config=get_peft_config(model_args),
                **common,
            )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.wait_for_everyone()  # the main process may still be saving
    trainer.accelerator.end_training()  # then every process leaves the process group


def make_parser(argv):
    # The training arguments depend on --trainer: read it first (default rloo)
    kind = "rloo"
    for i, arg in enumerate(argv):
        if arg == "--trainer" and i + 1 < len(argv):
            kind = argv[i + 1]
        elif arg.startswith("--trainer="):
            kind = arg.split("=", 1)[1]
    if kind in ELSEWHERE:
        raise SystemExit(f"error: --trainer {kind}: TRL {trl.__version__} runs only gkd here; {ELSEWHERE[kind]}")
    if kind not in CONFIGS:
        raise SystemExit(f"error: --trainer {kind!r}: expected one of {sorted(CONFIGS)}")
    return TrlParser((RLScriptArguments, CONFIGS[kind], ModelConfig))


if __name__ == "__main__":
    main(*make_parser(sys.argv[1:]).parse_args_and_config())
