"""The benchmark of a weight sync into a real vLLM (``benchmarks/vllm_real_sync.py``) at a tiny size (2 layers, hidden
256), FSDP2, colocate and server mode, in ``make test-real-vllm`` (vLLM's CPU build: ``lines/1.16.0/.venv-vllm``, or
TRL_FORK_VLLM_PYTHON). What is checked is that the script still runs against the line's tree and vLLM and reports
every row; the figures of the full sizes are in lines/1.16.0/docs/vllm_sync.md.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


LINE = Path(__file__).resolve().parents[2]
REPO = LINE.parents[1]
sys.path.insert(0, str(LINE / "tests"))
from real_vllm import gloo_refused, vllm_python  # noqa: E402


SCRIPT = REPO / "benchmarks" / "vllm_real_sync.py"


@pytest.mark.real_vllm
def test_the_benchmark_runs_on_a_real_vllm(tmp_path):
    python = vllm_python()
    out = tmp_path / "rows.json"
    env = dict(os.environ, PYTHONPATH=str(LINE / "trl-src"), HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    # server mode sends the weights over gloo (patch 0027), which the server refuses before vLLM 0.31.0: an older vLLM
    # (`make test-real-vllm-versions`) runs colocate mode only
    modes = ["colocate"] if gloo_refused(python, env) else ["colocate", "server"]
    cmd = [python, str(SCRIPT), "--sizes", "tiny", "--backends", "fsdp2", "--reps", "2", "--json", str(out)]
    run = subprocess.run(
        [*cmd, "--modes", ",".join(modes)], capture_output=True, text=True, timeout=900, cwd=REPO, env=env
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert not [row for row in rows if "error" in row], rows
    floor = [row for row in rows if row["mode"] == "floor"]
    syncs = {(row["mode"], row["sync"]): row for row in rows if row["mode"] != "floor"}
    assert len(floor) == 1 and set(syncs) == {(mode, n) for mode in modes for n in (1, 2)}, rows
    assert all(row["seconds"] > 0 and row["peak_extra"] >= 0 for row in syncs.values()), rows
    # server mode also reports the server's worker processes, colocate mode has none
    for n in (1, 2):
        assert syncs["colocate", n]["server_peak_extra"] is None, rows
        assert "server" not in modes or syncs["server", n]["server_peak_extra"] is not None, rows
