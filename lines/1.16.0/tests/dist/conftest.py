"""pytest wiring of the 1.16.0 line's distributed tests: the harness on ``sys.path``, the tiny fixtures, the
per-session matrix, strict marks turned into ``KnownFailure`` (as ``harness.pytest_plugin`` does for the 0.16.1 line)
and the matrix table at the end of the run (``TRL_MATRIX_REPORT=<file>`` also writes it as markdown).
"""

import os
import re
import sys
from pathlib import Path

import pytest


HERE = Path(__file__).resolve().parent
REPO_TESTS = HERE.parents[3] / "tests"
for _path in (REPO_TESTS, HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))  # `import harness` (repo tests) and this directory's modules

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")

from harness.marks import classify  # noqa: E402


def pytest_configure(config):
    for line in (
        "dist: launches several processes with accelerate (the CPU distributed matrix)",
        "known_failure(patterns, reason): failure texts that make a strict xfail count (tests/harness/marks.py)",
    ):
        config.addinivalue_line("markers", line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A failure explained by an active `known_failure` mark becomes `KnownFailure` (see harness/marks.py)."""
    marker = item.get_closest_marker("known_failure")
    if marker is None:
        return (yield)
    try:
        return (yield)
    except Exception as exc:
        known = classify(exc, marker.kwargs["patterns"])
        if known is None:
            raise
        raise known from exc


_OUTCOMES, _REASONS = {}, {}


def pytest_runtest_logreport(report):
    name = report.nodeid.rsplit("::", 1)[-1]
    if not name.startswith("test_matrix116[") or (report.when != "call" and not report.skipped):
        return
    trainer, backend, check = name[name.index("[") + 1 : -1].split("-")
    if hasattr(report, "wasxfail"):
        issues = "+".join(f"#{i}" for i in sorted(set(re.findall(r"#(\d+)", report.wasxfail))))
        outcome = f"xfail {issues}" if report.skipped else "XPASS!"
        _REASONS[(trainer, backend, check)] = report.wasxfail
    else:
        outcome = {"passed": "pass", "failed": "FAIL", "skipped": "skip"}[report.outcome]
    _OUTCOMES[(trainer, backend, check)] = outcome


def pytest_terminal_summary(terminalreporter):
    from matrix116 import markdown, terminal

    text = terminal(_OUTCOMES)
    if not text:
        return
    terminalreporter.section("1.16.0 trainer x backend matrix (passed/checks, xf: expected failures)")
    for line in text.splitlines():
        terminalreporter.write_line(line)
    target = os.environ.get("TRL_MATRIX_REPORT")
    if target:
        Path(target).write_text(markdown(_OUTCOMES, _REASONS))
        terminalreporter.write_line(f"(the full table, with reasons and held models, written to {target})")


@pytest.fixture(scope="session")
def tiny_fixtures_dir(tmp_path_factory):
    from harness.fixtures import build_fixtures

    directory = os.environ.get("TRL_HARNESS_FIXTURES_DIR")
    directory = Path(directory) if directory else tmp_path_factory.mktemp("tiny-fixtures")
    build_fixtures(directory)
    return directory


@pytest.fixture(scope="session")
def matrix116(tiny_fixtures_dir, tmp_path_factory):
    from matrix116 import Matrix116

    return Matrix116(tiny_fixtures_dir, tmp_path_factory.mktemp("matrix116"))
