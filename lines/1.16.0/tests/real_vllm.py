"""What the line's real-vLLM tests (`make test-real-vllm`) share: the Python with vLLM's CPU build, and whether its vLLM
takes `trl vllm-serve --weight_transfer_backend gloo` (patch 0027; refused before `GLOO_MIN_VLLM`, 0.31.0)."""

import os
import subprocess
from pathlib import Path

import pytest


LINE = Path(__file__).resolve().parents[1]


def vllm_python() -> str:
    """`TRL_FORK_VLLM_PYTHON`, else the line's `.venv-vllm`; the test fails in one line when there is none."""
    python = os.environ.get("TRL_FORK_VLLM_PYTHON") or str(LINE / ".venv-vllm" / "bin" / "python")
    if not Path(python).is_file():
        pytest.fail(f"no Python with vLLM's CPU build at {python}: run `make test-real-vllm LINE=1.16.0`")
    return python


def gloo_refused(python, env) -> tuple[str, str] | None:
    """None when `python`'s vLLM takes the gloo weight transfer, else (its vLLM version, the version gloo needs)."""
    code = (
        "from trl.import_utils import is_vllm_available as a; from trl.scripts.vllm_serve import GLOO_MIN_VLLM as m; "
    )
    code += "import importlib.metadata as d; print(a(min_version=m), d.version('vllm'), m)"
    answer = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    ok, version, needed = answer.splitlines()[-1].split()  # the last line: what vLLM logs at import comes before
    return None if ok == "True" else (version, needed)
