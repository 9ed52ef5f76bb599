#!/usr/bin/env bash
# Recipe 5: RLOO, PPO or GKD with the reward / value / reference / teacher models sharded like the policy.
# Lines: 1.16.0 (default) and 0.16.1. TRAINER=ppo: 0.16.1 only (TRL 1.16.0 has no PPO trainer). TRAINER=rloo runs
# each line's own RLOO: on 1.16.0 the script behind `trl rloo` (reward model, and a reference model as beta > 0,
# GRPO's options: --num_generations, --max_completion_length); on 0.16.1 examples/scripts/rl_sharded.py (RLOO with a
# reference policy and a reward model, --total_episodes, --response_length). TRAINER=gkd: rl_sharded.py on both (GKD
# is trl.experimental.gkd on 1.16.0).
#
# TRL 0.16.1 keeps these frozen models whole on every GPU (or on the CPU under FSDP), and RLOO / PPO fail under
# DeepSpeed (a second Accelerator) and PPO under FSDP2; TRL 1.16.0 keeps RLOO's reward model and GKD's teacher whole
# on every GPU under FSDP (and fails GKD's first generation under FSDP1). The fork shards them: each rank holds
# 1/NUM_GPUS (lines/0.16.1/docs/frozen_models.md, lines/1.16.0/docs/frozen_models.md). Default backend FSDP1,
# whose final save writes the whole model (as ZeRO-3 does; PPO's failed there in 0.16.1). Look for (--log_level info):
#   [INFO|trl.models.utils] teacher model: sharded by FSDP2 over 8 ranks on cuda:0, this rank holds 12% (...)
#
#   TRAINER=rloo REWARD_MODEL=<sequence classifier> bash examples/recipes/sharded_frozen_models.sh
#   TRAINER=ppo BACKEND=fsdp2 REWARD_MODEL=<sequence classifier> bash examples/recipes/sharded_frozen_models.sh
#   TRAINER=gkd TEACHER=Qwen/Qwen2.5-7B-Instruct DATASET=<dataset with "messages"> bash examples/recipes/sharded_frozen_models.sh
# Under FSDP2 the final model is saved whole, as from_pretrained loads it (lines/1.16.0/docs/saving.md,
# lines/0.16.1/docs/saving.md); the checkpoints (every 500 steps) stay sharded and resume.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
: "${TRAINER:=rloo}" "${MODEL:=Qwen/Qwen2.5-0.5B-Instruct}" "${BACKEND:=fsdp1}"
: "${OUTPUT_DIR:=runs/$TRAINER-sharded}"
config="$(config_for "$BACKEND" fsdp1 fsdp2 zero3)"
case "$TRAINER" in rloo | ppo | gkd) ;; *) echo "error: TRAINER=$TRAINER: expected rloo, ppo or gkd" >&2; exit 2 ;; esac
find_line
script=("$REPO/examples/scripts/rl_sharded.py" --trainer "$TRAINER")
case "$TRAINER/$TRL_LINE" in
    ppo/1.16.0)
        echo "error: TRAINER=ppo: TRL $TRL_VERSION has no PPO trainer (the 0.16.1 line has); use TRAINER=rloo" >&2
        exit 2 ;;
    rloo/1.16.0)
        if [ -n "${TOTAL_EPISODES:-}" ]; then
            echo "error: TOTAL_EPISODES=$TOTAL_EPISODES: the 0.16.1 line's RLOO option; TRL $TRL_VERSION's RLOO" \
                "trains for --max_steps or --num_train_epochs (append one)" >&2
            exit 2
        fi
        : "${DATASET:=trl-lib/tldr}"
        script=(-m trl.scripts.rloo)
        specific=(--reward_model_name_or_path "${REWARD_MODEL:?set REWARD_MODEL to a sequence classifier}"
                  --beta 0.05 `# > 0: a reference model is loaded, and sharded` --num_generations 4
                  --max_completion_length 128 --gradient_checkpointing) ;;
    rloo/* | ppo/*)
        : "${DATASET:=trl-lib/tldr}"
        specific=(--reward_model_name_or_path "${REWARD_MODEL:?set REWARD_MODEL to a sequence classifier}"
                  --total_episodes "${TOTAL_EPISODES:-10000}" --response_length 128 --missing_eos_penalty 1.0) ;;
    gkd/*)
        : "${DATASET:=trl-lib/chatbot_arena_completions}"
        specific=(--teacher_model_name_or_path "${TEACHER:?set TEACHER to the teacher model}" --lmbda 0.5
                  --max_new_tokens 128 --gradient_checkpointing) ;;  # (0.16.1's RLOO / PPO loops do not use it)
esac
run "$ACCELERATE" launch --config_file "$config" --num_processes "$NUM_GPUS" \
    "${script[@]}" \
    --model_name_or_path "$MODEL" --dataset_name "$DATASET" "${specific[@]}" \
    --per_device_train_batch_size 4 --learning_rate 1e-6 --bf16 true --logging_steps 10 \
    --log_level info --output_dir "$OUTPUT_DIR" "$@"
