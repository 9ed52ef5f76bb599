"""The harness keeps gloo process group objects alive in the processes it launches on CPU (sitecustomize's
``TRL_HARNESS_KEEP_GLOO_GROUPS``): torch's ProcessGroupGloo destructor was seen hanging at exit once the other rank
had left. The group is still destroyed as torch does it; only its object is never freed. At exit, the process
waits until the group's worker threads are idle (a worker that frees a Python-held tensor after the interpreter's
teardown began aborts the process)."""

import _thread
import importlib.util
import json
import os
import re
import sys
import textwrap
import threading
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.launcher import free_port, harness_env, run_command  # noqa: E402


WORKER = textwrap.dedent(
    """
    import json, os, sys
    import torch.distributed as dist

    backend = os.environ["BACKEND"] or None  # None: torch picks the backend ("cpu:gloo,cuda:nccl")
    dist.init_process_group(backend, init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
    group = dist.group.WORLD
    if os.environ.get("COLLECTIVE"):
        import torch

        dist.all_reduce(torch.ones(4))
    if os.environ.get("NO_DESTROY"):
        sys.exit(0)  # the group is left to the interpreter's exit
    before = sys.getrefcount(group)
    dist.destroy_process_group()  # torch drops its own references to the group here
    print(json.dumps({"dropped": before - sys.getrefcount(group), "initialized": dist.is_initialized()}))
    """
)


def _run(tmp_path, keep, backend="gloo", destroy=True, collective=False):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    extra = {"PORT": free_port(), "BACKEND": backend, **({} if destroy else {"NO_DESTROY": "1"})}
    if collective:
        extra["COLLECTIVE"] = "1"
    env = harness_env(device="cpu", extra=extra)
    if not keep:
        env.pop("TRL_HARNESS_KEEP_GLOO_GROUPS")
    work = tmp_path / f"{'keep' if keep else 'plain'}-{backend or 'default'}-{destroy}-{collective}"
    result = run_command([sys.executable, script], env=env, workdir=work, timeout=60).check()
    return result.output


def _printed(output):
    (line,) = [line for line in output.splitlines() if line.startswith("{")]
    return json.loads(line)


@pytest.mark.dist
@pytest.mark.parametrize("backend", ["gloo", ""])
def test_cpu_launches_never_free_a_gloo_group(tmp_path, backend):
    plain = _printed(_run(tmp_path, keep=False, backend=backend))
    kept = _printed(_run(tmp_path, keep=True, backend=backend))
    assert not plain["initialized"] and not kept["initialized"]  # destroyed as torch does it
    # one reference fewer released: the harness holds one that is never given back
    assert kept["dropped"] == plain["dropped"] - 1, (plain, kept)


@pytest.mark.dist
def test_a_group_never_destroyed_is_kept_at_exit(tmp_path):
    assert "kept 1 gloo process group(s) alive at exit" in _run(tmp_path, keep=True, destroy=False)
    assert "alive at exit" not in _run(tmp_path, keep=False, destroy=False)
    assert "alive at exit" not in _run(tmp_path, keep=True)  # destroyed: kept then, nothing left at exit


NO_PROC = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the wait reads thread states in /proc")


@NO_PROC
@pytest.mark.dist
@pytest.mark.parametrize("destroy", [True, False])
def test_exit_waits_for_the_gloo_workers_to_be_idle(tmp_path, destroy):
    """The wait finds the threads Python did not start (the group's workers; none found would make it wait for
    nothing), and returns once they sleep."""
    output = _run(tmp_path, keep=True, destroy=destroy, collective=True)
    found = re.search(r"\[trl-harness\] (\d+) native thread\(s\) idle at exit after ([\d.]+) s", output)
    assert found and int(found[1]) >= 1 and float(found[2]) < 5.5, output  # found idle within the wait's limit
    assert "idle at exit" not in _run(tmp_path, keep=False, destroy=destroy, collective=True)  # not kept: no wait


@NO_PROC
def test_a_native_thread_that_ran_python_is_still_waited_for(monkeypatch):
    """A thread Python did not start is listed by `threading.enumerate()` (as a `_DummyThread`) once code it runs
    asks `threading.current_thread()`: the wait must still count it as a thread that is not Python's."""
    spec = importlib.util.spec_from_file_location(
        "_harness_site_under_test", Path(__file__).parent / "_site" / "sitecustomize.py"
    )
    site = importlib.util.module_from_spec(spec)
    for name in [name for name in os.environ if name.startswith("TRL_HARNESS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(sys, "path", [])  # no sitecustomize to chain to
    spec.loader.exec_module(site)  # without TRL_HARNESS_* variables: defines its functions, installs nothing
    started, stop, done, native_ids = threading.Event(), threading.Event(), threading.Event(), []

    def spin():
        native_ids.append(threading.current_thread().native_id)  # a _DummyThread from now on
        started.set()
        while not stop.is_set():
            pass
        done.set()

    _thread.start_new_thread(spin, ())
    try:
        assert started.wait(30)
        assert any(isinstance(t, threading._DummyThread) for t in threading.enumerate())
        assert str(native_ids[0]) in site._native_thread_states()  # listed: waited for while it runs
    finally:
        stop.set()
        done.wait(30)
