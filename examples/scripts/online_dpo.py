#!/usr/bin/env python
# Copyright 2026 The TRL fork maintainers. Licensed under the Apache License, Version 2.0.
"""Online DPO on a prompt-only dataset, scored by a reward model or (TRL 0.16.1) judged by a pairwise judge.

    accelerate launch --config_file examples/accelerate_configs/deepspeed_zero3.yaml examples/scripts/online_dpo.py \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --reward_model_path <reward model> \
        --dataset_name trl-lib/ultrafeedback-prompt --output_dir online-dpo --log_level info

Both lines of the fork: TRL 1.16.0 (``trl.experimental.online_dpo``) and 0.16.1. Give ``--reward_model_path``
(a field of ``OnlineDPOConfig``); on 0.16.1, give exactly one of it and ``--judge``: ``pair_rm``, ``hf``,
``openai``, or ``module:Class`` of your own ``BasePairwiseJudge``, importable from the working directory or
``PYTHONPATH`` (TRL 1.16.0 has no pairwise judges). The recipes in ``examples/recipes/`` call this script; see README
"Run it on GPUs".
"""

import importlib
import os
import sys

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

import trl
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config
from trl.scripts.utils import init_trl_logging


if trl.__version__.startswith("0."):  # the 0.16.1 line
    from trl import HfPairwiseJudge, OnlineDPOConfig, OnlineDPOTrainer, OpenAIPairwiseJudge, PairRMJudge

    JUDGES = {"pair_rm": PairRMJudge, "hf": HfPairwiseJudge, "openai": OpenAIPairwiseJudge}
else:  # the 1.16.0 line
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    JUDGES = None


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
    judge = training_args.judge if JUDGES is not None else None  # a field of the 0.16.1 line's OnlineDPOConfig
    if JUDGES is None and training_args.reward_model_path is None:
        raise SystemExit("error: give --reward_model_path (TRL 1.16.0's Online DPO has no pairwise judges)")
    if (training_args.reward_model_path is None) == (judge is None):
        raise SystemExit("error: give exactly one of --reward_model_path and --judge")
    # ModelConfig on 0.16.1, the training arguments on 1.16.0
    trust = bool(getattr(model_args, "trust_remote_code", None) or getattr(training_args, "trust_remote_code", None))
    kwargs = dict(trust_remote_code=trust)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left", **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if judge is not None:
        extra = {"judge": make_judge(judge)}
    else:
        path = training_args.reward_model_path
        reward_model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **kwargs)
        reward_tokenizer = AutoTokenizer.from_pretrained(path, truncation=True, **kwargs)
        if JUDGES is not None:  # 0.16.1: one reward model
            extra = {"reward_model": reward_model, "reward_processing_class": reward_tokenizer}
        else:  # 1.16.0: reward functions, a model among them
            extra = {"reward_funcs": [reward_model], "reward_processing_classes": [reward_tokenizer]}
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


def make_parser(argv=None):
    """The parser of this script's arguments (``argv``: unused, as ``rl_sharded.make_parser`` takes it)."""
    return TrlParser((ScriptArguments, OnlineDPOConfig, ModelConfig))


if __name__ == "__main__":
    main(*make_parser(sys.argv[1:]).parse_args_and_config())
