#!/usr/bin/env bash
# The 0.16.1 line's GPU checks on a lent GPU machine with no network (the `device` tool of our workplace): the
# machine's own python3 (with torch) plus the wheels carried in .whl/ (the fork's wheel and the line's pins:
# transformers 4.51.3, accelerate 1.6.0, peft 0.15.2, datasets 3.6.0, deepspeed 0.16.9 and their missing needs).
#
#   1. `make recipes-gpu`'s tests (tests/recipes, -m gpu): one after the other, so their timings are clean;
#      report -> $OUT/recipes_gpu.md (lines/0.16.1/docs/recipes_gpu.md's format)
#   2. the GPU matrix (lines/0.16.1/tests/dist/test_matrix_gpu.py) one concurrent pytest per backend (tiny models; one GPU
#      holds all of them), bounded by MATRIX_LIMIT seconds so the call returns with what it has.
#
# Fill .whl/ on a machine with pip first (docs/gpu_runs.md): `pip download --no-deps --only-binary=:all:` of the pins
# above for Python 3.12 / manylinux x86_64, and `pip wheel --no-deps -w .whl lines/0.16.1` for the fork (remove older fork wheels).
set -u
OUT=${OUT:-/tmp/device-out}
MATRIX_LIMIT=${MATRIX_LIMIT:-200}
RECIPES_LIMIT=${RECIPES_LIMIT:-300}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH DS_ACCELERATOR=cuda HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
series=$(grep -c '^0' lines/0.16.1/patches/series)
python3 -c "import trl, sys; sys.exit(0 if trl.__version__ == '0.16.1+fork.$series' else f'stale fork wheel: {trl.__version__}, series has $series patches')" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, accelerate, deepspeed, peft, datasets, trl; print('torch', torch.__version__,
'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'deepspeed', deepspeed.__version__,
'peft', peft.__version__, 'datasets', datasets.__version__, 'trl', trl.__version__)" 2>&1 | tail -3 | tee -a "$OUT/gpu.txt"

start=$(date +%s)
RECIPES_REPORT=lines/0.16.1/docs/recipes_gpu.md timeout "$RECIPES_LIMIT" python3 -m pytest -m gpu tests/recipes -p no:cacheprovider -q --junitxml="$OUT/recipes.xml" \
    >"$OUT/recipes.log" 2>&1
echo "recipes: rc=$? in $(( $(date +%s) - start )) s"; tail -15 "$OUT/recipes.log"
cp -f lines/0.16.1/docs/recipes_gpu.md "$OUT/recipes_gpu.md" 2>/dev/null

start=$(date +%s)
for group in ddp dataparallel fsdp1 fsdp2 zero2 zero3; do
    name=$(echo "$group" | tr -c 'a-z0-9\n' '_')
    timeout "$MATRIX_LIMIT" python3 -m pytest -m gpu lines/0.16.1/tests/dist/test_matrix_gpu.py -k "$group" -p no:cacheprovider \
        -q --junitxml="$OUT/matrix_$name.xml" >"$OUT/matrix_$name.log" 2>&1 &
done
wait
echo "matrix: $(( $(date +%s) - start )) s"
for log in "$OUT"/matrix_*.log; do echo "== $log"; tail -25 "$log"; done
