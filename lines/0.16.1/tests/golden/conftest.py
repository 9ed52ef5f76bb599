"""The 0.16.1 line's golden gate: the shared runner (``harness.golden.GoldenRunner``) with this line's trees and
worker, and its summary table."""

from pathlib import Path

import pytest
from harness.golden import GoldenRunner, tree_paths, write_summary


@pytest.fixture(scope="session")
def golden_runner(tiny_fixtures_dir, tmp_path_factory):
    worker = Path(__file__).resolve().parent / "golden_worker.py"
    return GoldenRunner(tiny_fixtures_dir, tmp_path_factory.mktemp("golden"), tree_paths("0.16.1"), worker=worker)


def pytest_terminal_summary(terminalreporter):
    write_summary(terminalreporter, "golden equivalence: fork vs TRL 0.16.1 on default paths")
