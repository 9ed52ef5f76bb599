# Shared by the recipes (sourced, not run). Every variable can be set from the environment:
#   NUM_GPUS            processes (one per GPU); default: the GPUs in CUDA_VISIBLE_DEVICES, else those nvidia-smi lists
#   ACCELERATE_CONFIG   accelerate config file; default: the one the recipe names in examples/accelerate_configs/
#   OUTPUT_DIR          where checkpoints go; default: runs/<recipe>
#   RECIPE_DRY_RUN=1    print the commands, run nothing
# Extra arguments given to a recipe are appended to its command: they override its defaults (the last value wins).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CONFIGS="$REPO/examples/accelerate_configs"
if [ -z "${NUM_GPUS:-}" ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        NUM_GPUS="$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)"
    else
        NUM_GPUS="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)"
    fi
    if ! [ "$NUM_GPUS" -gt 0 ] 2>/dev/null; then
        echo "error: no GPU found (nvidia-smi -L); set NUM_GPUS" >&2
        exit 2
    fi
fi
ACCELERATE="${ACCELERATE:-accelerate}"
declare -A CONFIG_FILES=([ddp]=multi_gpu.yaml [zero2]=deepspeed_zero2.yaml [zero3]=deepspeed_zero3.yaml
                        [fsdp1]=fsdp1.yaml [fsdp2]=fsdp2.yaml)
config_for() {  # config_for BACKEND ALLOWED...: $ACCELERATE_CONFIG, else the config file of BACKEND if it is allowed
    local backend="$1"
    shift
    case " $* " in
        *" $backend "*) echo "${ACCELERATE_CONFIG:-$CONFIGS/${CONFIG_FILES[$backend]}}" ;;
        *) echo "error: backend '$backend': expected one of: $*" >&2; return 2 ;;
    esac
}
run() {  # prints the command, then runs it (RECIPE_DRY_RUN=1: prints it only)
    echo "+ $*" >&2
    if [ -z "${RECIPE_DRY_RUN:-}" ]; then "$@"; fi
}
