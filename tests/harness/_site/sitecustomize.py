"""Start-up hook of processes launched by the test harness (``tests/harness/launcher.py``).

The launcher *prepends* this directory to ``PYTHONPATH``, so Python imports this module at start-up in the
launcher process and in every worker it spawns.  Each feature is off unless its variable is set:

- ``TRL_HARNESS_CPU_FSDP=1``      install the CPU FSDP shim (``tests/harness/cpu_shims.py``).
- ``TRL_HARNESS_DS_NO_SHM=1``     DeepSpeed on CPU without its JIT-compiled shared-memory comm op.
- ``TRL_HARNESS_ERROR_DIR=<dir>`` write the traceback of an uncaught exception to
                                  ``<dir>/traceback-rank<RANK>-<pid>.txt`` and register a faulthandler
                                  dump on SIGUSR1 (``<dir>/stacks-rank<RANK>-<pid>.txt``), which the
                                  launcher sends before it kills a launch that timed out.
- ``TRL_HARNESS_KEEP_GLOO_GROUPS=1`` never free a gloo process group object, and wait at exit until its
                                  worker threads are idle (CPU launches; see ``_keep_gloo_groups`` and
                                  ``_wait_for_idle_gloo_workers``).
- ``TRL_HARNESS_PRELOAD=<files>`` ``os.pathsep``-separated Python files executed at start-up (the demo's
                                  hook that prints where the reference model lives).

A ``sitecustomize`` that this one shadows (one later on ``sys.path``) is still executed.
"""

import os
import sys


_HERE = os.path.dirname(os.path.abspath(__file__))
_HARNESS = os.path.dirname(_HERE)


def _run_file(path, name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _chain_shadowed_sitecustomize():
    for entry in sys.path:
        try:
            if not entry or os.path.samefile(entry, _HERE):
                continue
        except OSError:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            _run_file(candidate, "_trl_harness_shadowed_sitecustomize")
            return


def _rank_tag():
    return os.environ.get("RANK", os.environ.get("LOCAL_RANK", "main"))


def _install_error_capture(directory):
    import faulthandler
    import signal
    import traceback

    os.makedirs(directory, exist_ok=True)
    tag = f"rank{_rank_tag()}-{os.getpid()}"
    previous_hook = sys.excepthook

    def excepthook(exc_type, exc, tb):
        try:
            with open(os.path.join(directory, f"traceback-{tag}.txt"), "w") as f:
                f.write(f"argv: {sys.argv}\n")
                f.write("".join(traceback.format_exception(exc_type, exc, tb)))
        except Exception:
            pass
        previous_hook(exc_type, exc, tb)

    sys.excepthook = excepthook
    if hasattr(signal, "SIGUSR1"):
        stacks = open(os.path.join(directory, f"stacks-{tag}.txt"), "w")  # noqa: SIM115 (lives with the process)
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True, chain=False)


def _keep_gloo_groups():
    """Keep every gloo process group object alive until the process exits.

    torch's ``ProcessGroupGloo`` destructor was seen not to return once the other rank had exited: on torch 2.6
    inside ``destroy_process_group()`` (about 1 launch in 5 of one test), on torch 2.13 when a finished script
    dropped its last reference to the group (the trainer's DDP model) after ``end_training()``: a rank that had
    saved its model hung at exit until the launch timed out (2 golden launches and 1 recipe launch of one
    fresh-clone CI run, 2026-11-26, with pristine TRL as with the fork). The group is still shut down as torch
    does it (``destroy_process_group`` runs unchanged); only its C++ object is never freed, so that its
    destructor cannot run after the peer left. The process exits and the OS closes the sockets. Harness only: the
    fork ships nothing of it, and GPU launches (NCCL) do not set the variable.
    """
    import ctypes

    from trl_harness_hooks import after_import

    kept = set()

    def keep(c10d):
        for group in list(getattr(c10d._world, "pg_map", {})):
            try:
                # "gloo", "cpu:gloo,cuda:nccl", or the config of a group initialized without a backend
                if id(group) not in kept and "gloo" in str(c10d.get_backend_config(group)):
                    ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))  # one reference that is never given back
                    kept.add(id(group))
            except Exception:
                pass

    def keep_at_exit(c10d):
        before = len(kept)
        keep(c10d)
        if len(kept) > before:
            print(f"[trl-harness] kept {len(kept) - before} gloo process group(s) alive at exit", file=sys.stderr)
        if kept:
            _wait_for_idle_gloo_workers()

    def patch(c10d):
        import atexit
        import functools

        destroy = c10d.destroy_process_group

        @functools.wraps(destroy)
        def destroy_process_group(*args, **kwargs):
            keep(c10d)
            return destroy(*args, **kwargs)

        c10d.destroy_process_group = destroy_process_group
        dist = sys.modules.get("torch.distributed")
        if dist is not None and getattr(dist, "destroy_process_group", None) is destroy:
            dist.destroy_process_group = destroy_process_group
        atexit.register(keep_at_exit, c10d)  # the groups a script never destroyed, before the interpreter frees them

    after_import("torch.distributed.distributed_c10d", patch)


def _native_thread_states():
    """``{thread id: state}`` (``R`` running, ``S`` sleeping, ...) of this process's threads that Python did not
    start: gloo's worker threads among them (named ``pt_gloo_runloop`` by recent torch; torch 2.6 leaves them
    unnamed)."""
    import threading

    # A thread Python did not start shows in `threading.enumerate()` as a `_DummyThread` once code it runs asked
    # `threading.current_thread()` (a gloo worker running a Python hook would): it is not Python's, and is waited for
    dummy = getattr(threading, "_DummyThread", ())
    python_threads = {t.native_id for t in threading.enumerate() if not isinstance(t, dummy)}
    states = {}
    for task in os.listdir("/proc/self/task"):
        if int(task) in python_threads:
            continue
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # a thread that ended meanwhile
        states[task] = stat[stat.rindex(")") + 2]
    return states


def _wait_for_idle_gloo_workers(limit=5.0, interval=0.05):
    """At exit, before the interpreter is torn down: wait (at most ``limit`` seconds) until no thread that Python did
    not start (gloo's workers among them) runs or waits to run, in two samples ``interval`` apart.

    A gloo worker frees the last work it ran after the caller was already told it had finished; when that work held a
    tensor that Python had referenced, freeing it needs the GIL. If the interpreter is already being torn down by
    then, taking the GIL ends the thread (``pthread_exit``) and the C++ runtime aborts the process: "terminate called
    without an active exception", SIGABRT, after the script had done all its work (seen here in 2 launches in 90
    of a 2-process script that exits right after its collectives, on a loaded CPU; 2 launches in a row of a recipe in
    a fresh-clone CI run, 2026-11-29). Sleeping here frees the GIL, so a worker that waits for it gets it now; a
    worker that was preempted before it got there is runnable (``R``) and is waited for. Linux only (the thread
    states come from ``/proc``); elsewhere it returns at once.
    """
    import time

    if not os.path.isdir("/proc/self/task"):
        return
    start = time.monotonic()
    idle_samples = 0
    while time.monotonic() - start < limit:
        time.sleep(interval)
        states = _native_thread_states()
        idle_samples = idle_samples + 1 if all(state not in "RD" for state in states.values()) else 0
        if idle_samples == 2:
            print(
                f"[trl-harness] {len(states)} native thread(s) idle at exit after {time.monotonic() - start:.2f} s",
                file=sys.stderr,
            )
            return
    print(f"[trl-harness] native thread(s) still running at exit after {limit} s", file=sys.stderr)


try:
    _chain_shadowed_sitecustomize()
except Exception as exc:  # never break interpreter start-up
    print(f"[trl-harness] shadowed sitecustomize failed: {exc!r}", file=sys.stderr)

if os.environ.get("TRL_HARNESS_ERROR_DIR"):
    _install_error_capture(os.environ["TRL_HARNESS_ERROR_DIR"])

if os.environ.get("TRL_HARNESS_KEEP_GLOO_GROUPS") == "1":
    _keep_gloo_groups()

if os.environ.get("TRL_HARNESS_CPU_FSDP") == "1" or os.environ.get("TRL_HARNESS_DS_NO_SHM") == "1":
    _run_file(os.path.join(_HARNESS, "cpu_shims.py"), "_trl_harness_cpu_shims").install_from_env()

for _i, _path in enumerate(p for p in os.environ.get("TRL_HARNESS_PRELOAD", "").split(os.pathsep) if p):
    _run_file(_path, f"_trl_harness_preload_{_i}")
