"""The 1.16.0 line's golden runs: the shared runner (``harness.golden.GoldenRunner``) with this line's trees, worker
and accelerate >= 1.10 launcher (``tests/harness/accelerate110.py``)."""

import os
import sys
from pathlib import Path

import pytest


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))  # import harness
for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")

from harness import accelerate110  # noqa: E402
from harness.fixtures import build_fixtures  # noqa: E402
from harness.golden import GoldenRunner, tree_paths  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "golden: fork vs the line's pristine base on default paths (tests/golden)")


@pytest.fixture(scope="session")
def golden_runner(tmp_path_factory):
    fixtures = tmp_path_factory.mktemp("fixtures")
    build_fixtures(fixtures)
    return GoldenRunner(
        fixtures,
        tmp_path_factory.mktemp("golden"),
        tree_paths("1.16.0"),
        worker=HERE / "golden_worker_116.py",
        launcher=accelerate110.launch,
    )
