"""pytest wiring of the 0.16.1 line's tests: the repository's harness (``tests/harness``) on ``sys.path``, an
offline environment, the harness's plugin (``harness.pytest_plugin``: strict marks, GPU skips, the matrix table, the
tiny fixtures) and this line's matrix runner (``dist/matrix_worker.py``). See ``tests/harness/README.md``.
"""

import os
import sys
from pathlib import Path

import pytest


HERE = Path(__file__).resolve().parent
REPO_TESTS = HERE.parents[2] / "tests"
if str(REPO_TESTS) not in sys.path:
    sys.path.insert(0, str(REPO_TESTS))  # `import harness` from any test, whatever the rootdir/import mode

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")

from harness import pytest_plugin  # noqa: E402


def pytest_configure(config):
    pytest_plugin.register(config)


@pytest.fixture(scope="session")
def matrix_runner(tiny_fixtures_dir, tmp_path_factory):
    from harness.matrix import MatrixRunner

    return MatrixRunner(
        tiny_fixtures_dir, tmp_path_factory.mktemp("matrix"), worker=HERE / "dist" / "matrix_worker.py"
    )
