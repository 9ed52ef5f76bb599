"""Golden-equivalence runs and their comparison, for every line (``lines/<version>/tests/golden``).

Each (trainer, mode, tree) is launched once per session with the line's worker (a script that builds the line's
trainers and calls ``harness.golden_worker.main``). ``mode``: ``single`` (one plain ``python`` process) or ``ddp``
(2 gloo ranks through the line's launcher). ``tree``: ``base`` (the line's pristine TRL release) or ``fork`` (base +
the whole series), built by ``tools/prove.py``'s ``tree_for`` and selected with ``PYTHONPATH`` exactly as ``prove.py
run --tree`` does. The base and fork runs of a single-process case run side by side (one thread each, so on 2 cores
neither waits for the other). The comparisons (logged values, trained weights, saved files) are the same on every
line; what a line expects to differ is the line's own test's business.
"""

import json
import math
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .launcher import DEFAULT_TIMEOUT, REPO_ROOT, SITE_DIR, harness_env, launch, run_command


TREES = ("base", "fork")
STEPS = 3
# wall-clock figures: the only logged values that may differ between two identical runs
TIMING_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second", "eps"})
VERDICTS = {}  # (trainer, mode) -> short verdict, filled by the tests


@dataclass
class GoldenRun:
    trainer: str
    mode: str
    tree: str
    launch: object  # harness.launcher.LaunchResult
    out: Path
    result: dict  # rank 0's result.json ({} if it wrote none)

    @property
    def weights_path(self):
        return self.out / "weights.pt"


def tree_paths(line):
    """The base and fork trees of ``line`` (a TRL version), built by tools/prove.py."""
    sys.path.insert(0, str(REPO_ROOT / "tools"))
    try:
        import forkbuild
        import prove
    finally:
        sys.path.pop(0)
    return {name: prove.tree_for(name, forkbuild.get_line(line)) for name in TREES}


class GoldenRunner:
    instances = []  # for the terminal summary

    def __init__(
        self, fixtures_dir, work_dir, trees, *, worker, steps=STEPS, timeout=DEFAULT_TIMEOUT, launcher=launch
    ):
        """``worker``: the line's golden worker script; ``launcher``: ``harness.launcher.launch`` or a function with
        its signature (the 1.16.0 line's accelerate >= 1.10 launcher)."""
        GoldenRunner.instances.append(self)
        self.fixtures_dir, self.work_dir, self.trees = Path(fixtures_dir), Path(work_dir), trees
        self.steps, self.timeout = steps, timeout
        self.worker, self.launcher = Path(worker), launcher
        self.runs = {}

    def _env_extra(self, tree):
        rest = [p for p in [os.environ.get("PYTHONPATH")] if p]
        # PYTHONHASHSEED: nothing in a run may depend on Python's per-process string hashing
        return {"PYTHONPATH": os.pathsep.join([str(SITE_DIR), str(self.trees[tree]), *rest]), "PYTHONHASHSEED": "0"}

    def _launch(self, trainer, mode, tree):
        cell = self.work_dir / f"{trainer}-{mode}-{tree}"
        shutil.rmtree(cell, ignore_errors=True)
        out = cell / "out"
        args = ["--trainer", trainer, "--fixtures", str(self.fixtures_dir), "--out", str(out)]
        args += ["--steps", str(self.steps)]
        if mode == "ddp":
            result = self.launcher(
                self.worker, args, backend="ddp", workdir=cell, timeout=self.timeout, extra_env=self._env_extra(tree)
            )
        else:
            env = harness_env(None, error_dir=cell / "errors", extra=self._env_extra(tree))
            cmd = [sys.executable, str(self.worker), *args]
            result = run_command(cmd, env=env, workdir=cell, backend="single", timeout=self.timeout)
        path = out / "result.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        return GoldenRun(trainer, mode, tree, result, out, data)

    def pair(self, trainer, mode):
        """The base and fork runs of (trainer, mode): ``{"base": GoldenRun, "fork": GoldenRun}``."""
        missing = [tree for tree in TREES if (trainer, mode, tree) not in self.runs]
        if missing:
            if mode == "single":
                with ThreadPoolExecutor(len(missing)) as pool:
                    done = list(pool.map(lambda tree: self._launch(trainer, mode, tree), missing))
            else:
                done = [self._launch(trainer, mode, tree) for tree in missing]
            for run in done:
                self.runs[(trainer, mode, run.tree)] = run
        return {tree: self.runs[(trainer, mode, tree)] for tree in TREES}


def error_text(run):
    return "\n".join(filter(None, [run.result.get("error"), run.launch.failure_text()]))


def check_tree(run, trees):
    """The worker imported trl from the tree it was meant to run on."""
    info = run.result.get("trl")
    if info is None:  # the worker died before importing trl
        raise AssertionError(f"{run.tree} run wrote no trl info:\n{error_text(run)}")
    assert info["file"].startswith(str(trees[run.tree])), f"{run.tree} run imported trl from {info['file']}"
    assert (info["fixed_issues"] is None) == (run.tree == "base"), f"{run.tree} run: FIXED_ISSUES={info}"


def check_trained(run):
    run.launch.check()
    assert run.result.get("global_step") == STEPS, f"{run.tree}: {run.result.get('global_step')} steps, not {STEPS}"
    losses = [v for entry in run.result["logs"] for k, v in entry.items() if "loss" in k]
    assert losses and all(isinstance(v, (int, float)) and math.isfinite(v) for v in losses), losses


def magnitude(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        diff = abs(a - b)
        return f"|diff| {diff:.3g}" + (f", rel {diff / abs(a):.3g}" if a else "")
    return "not numbers"


def log_differences(base_logs, fork_logs, timing=TIMING_KEYS):
    """Each differing logged value, in step order, wall-clock keys (``timing``) left out:
    ``(step, key, base value, fork value)``."""
    diffs = []
    if len(base_logs) != len(fork_logs):
        diffs.append(("-", "number of log entries", len(base_logs), len(fork_logs)))
    for b, f in zip(base_logs, fork_logs):
        step = b.get("step", "?")
        for key in sorted((b.keys() | f.keys()) - timing):
            if b.get(key, "<absent>") != f.get(key, "<absent>"):
                diffs.append((step, key, b.get(key, "<absent>"), f.get(key, "<absent>")))
    return diffs


def weight_differences(base, fork):
    """Tensors whose bytes differ, sorted by name: ``(name, largest absolute difference, description)``."""
    b, f = base.result["weights"]["tensors"], fork.result["weights"]["tensors"]
    names = sorted(n for n in b.keys() | f.keys() if b.get(n) != f.get(n))
    if not names:
        return []
    import torch

    bw, fw = (torch.load(run.weights_path, weights_only=True) for run in (base, fork))
    out = []
    for name in names:
        if name not in bw or name not in fw:
            out.append((name, math.inf, "only in the " + ("base" if name in bw else "fork")))
        elif bw[name].shape != fw[name].shape or bw[name].dtype != fw[name].dtype:
            what = f"{bw[name].dtype}{tuple(bw[name].shape)} vs {fw[name].dtype}{tuple(fw[name].shape)}"
            out.append((name, math.inf, what))
        else:
            delta = (bw[name].double() - fw[name].double()).abs()
            scale = bw[name].double().abs().max().item()
            out.append(
                (
                    name,
                    delta.max().item(),
                    f"max |diff| {delta.max().item():.3g} (max |w| {scale:.3g}), {int((delta > 0).sum())} "
                    f"of {delta.numel()} elements",
                )
            )
    return out


def check_same_saved_files(base, fork, same_bytes=True):
    """The final ``save_model`` wrote the same weight files: the same tensors (names, dtypes, shapes) and, where the
    trained weights are identical (``same_bytes``), the same bytes. A base that cannot save (0.16.1's PPO under DDP)
    is not compared; the fork must save."""
    assert fork.result.get("saved"), f"the fork's final save wrote no weight file: {fork.result.get('save_error')}"
    if base.result.get("save_error") and not base.result.get("saved"):
        return
    b, f = base.result.get("saved") or {}, fork.result["saved"]
    assert sorted(b) == sorted(f), f"saved weight files differ: base {sorted(b)}, fork {sorted(f)}"
    for name in b:
        assert b[name]["tensors"] == f[name]["tensors"], f"{name}: tensors differ (names, dtypes or shapes)"
        if same_bytes:
            assert b[name]["sha256"] == f[name]["sha256"], f"{name}: bytes differ"


def write_summary(terminalreporter, title):
    """The session's golden runs as a table (trainer, mode, seconds on each tree, verdict) under ``title``."""
    runs = [run for runner in GoldenRunner.instances for run in runner.runs.values()]
    if not runs:
        return
    terminalreporter.section(title)
    terminalreporter.write_line(f"{'trainer':<18}{'mode':<8}{'base':>7}{'fork':>7}  verdict")
    for trainer, mode in sorted({(r.trainer, r.mode) for r in runs}):
        times = []
        for tree in TREES:
            run = next((r for r in runs if (r.trainer, r.mode, r.tree) == (trainer, mode, tree)), None)
            times.append(f"{run.launch.duration:>6.0f}s" if run else f"{'-':>7}")
        verdict = VERDICTS.get((trainer, mode), "not compared")
        terminalreporter.write_line(f"{trainer:<18}{mode:<8}{''.join(times)}  {verdict}")
