#!/usr/bin/env bash
# Recipe 4: GRPO generating with `trl vllm-serve` on one GPU, training on the others under FSDP2 or ZeRO-3,
# with or without LoRA.
# Lines: 1.16.0 (default) and 0.16.1; the vLLM versions and the sync options differ (below).
#
# 1.16.0 line (vLLM 0.22-0.31, as TRL 1.16.0 allows): TRL 1.16.0 streams the weights to the server in vLLM's packed
# stream; the fork sends every weight of an FSDP1 policy, merges a LoRA policy one unit at a time under ZeRO-3 and
# FSDP, and makes a failure of one process raise on every process (lines/1.16.0/docs/vllm_sync.md,
# lines/1.16.0/docs/vllm_failures.md). The stream has no bucket size: VLLM_SYNC_MB is refused on this line.
# 0.16.1 line (vllm>=0.7.2,<0.8.2; older versions are refused with that fix): TRL 0.16.1 sends flat FSDP shards under
# `_fsdp_wrapped_module` names to vLLM (FSDP), or gathers the whole model (ZeRO-3) for every sync. The fork sends
# exact weights under checkpoint names, gathering at most one bucket of VLLM_SYNC_MB megabytes (default 128) at a
# time; with LoRA the adapters are merged layer by layer (lines/0.16.1/docs/vllm_weight_sync.md).
# Install vLLM with the fork: `pip install "trl[vllm] @ git+..."` (README, Install).
#
#   NUM_GPUS=8 MODEL=Qwen/Qwen2.5-7B-Instruct REWARD_MODEL=<sequence classifier> bash examples/recipes/grpo_vllm_server.sh
#   LORA=1 BACKEND=zero3 bash examples/recipes/grpo_vllm_server.sh    # 0.16.1 line: VLLM_SYNC_MB=256 too
# vLLM gets the first GPU (of CUDA_VISIBLE_DEVICES when it is set: CUDA_VISIBLE_DEVICES=4,5,6,7 serves on 4 and trains
# on 5,6,7), training the next NUM_GPUS-1; RECIPE_DRY_RUN=1 prints both commands with their CUDA_VISIBLE_DEVICES.
# Only the trainer may change the server's weights: both get the token in VLLM_API_KEY (yours, or a random one made
# here when it is unset; lines/0.16.1/docs/vllm_weight_sync.md#only-the-trainer-changes-the-weights-patch-0041,
# lines/1.16.0/docs/vllm_sync.md#only-the-trainer-changes-the-weights-patch-0021).
# Under FSDP2 the final model is saved whole, as from_pretrained loads it (lines/1.16.0/docs/saving.md,
# lines/0.16.1/docs/saving.md); the checkpoints (every 500 steps) stay sharded and resume. Prompts are not truncated
# on 1.16.0 (0.16.1: at 512 tokens, its default).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
: "${MODEL:=Qwen/Qwen2.5-0.5B-Instruct}" "${REWARD_MODEL:?set REWARD_MODEL to a sequence classification model}"
: "${DATASET:=trl-lib/tldr}" "${BACKEND:=fsdp2}" "${VLLM_PORT:=8000}"
: "${OUTPUT_DIR:=runs/grpo-vllm-server}"
config="$(config_for "$BACKEND" fsdp2 zero3)"
find_line
health=/health  # the server's readiness probe, open without the token
if [ "$TRL_LINE" = 0.16.1 ]; then
    sync=(--vllm_sync_bucket_size_mb "${VLLM_SYNC_MB:-128}")  # bound on the weights gathered at once for a sync
    health=/health/
elif [ -n "${VLLM_SYNC_MB:-}" ]; then
    echo "error: VLLM_SYNC_MB=$VLLM_SYNC_MB: the 0.16.1 line's sync bucket; the 1.16.0 line (trl $TRL_VERSION) sends" \
        "vLLM's packed stream, which has no bucket size: unset VLLM_SYNC_MB" >&2
    exit 2
else
    sync=(--vllm_mode server)  # TRL 1.16.0's default mode is colocate (a vLLM engine in each training process)
fi
[ "$NUM_GPUS" -ge 2 ] || { echo "error: NUM_GPUS=$NUM_GPUS: one GPU serves vLLM, at least one trains" >&2; exit 2; }
lora=()
if [ -n "${LORA:-}" ]; then lora=(--use_peft --lora_r 16 --lora_alpha 32 --lora_target_modules all-linear); fi
# The GPUs: those CUDA_VISIBLE_DEVICES lists when it is set (the first NUM_GPUS of them), else 0..NUM_GPUS-1.
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"; else
    read -r -a gpus <<< "$(seq -s " " 0 $((NUM_GPUS - 1)))"; fi
if [ "${#gpus[@]}" -lt "$NUM_GPUS" ]; then
    echo "error: NUM_GPUS=$NUM_GPUS, but CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} lists ${#gpus[@]} GPU(s)" >&2
    exit 2
fi
# The server's token, in the environment of both commands (never on a command line, never printed)
: "${VLLM_API_KEY:=$(python3 -c 'import secrets; print(secrets.token_hex(16))' || true)}"
if [ -z "$VLLM_API_KEY" ]; then
    echo "error: no token for the server: python3 could not make one; set VLLM_API_KEY" >&2
    exit 2
fi
export VLLM_API_KEY
vllm_gpu="${gpus[0]}"
train_gpus="$(IFS=,; echo "${gpus[*]:1:$((NUM_GPUS - 1))}")"

# 1. vLLM on the first GPU, in the background; stopped when this script exits (also on Ctrl-C).
serve=(trl vllm-serve --model "$MODEL" --port "$VLLM_PORT")
echo "+ $(command_line CUDA_VISIBLE_DEVICES="$vllm_gpu" "${serve[@]}") &" >&2
if [ -z "${RECIPE_DRY_RUN:-}" ]; then
    command -v curl >/dev/null || { echo "error: curl is needed to wait for the vLLM server" >&2; exit 2; }
    CUDA_VISIBLE_DEVICES="$vllm_gpu" "${serve[@]}" &
    server=$!  # the server process itself
    trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
    trap 'exit 130' INT TERM
    until curl -sf "http://localhost:$VLLM_PORT$health" >/dev/null; do
        kill -0 $server 2>/dev/null || { echo "error: trl vllm-serve exited before it was ready" >&2; exit 1; }
        sleep 5
    done
fi

# 2. Training on the other GPUs; the policy's weights go to the server after every optimizer step.
run CUDA_VISIBLE_DEVICES="$train_gpus" "$ACCELERATE" launch \
    --config_file "$config" --num_processes "$((NUM_GPUS - 1))" \
    -m trl.scripts.grpo \
    --model_name_or_path "$MODEL" --reward_model_name_or_path "$REWARD_MODEL" --dataset_name "$DATASET" \
    --use_vllm --vllm_server_host localhost --vllm_server_port "$VLLM_PORT" \
    "${sync[@]}" ${lora[@]+"${lora[@]}"} --beta 0.04 --per_device_train_batch_size 8 --num_generations 8 \
    --max_completion_length 256 --learning_rate 1e-6 --bf16 true --gradient_checkpointing --logging_steps 10 \
    --log_level info --output_dir "$OUTPUT_DIR" "$@"
