"""The harness's pytest plugin, for every line's tests and the shared ones: strict marks turned into
``KnownFailure``, GPU tests skipped without CUDA, the matrix table at the end of the run, the tiny fixtures.

``tests/conftest.py`` and ``lines/0.16.1/tests/conftest.py`` put ``tests/`` on ``sys.path`` and call :func:`register`,
so that a run collecting both registers it once. The 1.16.0 line's ``tests/dist/conftest.py`` has a strict-mark hook
of its own: a ``KnownFailure`` already raised passes through this one untouched.
"""

import os
import re
import sys
from pathlib import Path

import pytest

from .marks import KnownFailure, classify


def register(config):
    """Register this plugin with ``config`` unless a conftest already did (called from ``pytest_configure``)."""
    module = sys.modules[__name__]
    if not config.pluginmanager.is_registered(module):
        config.pluginmanager.register(module, __name__)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Turn a failure explained by an active `known_failure` mark into `KnownFailure` (see harness/marks.py)."""
    marker = item.get_closest_marker("known_failure")
    if marker is None:
        return (yield)
    try:
        return (yield)
    except KnownFailure:
        raise
    except Exception as exc:
        known = classify(exc, marker.kwargs["patterns"])
        if known is None:
            raise
        raise known from exc


def pytest_collection_modifyitems(config, items):
    if any(item.get_closest_marker("gpu") for item in items):
        try:
            import torch

            has_cuda = torch.cuda.is_available()
        except ImportError:
            has_cuda = False
        if not has_cuda:
            skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible to torch on this machine)")
            for item in items:
                if item.get_closest_marker("gpu"):
                    item.add_marker(skip)


_MATRIX_OUTCOMES = {}


def pytest_runtest_logreport(report):
    """Remember each matrix check's outcome for the terminal summary."""
    name = report.nodeid.rsplit("::", 1)[-1]
    if not name.startswith(("test_matrix[", "test_matrix_gpu[")) or "[" not in name:
        return
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    parts = name[name.index("[") + 1 : -1].split("-")
    device = "cuda" if name.startswith("test_matrix_gpu[") else "cpu"
    if hasattr(report, "wasxfail"):
        issues = "+".join(sorted(set(re.findall(r"#(\d+)", report.wasxfail)))) or "lim"
        outcome = f"xf:{issues}" if report.skipped else "XPASS!"
    else:
        outcome = {"passed": "pass", "failed": "FAIL", "skipped": "skip"}[report.outcome]
    _MATRIX_OUTCOMES[(parts[-3], parts[-2], device, parts[-1])] = outcome


def pytest_terminal_summary(terminalreporter):
    from harness.matrix import summary_lines

    lines = summary_lines(_MATRIX_OUTCOMES)
    if lines:
        terminalreporter.section("trainer x backend matrix")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def tiny_fixtures_dir(tmp_path_factory):
    """Directory holding the tiny tokenizer, models and datasets (built once per session)."""
    from harness.fixtures import build_fixtures

    directory = os.environ.get("TRL_HARNESS_FIXTURES_DIR")  # reuse a prebuilt directory (debugging)
    directory = Path(directory) if directory else tmp_path_factory.mktemp("tiny-fixtures")
    build_fixtures(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_fixtures(tiny_fixtures_dir):
    """The fixtures' manifest: paths of `tokenizer`, `policy`, `reward`, `prompt_only`, `preference`, sizes."""
    from harness.fixtures import load_manifest

    return load_manifest(tiny_fixtures_dir)
