#!/usr/bin/env python
# Copyright 2026 The TRL fork maintainers. Licensed under the Apache License, Version 2.0.
"""Online DPO on a prompt-only dataset, judged by a pairwise judge or scored by a reward model.

    accelerate launch --config_file examples/accelerate_configs/deepspeed_zero3.yaml examples/scripts/online_dpo.py \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --reward_model_path <reward model> \
        --dataset_name trl-lib/ultrafeedback-prompt --output_dir online-dpo --log_level info

Give exactly one of ``--reward_model_path`` and ``--judge`` (fields of ``OnlineDPOConfig``): ``pair_rm``, ``hf``,
``openai``, or ``module:Class`` of your own ``BasePairwiseJudge``, importable from the working directory or
``PYTHONPATH``. The recipes in
``examples/recipes/`` call this script; see README "Run it on GPUs".
"""

import importlib
import os
import sys

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from trl import (
    HfPairwiseJudge,
    ModelConfig,
    OnlineDPOConfig,
    OnlineDPOTrainer,
    OpenAIPairwiseJudge,
    PairRMJudge,
    ScriptArguments,
    TrlParser,
    get_peft_config,
)
from trl.scripts.utils import init_trl_logging


JUDGES = {"pair_rm": PairRMJudge, "hf": HfPairwiseJudge, "openai": OpenAIPairwiseJudge}


def make_judge(spec):
    if spec in JUDGES:
        return JUDGES[spec]()
    module, _, name = spec.partition(":")
    if os.getcwd() not in sys.path:  # `accelerate launch` puts this script's directory first, not the working one
        sys.path.append(os.getcwd())
    if not name:
        raise SystemExit(f"error: --judge {spec!r}: expected one of {sorted(JUDGES)} or module:Class")
    return getattr(importlib.import_module(module), name)()


def main(script_args, training_args, model_args):
    init_trl_logging(training_args)
    if (training_args.reward_model_path is None) == (training_args.judge is None):
        raise SystemExit("error: give exactly one of --reward_model_path and --judge")
    kwargs = dict(trust_remote_code=model_args.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left", **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if training_args.judge is not None:
        extra = {"judge": make_judge(training_args.judge)}
    else:
        path = training_args.reward_model_path
        extra = {
            "reward_model": AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **kwargs),
            "reward_processing_class": AutoTokenizer.from_pretrained(path, truncation=True, **kwargs),
        }
    # No reference model: the trainer copies the policy, or under ZeRO-3 loads it again from its checkpoint (#25)
    peft_config = get_peft_config(model_args)
    dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    trainer = OnlineDPOTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        processing_class=tokenizer,
        peft_config=peft_config,
        **extra,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.wait_for_everyone()  # the main process may still be saving
    trainer.accelerator.end_training()  # then every process leaves the process group


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, OnlineDPOConfig, ModelConfig))
    main(*parser.parse_args_and_config())
