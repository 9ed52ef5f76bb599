#!/usr/bin/env bash
# Recipe 1: GRPO with a reference model (beta > 0) and a reward model, both sharded by FSDP like the policy.
# Lines: 1.16.0 (default) and 0.16.1, the same command.
#
# TRL 0.16.1 leaves the reference and reward models whole on the CPU under FSDP: the first reference forward fails
# with a device mismatch; TRL 1.16.0 shards the reference model but keeps a full replica of the reward model on every
# GPU. With the fork each rank holds 1/NUM_GPUS of both, on its GPU (lines/0.16.1/docs/frozen_models.md,
# lines/1.16.0/docs/frozen_models.md). Look for, at the start of the log (main process, --log_level info):
#   [INFO|trl.models.utils] reference model: sharded by FSDP2 over 8 ranks on cuda:0, this rank holds 12% (...)
#   [INFO|trl.models.utils] reward model: sharded by FSDP2 over 8 ranks on cuda:0, this rank holds 12% (...)
# (1.16.0 names the reward model: "reward model <name>: sharded by FSDP2 ...").
#
#   NUM_GPUS=8 MODEL=Qwen/Qwen2.5-1.5B-Instruct REWARD_MODEL=<sequence classifier> bash examples/recipes/grpo_frozen_models.sh
#   BACKEND=fsdp1 bash examples/recipes/grpo_frozen_models.sh   # FSDP1 instead of FSDP2 (FSDP=fsdp1: the old name)
# Under FSDP2 the final model is saved whole, as from_pretrained loads it (lines/1.16.0/docs/saving.md,
# lines/0.16.1/docs/saving.md); the checkpoints (every 500 steps) stay sharded and resume. Prompts are not truncated
# on 1.16.0 (0.16.1: at 512 tokens, its default).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
: "${MODEL:=Qwen/Qwen2.5-0.5B-Instruct}" "${REWARD_MODEL:?set REWARD_MODEL to a sequence classification model}"
: "${DATASET:=trl-lib/tldr}" "${OUTPUT_DIR:=runs/grpo-frozen-models}"
if [ -n "${FSDP:-}" ]; then  # FSDP= is this recipe's old name for BACKEND=
    if [ -n "${BACKEND:-}" ] && [ "$BACKEND" != "$FSDP" ]; then
        echo "error: BACKEND=$BACKEND and FSDP=$FSDP disagree; set BACKEND only (FSDP is its old name)" >&2
        exit 2
    fi
    BACKEND="$FSDP"
fi
: "${BACKEND:=fsdp2}"
config="$(config_for "$BACKEND" fsdp1 fsdp2)"
find_line
run "$ACCELERATE" launch --config_file "$config" --num_processes "$NUM_GPUS" \
    -m trl.scripts.grpo \
    --model_name_or_path "$MODEL" --reward_model_name_or_path "$REWARD_MODEL" --dataset_name "$DATASET" \
    --beta 0.04 `# > 0: a reference model is loaded, and sharded` \
    --per_device_train_batch_size 8 --num_generations 8 `# per-device batch: a multiple of num_generations` \
    --max_completion_length 256 \
    --learning_rate 1e-6 --bf16 true --gradient_checkpointing --logging_steps 10 --log_level info \
    --output_dir "$OUTPUT_DIR" "$@"
