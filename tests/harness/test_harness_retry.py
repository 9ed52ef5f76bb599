"""``run_benchmark`` runs a benchmark once more only when a rank died of the gloo abort (the message, then SIGABRT,
no Python exception from a rank); a rank's Python exception, a rank's exit code or the parent's own error is returned
at once. The benchmark here is a real ``torch.multiprocessing`` spawn of 2 ranks whose rank 1 fails, on its first
run only, as told. ``run_command`` removes what a launch names ``fresh`` before it launches once more."""

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.launcher import GLOO_ABORT, aborted_by_gloo, run_benchmark, run_command  # noqa: E402


SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch.multiprocessing as mp

    def rank(index, first, mode):
        if index == 1 and first:
            if mode == "abort":
                sys.stderr.write("GLOO_ABORT\\n")
                sys.stderr.flush()
                os.abort()
            if mode == "raise":
                raise RuntimeError("a real failure")
            if mode == "exit":
                sys.stderr.write("GLOO_ABORT\\n")
                sys.stderr.flush()
                os._exit(1)

    if __name__ == "__main__":
        counter, mode = sys.argv[1], sys.argv[2]
        with open(counter, "a") as f:
            f.write("run\\n")
        first = len(open(counter).read().split()) == 1
        if mode == "parent" and first:
            sys.stderr.write("GLOO_ABORT\\n")
            raise KeyError("the parent's own error")
        mp.start_processes(rank, args=(first, mode), nprocs=2, start_method="spawn")
        print("ok")
    """
).replace("GLOO_ABORT", GLOO_ABORT)


def _run(tmp_path, mode):
    script = tmp_path / "bench.py"
    script.write_text(SCRIPT)
    counter = tmp_path / "runs.txt"
    done = run_benchmark([sys.executable, script, counter, mode], timeout=120, cwd=tmp_path)
    return done, len(counter.read_text().split())


def test_a_gloo_abort_is_run_once_more(tmp_path):
    with pytest.warns(UserWarning, match="run once more"):
        done, runs = _run(tmp_path, "abort")
    assert (done.returncode, runs, done.stdout.strip()) == (0, 2, "ok"), done.stderr


@pytest.mark.parametrize("mode", ["raise", "exit", "parent"])
def test_other_failures_are_returned_as_they_are(tmp_path, mode):
    done, runs = _run(tmp_path, mode)
    assert (done.returncode != 0, runs) == (True, 1), done.stderr


LAUNCH = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    out, counter = Path(sys.argv[1]), Path(sys.argv[2])
    with open(counter, "a") as f:
        f.write("run\\n")
    first = len(counter.read_text().split()) == 1
    found = sorted(p.name for p in out.rglob("*")) if out.exists() else []
    (out / "trainer").mkdir(parents=True, exist_ok=True)
    (out / "trainer" / "rank0.json").write_text(json.dumps({"first": first, "found": found}))
    (out.parent / "summary.json").write_text(json.dumps({"first": first}))
    if first:
        print("GLOO_ABORT", flush=True)
        sys.exit(-6)
    """
).replace("GLOO_ABORT", GLOO_ABORT)


def test_a_launch_once_more_starts_from_fresh_results(tmp_path):
    """What the first, aborted launch wrote under ``fresh`` is gone when the second starts (a file left there would
    let a trainer the second launch never reached pass on the first one's results)."""
    script, out, counter = tmp_path / "launch.py", tmp_path / "work" / "out", tmp_path / "runs.txt"
    script.write_text(LAUNCH)
    summary = out.parent / "summary.json"
    with pytest.warns(UserWarning, match="launched once more"):
        result = run_command(
            [sys.executable, script, out, counter],
            env=dict(os.environ),
            workdir=tmp_path / "work",
            timeout=60,
            fresh=[out, summary],
        )
    assert result.ok, result.output
    assert len(counter.read_text().split()) == 2
    assert json.loads((out / "trainer" / "rank0.json").read_text()) == {"first": False, "found": []}
    assert json.loads(summary.read_text()) == {"first": False}


@pytest.mark.parametrize(
    "message, tracebacks, expected",
    [
        (GLOO_ABORT, [], True),
        (GLOO_ABORT, ["traceback-rankmain-10.txt"], True),  # the launcher's own: the failed child
        (GLOO_ABORT, ["traceback-rank1-12.txt"], False),  # a worker's Python error
        ("exitcode  : -6 (pid: 12)  (SIGABRT)", [], False),  # an abort without gloo's message
    ],
)
def test_aborted_by_gloo(tmp_path, message, tracebacks, expected):
    """What `run_command` and the demo's command run by hand start once more: gloo's message, no worker traceback."""
    for name in tracebacks:
        (tmp_path / name).write_text("Traceback (most recent call last):\n")
    assert aborted_by_gloo(f"training done\n{message}\nFatal Python error: Aborted\n", tmp_path) is expected
