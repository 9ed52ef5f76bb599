#!/usr/bin/env bash
# Recipe 3: GRPO with a model too large for one GPU: ZeRO-3 or FSDP, generating without gathering the whole model.
# Lines: 1.16.0 (default) and 0.16.1; one option differs (below).
#
# TRL 0.16.1 gathers the whole model on every GPU to generate under FSDP (FSDP1 fails: "'weight' must be 2-D") and,
# by default, under ZeRO-3 (where --ds3_gather_for_generation false already avoided it). TRL 1.16.0 gathers it under
# ZeRO-3 by default too. The option that keeps the model sharded while it generates, gathering its units (decoder
# layers) one at a time at each forward, so that the peak is about one layer, not the model (generation is slower):
#   1.16.0 line: --generation_gather_budget_mb 0 (lines/1.16.0/docs/generation_budget.md); a budget in MB keeps the
#                first layers that fit gathered for the whole generation: faster, e.g. append
#                --generation_gather_budget_mb 4096 (the last value wins)
#   0.16.1 line: --disable_unwrapping_for_generation (lines/0.16.1/docs/generation_unwrapping.md)
# 1.16.0 line under ZeRO-3: on 2 CPU ranks the first training step after such a generation fails in TRL 1.16.0's
# fused LM head ("Cannot partition a param in flight"; pristine 1.16.0 with --ds3_gather_for_generation false too),
# not yet fixed by the fork: use BACKEND=fsdp2 (or fsdp1) on that line. Untried on GPUs.
#
#   MODEL=Qwen/Qwen2.5-14B-Instruct REWARD_MODEL=<sequence classifier> bash examples/recipes/grpo_large_model.sh
#   BACKEND=fsdp1 bash examples/recipes/grpo_large_model.sh   # BACKEND: fsdp2 (1.16.0's default), fsdp1, zero3 (0.16.1's)
# Under FSDP2 the final model is saved whole, as from_pretrained loads it (lines/1.16.0/docs/saving.md,
# lines/0.16.1/docs/saving.md); the checkpoints (every 500 steps) stay sharded and resume. Prompts are not truncated
# on 1.16.0 (0.16.1: at 512 tokens, its default).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
: "${MODEL:=Qwen/Qwen2.5-7B-Instruct}" "${REWARD_MODEL:?set REWARD_MODEL to a sequence classification model}"
: "${DATASET:=trl-lib/tldr}" "${OUTPUT_DIR:=runs/grpo-large-model}"
find_line
if [ "$TRL_LINE" = 0.16.1 ]; then : "${BACKEND:=zero3}"; else : "${BACKEND:=fsdp2}"; fi  # 1.16.0: ZeRO-3 above
config="$(config_for "$BACKEND" zero3 fsdp1 fsdp2)"
if [ "$TRL_LINE" = 0.16.1 ]; then sharded=(--disable_unwrapping_for_generation); else
    sharded=(--generation_gather_budget_mb 0); fi
# beta 0: no reference model (add --beta 0.04 for one: it is sharded like the policy, see grpo_frozen_models.sh).
run "$ACCELERATE" launch --config_file "$config" --num_processes "$NUM_GPUS" \
    -m trl.scripts.grpo \
    --model_name_or_path "$MODEL" --reward_model_name_or_path "$REWARD_MODEL" --dataset_name "$DATASET" \
    "${sharded[@]}" `# keep the model sharded while generating` \
    --beta 0.0 --per_device_train_batch_size 4 --num_generations 4 \
    --max_completion_length 256 --learning_rate 1e-6 --bf16 true --gradient_checkpointing --logging_steps 10 \
    --log_level info --output_dir "$OUTPUT_DIR" "$@"
