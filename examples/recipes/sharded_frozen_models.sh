#!/usr/bin/env bash
# Recipe 5: RLOO, PPO or GKD with the reward / value / reference / teacher models sharded like the policy.
#
# TRL 0.16.1 keeps these frozen models whole on every GPU (or on the CPU under FSDP), and RLOO / PPO fail under
# DeepSpeed (a second Accelerator) and PPO under FSDP2. The fork shards them: each rank holds 1/NUM_GPUS
# (docs/frozen_models.md). Default backend FSDP1, whose final save writes the whole model (as ZeRO-3 does; PPO's
# failed there in 0.16.1). Look for (--log_level info):
#   [INFO|trl.models.utils] teacher model: sharded by FSDP2 over 8 ranks on cuda:0, this rank holds 12% (...)
#
#   TRAINER=rloo REWARD_MODEL=<sequence classifier> bash examples/recipes/sharded_frozen_models.sh
#   TRAINER=ppo BACKEND=fsdp2 REWARD_MODEL=<sequence classifier> bash examples/recipes/sharded_frozen_models.sh
#   TRAINER=gkd TEACHER=Qwen/Qwen2.5-7B-Instruct DATASET=<dataset with "messages"> bash examples/recipes/sharded_frozen_models.sh
# Under FSDP2 the final model is saved whole, as from_pretrained loads it (docs/saving.md); the checkpoints
# (every 500 steps) stay sharded and resume.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
: "${TRAINER:=rloo}" "${MODEL:=Qwen/Qwen2.5-0.5B-Instruct}" "${BACKEND:=fsdp1}"
: "${OUTPUT_DIR:=runs/$TRAINER-sharded}"
config="$(config_for "$BACKEND" fsdp1 fsdp2 zero3)"
case "$TRAINER" in
    rloo | ppo)
        : "${DATASET:=trl-lib/tldr}"
        specific=(--reward_model_name_or_path "${REWARD_MODEL:?set REWARD_MODEL to a sequence classifier}"
                  --total_episodes "${TOTAL_EPISODES:-10000}" --response_length 128 --missing_eos_penalty 1.0) ;;
    gkd)
        : "${DATASET:=trl-lib/chatbot_arena_completions}"
        specific=(--teacher_model_name_or_path "${TEACHER:?set TEACHER to the teacher model}" --lmbda 0.5
                  --max_new_tokens 128) ;;
    *) echo "error: TRAINER=$TRAINER: expected rloo, ppo or gkd" >&2; exit 2 ;;
esac
if [ "$TRAINER" = gkd ]; then specific+=(--gradient_checkpointing); fi  # RLOO / PPO loops do not use it
run "$ACCELERATE" launch --config_file "$config" --num_processes "$NUM_GPUS" \
    "$REPO/examples/scripts/rl_sharded.py" --trainer "$TRAINER" \
    --model_name_or_path "$MODEL" --dataset_name "$DATASET" "${specific[@]}" \
    --per_device_train_batch_size 4 --learning_rate 1e-6 --bf16 --logging_steps 10 \
    --log_level info --output_dir "$OUTPUT_DIR" "$@"
