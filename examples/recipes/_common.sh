# Shared by the recipes (sourced, not run). Every variable can be set from the environment:
#   NUM_GPUS            processes (one per GPU) for training; default: every GPU nvidia-smi lists, else 8
#   ACCELERATE_CONFIG   accelerate config file; default: the one the recipe names in examples/accelerate_configs/
#   OUTPUT_DIR          where checkpoints go; default: runs/<recipe>
#   RECIPE_DRY_RUN=1    print the commands, run nothing
# Extra arguments given to a recipe are appended to its command: they override its defaults (the last value wins).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CONFIGS="$REPO/examples/accelerate_configs"
if [ -z "${NUM_GPUS:-}" ]; then
    NUM_GPUS="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)"
    [ "$NUM_GPUS" -gt 0 ] 2>/dev/null || NUM_GPUS=8
fi
ACCELERATE="${ACCELERATE:-accelerate}"
run() {  # prints the command, then runs it (RECIPE_DRY_RUN=1: prints it only)
    echo "+ $*" >&2
    if [ -z "${RECIPE_DRY_RUN:-}" ]; then "$@"; fi
}
