# Shared by the recipes (sourced, not run). Every variable can be set from the environment:
#   NUM_GPUS            processes (one per GPU), a positive integer; default: the GPUs in CUDA_VISIBLE_DEVICES, else
#                       those nvidia-smi lists
#   BACKEND             ddp, zero2, zero3, fsdp1 or fsdp2: each recipe says which it accepts and its default
#   ACCELERATE_CONFIG   accelerate config file; default: the one of BACKEND in examples/accelerate_configs/
#   OUTPUT_DIR          where checkpoints go; default: runs/<recipe>
#   RECIPE_DRY_RUN=1    print the commands (with the environment each one gets), run nothing
# Extra arguments given to a recipe are appended to its command: they override its defaults (the last value wins).
# The recipes serve both lines of the fork, TRL 1.16.0+fork (default) and 0.16.1+fork: find_line reads the version of
# the trl that accelerate's Python imports, and a recipe passes the few options that differ between the lines.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CONFIGS="$REPO/examples/accelerate_configs"
if [ -z "${NUM_GPUS:-}" ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then  # set, even empty (no GPU): the GPUs it lists
        NUM_GPUS="$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)"
    else
        NUM_GPUS="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)"
    fi
    if ! [ "$NUM_GPUS" -gt 0 ] 2>/dev/null; then
        echo "error: no GPU found (CUDA_VISIBLE_DEVICES, else nvidia-smi -L); set NUM_GPUS" >&2
        exit 2
    fi
fi
if ! [[ "$NUM_GPUS" =~ ^[0-9]+$ ]] || [ "$((10#$NUM_GPUS))" -eq 0 ]; then
    echo "error: NUM_GPUS=$NUM_GPUS: a positive integer is required (the number of GPUs, one process each)" >&2
    exit 2
fi
NUM_GPUS="$((10#$NUM_GPUS))"
TRL_VERSION="" TRL_LINE=""  # set by find_line
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
quote() {  # one word as it is when the shell needs no quotes for it, else single-quoted
    local plain='^[A-Za-z0-9_./:,=+@%-]+$'
    if [[ "$1" =~ $plain ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
command_line() {  # command_line [VAR=value...] COMMAND ARGS...: one line that a shell runs the same way
    local line="" word
    while [[ $# -gt 0 && "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do line+=" ${1%%=*}=$(quote "${1#*=}")"; shift; done
    for word in "$@"; do line+=" $(quote "$word")"; done
    printf '%s' "${line# }"
}
run() {  # run [VAR=value...] COMMAND ARGS...: prints the command with those variables, then runs it with them
    local assignments=()  # RECIPE_DRY_RUN=1: prints it only; a copy of the printed line runs the same
    while [[ $# -gt 0 && "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do assignments+=("$1"); shift; done
    [ $# -gt 0 ] || { echo "error: run: no command after ${assignments[*]}" >&2; return 2; }
    [ -z "$TRL_LINE" ] || echo "# trl $TRL_VERSION installed: the command of the $TRL_LINE line" >&2
    echo "+ $(command_line ${assignments[@]+"${assignments[@]}"} "$@")" >&2
    if [ -z "${RECIPE_DRY_RUN:-}" ]; then env ${assignments[@]+"${assignments[@]}"} "$@"; fi
}
find_line() {  # sets TRL_VERSION and TRL_LINE (1.16.0 or 0.16.1): the trl of $ACCELERATE's Python, else stops
    local path first python=()
    path="$(command -v "$ACCELERATE" 2>/dev/null || true)"
    if [ -z "$path" ]; then
        echo "error: $ACCELERATE not found: install the fork with accelerate (README, Install) or set ACCELERATE" >&2
        return 2
    fi
    if [ -n "$path" ] && [ -f "$path" ]; then  # its shebang's Python, else the python beside it
        IFS= read -r first < "$path" || true
        if [[ "$first" == "#!"*python* ]]; then read -r -a python <<< "${first#\#!}"; fi
        if [ ${#python[@]} -eq 0 ] && [ -x "$(dirname "$path")/python" ]; then python=("$(dirname "$path")/python"); fi
    fi
    [ ${#python[@]} -gt 0 ] || python=(python3)
    # the installed distribution's version (importing trl 0.16.1 takes seconds), else the version of the trl it imports
    TRL_VERSION="$("${python[@]}" -c 'import importlib.metadata as m
try:
    print(m.version("trl"))
except m.PackageNotFoundError:
    import trl; print(trl.__version__)' 2>/dev/null | tail -n 1 || true)"
    case "$TRL_VERSION" in
        1.16.0*) TRL_LINE=1.16.0 ;;
        0.16.1*) TRL_LINE=0.16.1 ;;
        "") echo "error: ${python[*]} (the Python of $ACCELERATE) cannot import trl: install the fork" \
                "(README, Install)" >&2
            return 2 ;;
        *) echo "error: trl $TRL_VERSION (${python[*]}): the recipes serve the fork's lines 1.16.0 and 0.16.1" >&2
           return 2 ;;
    esac
}
