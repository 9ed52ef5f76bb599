#!/usr/bin/env bash
# Recipe 6: GRPO on several machines (docs/multi_machine.md). Every machine runs this recipe with the same variables
# except its own MACHINE_RANK; accelerate starts NUM_GPUS processes on each, and they meet at
# MAIN_PROCESS_IP:MAIN_PROCESS_PORT (machine 0) as one job of NUM_MACHINES x NUM_GPUS processes.
#
#   # on machine 0, whose address the others reach as 10.0.0.1:
#   NUM_MACHINES=2 MACHINE_RANK=0 MAIN_PROCESS_IP=10.0.0.1 REWARD_MODEL=<sequence classifier> bash examples/recipes/multi_machine.sh
#   # on machine 1:
#   NUM_MACHINES=2 MACHINE_RANK=1 MAIN_PROCESS_IP=10.0.0.1 REWARD_MODEL=<sequence classifier> bash examples/recipes/multi_machine.sh
#
#   NUM_MACHINES        machines in the job, a positive integer (default 1)
#   MACHINE_RANK        this machine: 0 on the machine at MAIN_PROCESS_IP, then 1 .. NUM_MACHINES-1, each once
#                       (required with several machines)
#   MAIN_PROCESS_IP     the address of machine 0, as the other machines reach it (required with several machines)
#   MAIN_PROCESS_PORT   a free TCP port of machine 0, open to the others (default 29500)
#   NUM_GPUS            the GPUs of each machine, one process each (GPUS_PER_MACHINE: the same); default: the GPUs of
#                       this machine (see _common.sh). Every machine must use the same number
#   BACKEND             ddp (default), zero2, zero3, fsdp1 or fsdp2
# The command is the same with TRL 0.16.1+fork and 1.16.0+fork: it runs trl.scripts.grpo (the script behind
# `trl grpo`, whose own launcher takes no accelerate option in 0.16.1) with options both versions accept.
# Machines without GPUs: set ACCELERATE_USE_CPU=true on each (accelerate >= 1.10 would let every machine train alone).
# Only the main process (machine 0) writes the final model to OUTPUT_DIR. Sharded (FSDP, DeepSpeed) checkpoints are
# written by every process into its machine's OUTPUT_DIR: resuming one needs an OUTPUT_DIR all machines share.
set -euo pipefail
fail() { echo "error: $*" >&2; exit 2; }
positive() {  # positive NAME VALUE WHAT: exits with one line unless VALUE is a positive integer
    if ! [[ "$2" =~ ^[0-9]+$ ]] || [ "$((10#$2))" -eq 0 ]; then fail "$1=$2: a positive integer is required ($3)"; fi
}
if [ -n "${GPUS_PER_MACHINE:-}" ]; then  # this recipe's name for NUM_GPUS
    positive GPUS_PER_MACHINE "$GPUS_PER_MACHINE" "the GPUs of each machine, one process each"
    if [ -n "${NUM_GPUS:-}" ] && [ "$NUM_GPUS" != "$GPUS_PER_MACHINE" ]; then
        fail "GPUS_PER_MACHINE=$GPUS_PER_MACHINE and NUM_GPUS=$NUM_GPUS disagree; set one of them"
    fi
    NUM_GPUS="$GPUS_PER_MACHINE"
fi
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
: "${MODEL:=Qwen/Qwen2.5-0.5B-Instruct}" "${REWARD_MODEL:?set REWARD_MODEL to a sequence classification model}"
: "${DATASET:=trl-lib/tldr}" "${OUTPUT_DIR:=runs/grpo-multi-machine}" "${BACKEND:=ddp}"
: "${NUM_MACHINES:=1}" "${MAIN_PROCESS_PORT:=29500}"
positive NUM_MACHINES "$NUM_MACHINES" "the machines of the job"
NUM_MACHINES="$((10#$NUM_MACHINES))"
if [ "$NUM_MACHINES" -gt 1 ] && [ -z "${MACHINE_RANK:-}" ]; then
    fail "MACHINE_RANK is required with NUM_MACHINES=$NUM_MACHINES:" \
        "0 to $((NUM_MACHINES - 1)), one per machine, 0 on the machine at MAIN_PROCESS_IP"
fi
if [ "$NUM_MACHINES" -gt 1 ] && [ -z "${MAIN_PROCESS_IP:-}" ]; then
    fail "MAIN_PROCESS_IP is required with NUM_MACHINES=$NUM_MACHINES:" \
        "the address of machine 0, as the other machines reach it"
fi
: "${MACHINE_RANK:=0}"
if ! [[ "$MACHINE_RANK" =~ ^[0-9]+$ ]] || [ "$((10#$MACHINE_RANK))" -ge "$NUM_MACHINES" ]; then
    fail "MACHINE_RANK=$MACHINE_RANK: an integer in [0, $NUM_MACHINES) is required" \
        "(0 on the machine at MAIN_PROCESS_IP)"
fi
MACHINE_RANK="$((10#$MACHINE_RANK))"
if ! [[ "$MAIN_PROCESS_PORT" =~ ^[0-9]+$ ]] || [ "$((10#$MAIN_PROCESS_PORT))" -eq 0 ] \
    || [ "$((10#$MAIN_PROCESS_PORT))" -gt 65535 ]; then
    fail "MAIN_PROCESS_PORT=$MAIN_PROCESS_PORT: a TCP port in [1, 65535] is required (free on machine 0)"
fi
MAIN_PROCESS_PORT="$((10#$MAIN_PROCESS_PORT))"
address=()
if [ -n "${MAIN_PROCESS_IP:-}" ]; then address=(--main_process_ip "$MAIN_PROCESS_IP"); fi
config="$(config_for "$BACKEND" ddp zero2 zero3 fsdp1 fsdp2)"
echo "# machine $MACHINE_RANK of $NUM_MACHINES: $NUM_GPUS processes here, $((NUM_MACHINES * NUM_GPUS)) in all" >&2
run "$ACCELERATE" launch --config_file "$config" \
    --num_machines "$NUM_MACHINES" --machine_rank "$MACHINE_RANK" ${address[@]+"${address[@]}"} \
    --main_process_port "$MAIN_PROCESS_PORT" \
    --num_processes "$((NUM_MACHINES * NUM_GPUS))" `# all the processes of the job, not of this machine` \
    -m trl.scripts.grpo \
    --model_name_or_path "$MODEL" --reward_model_name_or_path "$REWARD_MODEL" --dataset_name "$DATASET" \
    --per_device_train_batch_size 8 --num_generations 8 `# per-device batch: a multiple of num_generations` \
    --max_completion_length 256 \
    --learning_rate 1e-6 --bf16 true --gradient_checkpointing --logging_steps 10 --log_level info \
    --output_dir "$OUTPUT_DIR" "$@"
