"""Golden-equivalence runs: each (trainer, mode, tree) is launched once per session (``golden_worker.py``).

``mode``: ``single`` (one plain ``python`` process) or ``ddp`` (``accelerate launch --num_processes 2``, gloo).
``tree``: ``base`` (pristine TRL 0.16.1) or ``fork`` (base + the whole series), built by ``tools/prove.py``'s
``tree_for`` and selected with ``PYTHONPATH`` exactly as ``prove.py run --tree`` does. The base and fork runs
of a single-process case run side by side (one thread each, so on 2 cores neither waits for the other).
"""

import json
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from harness.launcher import DEFAULT_TIMEOUT, REPO_ROOT, SITE_DIR, harness_env, launch, run_command


WORKER = Path(__file__).resolve().parent / "golden_worker.py"
TREES = ("base", "fork")
STEPS = 3


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


def tree_paths(line="0.16.1"):
    """The base and fork trees of ``line`` (a TRL version; default: the 0.16.1 line, whose golden runs these are),
    built by tools/prove.py."""
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
        self, fixtures_dir, work_dir, trees, *, steps=STEPS, timeout=DEFAULT_TIMEOUT, worker=WORKER, launcher=launch
    ):
        """``worker`` and ``launcher`` (``harness.launcher.launch`` or a function with its signature): another
        line's golden runs pass their own."""
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


VERDICTS = {}  # (trainer, mode) -> short verdict, filled by the tests
