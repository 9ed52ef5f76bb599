"""Install the TRL fork's 0.16.1 line: TRL 0.16.1 with the patch series in ``patches/`` (next to this file) applied.

    pip install "trl @ git+<this repository>#subdirectory=lines/0.16.1"

The repository holds no upstream source. Building fetches the pinned sdist through pip, verifies its sha256, applies
``patches/series`` and packages the result (``tools/forksetup.py`` at the repository root, shared with the other
lines). An editable install (``pip install -e lines/0.16.1``) points at this line's development tree,
``lines/0.16.1/trl-src/``, which is materialized on first use and then left to the developer (CONTRIBUTING.md).
"""

import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tools"))

from forksetup import fork_setup  # noqa: E402


# Upper bounds we have tested TRL 0.16.1 with. A fresh resolve without them picks releases that 0.16.1 does not run
# on (transformers 5.x, for one). Raise a bound only after running `make test` and `make test-dist` with the new
# release.
TESTED_UPPER_BOUNDS = {
    "transformers": "<4.52",
    "accelerate": "<1.7",
    "datasets": "<4",
    "peft": "<0.16",
    "deepspeed": "<0.17",
    # The first vLLM release that breaks what 0.16.1's vLLM paths call: from 0.8.2 on, a custom `worker_cls` no
    # longer falls back to vLLM's V0 engine, so `trl vllm-serve`'s V0 WeightSyncWorker lands on V1 and fails. Checked
    # on the wheels by tests/build/test_vllm_contract.py; the table per release is in lines/0.16.1/docs/vllm_version.md.
    "vllm": "<0.8.2",
}
# What the fork's own test suite needs on top of upstream's `test` extra.
# fastapi, uvicorn and requests: the tests run `trl vllm-serve`'s app (with a stand-in engine) and its client.
FORK_EXTRAS = {"test": ["pytest-timeout", "tokenizers", "fastapi", "uvicorn", "requests"]}


fork_setup(
    HERE,
    description="TRL 0.16.1 with fixes for distributed online RL training (FSDP, DeepSpeed ZeRO-3, DataParallel, vLLM).",
    bounds=TESTED_UPPER_BOUNDS,
    fork_extras=FORK_EXTRAS,
    python_requires=">=3.9",
    package_data={"trl": ["templates/*.md"]},
)
