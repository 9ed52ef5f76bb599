#!/usr/bin/env bash
# Recipe 2: Online DPO on N GPUs under DDP, ZeRO-2 or ZeRO-3, with a reward model or (0.16.1 line) a pairwise judge.
# Lines: 1.16.0 (default; Online DPO is trl.experimental there) and 0.16.1, the same command; JUDGE: 0.16.1 only
# (TRL 1.16.0's Online DPO scores with reward models and functions, it has no pairwise judges).
#
# TRL 0.16.1 fails at the first step on several GPUs ("'DataParallel' object has no attribute 'config'", and the
# DDP / DeepSpeed variants) because it reads attributes of the wrapped model (lines/0.16.1/docs/wrapped_models.md);
# TRL 1.16.0 trains but refuses ZeRO-3 without a reference model (create_reference_model()). The fork trains; under
# ZeRO-3 the reference model is loaded again from the policy's checkpoint and, with the reward model, partitioned
# like the policy. Look for (--log_level info; 1.16.0 names the reward model: "reward model <name>: partitioned ..."):
#   [INFO|trl.models.utils] reward model: partitioned by ZeRO-3 over 8 ranks on cuda:0, this rank holds 12% (...)
#
#   BACKEND=zero3 REWARD_MODEL=<sequence classifier> bash examples/recipes/online_dpo.sh
#   BACKEND=ddp JUDGE=pair_rm bash examples/recipes/online_dpo.sh     # 0.16.1: pair_rm, hf, openai or module:Class
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
: "${MODEL:=Qwen/Qwen2.5-0.5B-Instruct}" "${DATASET:=trl-lib/ultrafeedback-prompt}" "${BACKEND:=zero3}"
: "${OUTPUT_DIR:=runs/online-dpo}"
config="$(config_for "$BACKEND" ddp zero2 zero3)"
find_line
if [ -n "${JUDGE:-}" ] && [ "$TRL_LINE" != 0.16.1 ]; then
    echo "error: JUDGE=$JUDGE: TRL $TRL_VERSION's Online DPO has no pairwise judges (the 0.16.1 line has);" \
        "set REWARD_MODEL to a sequence classifier" >&2
    exit 2
fi
if [ -n "${JUDGE:-}" ]; then scorer=(--judge "$JUDGE"); else
    scorer=(--reward_model_path "${REWARD_MODEL:?set REWARD_MODEL (a sequence classifier) or JUDGE}"); fi
run "$ACCELERATE" launch --config_file "$config" --num_processes "$NUM_GPUS" \
    "$REPO/examples/scripts/online_dpo.py" \
    --model_name_or_path "$MODEL" "${scorer[@]}" --dataset_name "$DATASET" \
    --per_device_train_batch_size 4 --max_new_tokens 128 --learning_rate 5e-7 --beta 0.1 \
    --bf16 true --gradient_checkpointing --logging_steps 10 --log_level info \
    --output_dir "$OUTPUT_DIR" "$@"
