"""``run_benchmark`` runs a benchmark once more only when a rank died of the gloo abort (SIGABRT from C++, no Python
exception from a rank); a rank's Python exception or another failure is returned at once."""

import sys
import textwrap
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.launcher import GLOO_ABORT, run_benchmark  # noqa: E402


# each run appends a line to the counter file, then fails as told for its first run (MODE) and succeeds after
SCRIPT = textwrap.dedent(
    """
    import sys
    counter, mode = sys.argv[1], sys.argv[2]
    with open(counter, "a") as f:
        f.write("run\\n")
    if len(open(counter).read().split()) > 1:
        print("ok")
        sys.exit(0)
    if mode == "abort":
        sys.stderr.write("GLOO_ABORT\\ntorch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGABRT\\n")
    elif mode == "raised":
        sys.stderr.write("GLOO_ABORT\\ntorch.multiprocessing.spawn.ProcessRaisedException: -- Process 1 terminated with the following error:\\n")
    sys.exit(1)
    """
).replace("GLOO_ABORT", GLOO_ABORT)


def _run(tmp_path, mode):
    script = tmp_path / "bench.py"
    script.write_text(SCRIPT)
    counter = tmp_path / "runs.txt"
    done = run_benchmark([sys.executable, script, counter, mode], timeout=60, cwd=tmp_path)
    return done, len(counter.read_text().split())


def test_a_gloo_abort_is_run_once_more(tmp_path):
    with pytest.warns(UserWarning, match="run once more"):
        done, runs = _run(tmp_path, "abort")
    assert (done.returncode, runs, done.stdout.strip()) == (0, 2, "ok")


@pytest.mark.parametrize("mode", ["raised", "other"])
def test_other_failures_are_returned_as_they_are(tmp_path, mode):
    done, runs = _run(tmp_path, mode)
    assert (done.returncode, runs) == (1, 1)
