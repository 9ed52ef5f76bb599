"""The memory gate's measurement, for every line (``lines/<version>/tests/golden/test_memory_gate*.py``): with no
fork option set, generation holds no more parameter memory on the fork than on the line's pristine release.

``measure`` runs ``benchmarks/generation_memory.py --default-only`` on the pristine base and on the fork (trees of
``tools/prove.py``) with the same tiny Qwen2 model on 2 gloo ranks: ``unwrap_model_for_generation(model,
accelerator)`` entered as the line's trainers enter it, then greedy ``generate()``. The probe samples, at every
module's forward, the bytes of every storage holding parameter data (shards, gathered parameters, FSDP2 all-gather
outputs). ``check_default_path_memory``: per backend and rank, the fork's peak must not exceed the base's by more
than ``SLACK`` and its tokens must equal the plain model's where the base's do.
"""

import json
import sys

from .launcher import REPO_ROOT, run_benchmark


BENCHMARK = REPO_ROOT / "benchmarks" / "generation_memory.py"
MODEL = ["--layers", "4", "--hidden", "256", "--intermediate", "768", "--heads", "4", "--vocab", "8000"]
GENERATION = ["--batch", "1", "--prompt", "8", "--new-tokens", "4"]
SLACK = 1.02  # the fork may hold at most 2 % more than the base at its peak
TIMEOUT = 900


def measure(trees, backends, tmp_path_factory):
    """``{tree: {backend: [per-rank result]}}`` of the default mode, for each tree of ``trees`` (name -> path)."""
    out = {}
    for tree, path in trees.items():
        json_path = tmp_path_factory.mktemp(f"memory-{tree}") / "result.json"
        command = [sys.executable, str(BENCHMARK), "--trl", str(path), "--backends", ",".join(backends)]
        command += ["--default-only", *MODEL, *GENERATION, "--json", str(json_path)]
        done = run_benchmark(command, timeout=TIMEOUT)
        assert done.returncode == 0, f"{tree}: benchmark failed\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        print(done.stdout)
        out[tree] = json.loads(json_path.read_text())["results"]
    return out


def check_default_path_memory(peaks, backend, base_name):
    base, fork = peaks["base"][backend], peaks["fork"][backend]
    assert len(base) == len(fork) == 2
    for b, f in zip(base, fork):
        where = f"{backend}, rank {b['rank']}"
        assert b["full_bytes"] == f["full_bytes"], where
        # a probe that saw nothing would make the comparison meaningless
        assert 0 < b["default"]["peak_bytes"] and 0 < f["default"]["peak_bytes"], where
        assert f["default"]["peak_bytes"] <= b["default"]["peak_bytes"] * SLACK, (
            f"{where}: the fork's default mode peaks at {f['default']['peak_bytes']:,} bytes of parameters while "
            f"generating, {base_name} at {b['default']['peak_bytes']:,} (full model: {b['full_bytes']:,})"
        )
        assert f["default"]["matches_plain"] or not b["default"]["matches_plain"], where
        assert f["resident_bytes"] == b["resident_bytes"], where
