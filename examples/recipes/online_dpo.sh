#!/usr/bin/env bash
# Recipe 2: Online DPO on N GPUs under DDP, ZeRO-2 or ZeRO-3, with a reward model or a pairwise judge.
#
# TRL 0.16.1 fails at the first step on several GPUs ("'DataParallel' object has no attribute 'config'", and the
# DDP / DeepSpeed variants) because it reads attributes of the wrapped model (docs/wrapped_models.md). The fork
# trains; under ZeRO-3 the reference and reward models are partitioned like the policy. Look for (--log_level info):
#   [INFO|trl.models.utils] reward model: partitioned by ZeRO-3 over 8 ranks on cuda:0, this rank holds 12% (...)
#
#   BACKEND=zero3 REWARD_MODEL=<sequence classifier> bash examples/recipes/online_dpo.sh
#   BACKEND=ddp JUDGE=pair_rm bash examples/recipes/online_dpo.sh     # judge: pair_rm, hf, openai or module:Class
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
: "${MODEL:=Qwen/Qwen2.5-0.5B-Instruct}" "${DATASET:=trl-lib/ultrafeedback-prompt}" "${BACKEND:=zero3}"
: "${OUTPUT_DIR:=runs/online-dpo}"
config="$(config_for "$BACKEND" ddp zero2 zero3)"
if [ -n "${JUDGE:-}" ]; then scorer=(--judge "$JUDGE"); else
    scorer=(--reward_model_path "${REWARD_MODEL:?set REWARD_MODEL (a sequence classifier) or JUDGE}"); fi
run "$ACCELERATE" launch --config_file "$config" --num_processes "$NUM_GPUS" \
    "$REPO/examples/scripts/online_dpo.py" \
    --model_name_or_path "$MODEL" "${scorer[@]}" --dataset_name "$DATASET" \
    --per_device_train_batch_size 4 --max_new_tokens 128 --learning_rate 5e-7 --beta 0.1 \
    --bf16 --gradient_checkpointing --logging_steps 10 --log_level info \
    --output_dir "$OUTPUT_DIR" "$@"
