"""Install the TRL fork's 1.16.0 line: TRL 1.16.0 with the patch series in ``patches/`` (next to this file) applied.

    pip install "trl @ git+<this repository>#subdirectory=lines/1.16.0"

Building fetches the pinned sdist through pip, verifies its sha256, applies ``patches/series`` and packages the
result (``tools/forksetup.py`` at the repository root, shared with the 0.16.1 line). An editable install points at
this line's development tree, ``lines/1.16.0/trl-src/``.
"""

import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tools"))

from forksetup import fork_setup  # noqa: E402


# Upper bounds we have tested TRL 1.16.0 with (the newest release of each on 2026-11-26, within what 1.16.0 allows;
# vLLM keeps 1.16.0's own range). Raise a bound only after running this line's tests with the new release.
TESTED_UPPER_BOUNDS = {
    "transformers": "<5.25",
    "accelerate": "<1.16",
    "datasets": "<5.3",
    "peft": "<0.22",
    "deepspeed": "<0.20",
}
# What the fork's own test suite needs on top of upstream's `test` extra.
FORK_EXTRAS = {"test": ["pytest-timeout"]}


fork_setup(
    HERE,
    description="TRL 1.16.0 with fixes for distributed online RL training (FSDP, DeepSpeed ZeRO-3, vLLM).",
    bounds=TESTED_UPPER_BOUNDS,
    fork_extras=FORK_EXTRAS,
    python_requires=">=3.11",
    package_data={
        "trl": [
            "py.typed",
            "accelerate_configs/*.yaml",
            "templates/*.md",
            "chat_templates/*.jinja",
            "chat_templates/*.md",
        ]
    },
)
