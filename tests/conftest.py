"""pytest wiring of the shared tests (build, recipes, demo, benchmarks, the harness's own): the harness on
``sys.path``, an offline environment and the harness's plugin (``harness.pytest_plugin``). See
``tests/harness/README.md``.
"""

import os
import sys
from pathlib import Path


TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))  # `import harness` from any test, whatever the rootdir/import mode

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")

from harness import pytest_plugin  # noqa: E402


def pytest_configure(config):
    pytest_plugin.register(config)
