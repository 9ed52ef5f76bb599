"""The upstream-suite gate's verdict (lines/0.16.1/tools/upstream_suite.py): which base-vs-fork outcomes fail it."""

import sys
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import upstream_suite  # noqa: E402
from upstream_suite import Run, compare, read_junit  # noqa: E402


REQ = ("test_a.py",)
FILES = ["test_a.py", "test_b.py"]


def run(tree, cells, returncode=0, messages=None):
    return Run(tree, returncode, 1.0, dict(cells), dict(messages or {}))


def verdict(base, fork):
    reasons, n = compare(base, fork, FILES, required=REQ)
    return reasons, n


def test_same_outcomes_pass():
    cells = {"test_a.py::T::x": "passed", "test_b.py::T::y": "skipped"}
    assert verdict(run("base", cells), run("fork", cells)) == ([], 0)


@pytest.mark.parametrize("on_fork", ["failed", "error", "skipped", None])
def test_base_pass_not_passing_on_fork_is_a_regression(on_fork):
    base = {"test_a.py::T::x": "passed", "test_a.py::T::z": "passed"}
    fork = {"test_a.py::T::x": "passed"}
    if on_fork:
        fork["test_a.py::T::z"] = on_fork
    reasons, n = verdict(run("base", base), run("fork", fork, 1, {"test_a.py::T::z": "AssertionError: boom"}))
    assert n == 1 and reasons[0].startswith("REGRESSION test_a.py::T::z")
    if on_fork in ("failed", "error"):
        assert "AssertionError: boom" in reasons[0]


def test_failing_on_both_is_not_fatal():
    cells = {"test_a.py::T::x": "passed", "test_b.py::T::y": "failed"}
    assert verdict(run("base", cells, 1), run("fork", cells, 1)) == ([], 0)


def test_new_test_failing_only_on_fork_is_fatal():
    base = {"test_a.py::T::x": "passed"}
    fork = {"test_a.py::T::x": "passed", "test_b.py::T::new": "error"}
    assert verdict(run("base", base), run("fork", fork, 1))[1] == 1


@pytest.mark.parametrize("code", [2, 3, 4, 5])
def test_pytest_not_running_is_fatal(code):
    cells = {"test_a.py::T::x": "passed"}
    assert verdict(run("base", cells), run("fork", cells, code))[1] == 1


def test_empty_runs_are_fatal():
    reasons, n = verdict(run("base", {}, 5), run("fork", {}, 5))
    assert n >= 2 and any("nothing passed" in r for r in reasons)


def test_required_file_that_only_skips_is_fatal():
    cells = {"test_a.py::T::x": "skipped", "test_b.py::T::y": "passed"}
    reasons, n = verdict(run("base", cells), run("fork", cells))
    assert n == 2 and all("test_a.py has no passing test" in r for r in reasons)


def test_read_junit(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
        <testcase classname="tests.test_a.T" name="ok" />
        <testcase classname="tests.test_a.T" name="fails"><failure message="E: x">tb</failure><system-out>o</system-out></testcase>
        <testcase classname="tests.test_a.T" name="bad"><failure message="AssertionError: no">tb</failure></testcase>
        <testcase classname="tests.test_a.T" name="bad"><error message="teardown">tb</error></testcase>
        <testcase classname="tests.test_b.T" name="sk[1]"><skipped type="pytest.skip" message="needs x" /></testcase>
        <testcase classname="tests.test_c" name="tests.test_c"><error message="collection failure">tb</error></testcase>
        </testsuite></testsuites>"""
    )
    cells, messages = read_junit(xml)
    assert cells == {
        "test_a.py::T::ok": "passed",
        "test_a.py::T::fails": "failed",
        "test_a.py::T::bad": "error",
        "test_b.py::T::sk[1]": "skipped",
        "test_c.py::tests.test_c": "error",
    }
    assert messages["test_b.py::T::sk[1]"] == "needs x"
    assert upstream_suite.fmt({"passed": 2, "failed": 1, "error": 1}) == "2 / 2 / 0"
