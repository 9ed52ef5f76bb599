#!/usr/bin/env bash
# Recipe 3: GRPO with a model too large for one GPU: ZeRO-3 or FSDP, generating without gathering the whole model.
#
# TRL 0.16.1 gathers the whole model on every GPU to generate under FSDP (FSDP1 fails: "'weight' must be 2-D") and,
# by default, under ZeRO-3 (where --ds3_gather_for_generation false already avoided it).
# With --disable_unwrapping_for_generation the model stays sharded while it generates: one unit (decoder layer) is
# gathered at a time, so the peak is one layer, not the model; generation is slower (docs/generation_unwrapping.md).
#
#   BACKEND=zero3 MODEL=Qwen/Qwen2.5-14B-Instruct REWARD_MODEL=<sequence classifier> bash examples/recipes/grpo_large_model.sh
#   BACKEND=fsdp2 bash examples/recipes/grpo_large_model.sh        # or fsdp1
# Under FSDP2 the final model is saved whole, as from_pretrained loads it (docs/saving.md); the checkpoints
# (every 500 steps) stay sharded and resume.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
: "${MODEL:=Qwen/Qwen2.5-7B-Instruct}" "${REWARD_MODEL:?set REWARD_MODEL to a sequence classification model}"
: "${DATASET:=trl-lib/tldr}" "${BACKEND:=zero3}"
: "${OUTPUT_DIR:=runs/grpo-large-model}"
config="$(config_for "$BACKEND" zero3 fsdp1 fsdp2)"
# beta 0: no reference model (add --beta 0.04 for one: it is sharded like the policy, see grpo_frozen_models.sh).
run "$ACCELERATE" launch --config_file "$config" --num_processes "$NUM_GPUS" \
    -m trl.scripts.grpo \
    --model_name_or_path "$MODEL" --reward_model_name_or_path "$REWARD_MODEL" --dataset_name "$DATASET" \
    --disable_unwrapping_for_generation `# keep the model sharded while generating` \
    --beta 0.0 --per_device_train_batch_size 4 --num_generations 4 --max_prompt_length 512 \
    --max_completion_length 256 --learning_rate 1e-6 --bf16 --gradient_checkpointing --logging_steps 10 \
    --log_level info --output_dir "$OUTPUT_DIR" "$@"
