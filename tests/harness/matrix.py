"""The trainer x backend matrix: cell runner and the checks shared by the CPU and GPU matrix tests.

One launch per cell (the line's worker, ``lines/0.16.1/tests/dist/matrix_worker.py``), cached for the session; each
check reads that launch's per-rank JSON facts:

- ``trains``:    the launch succeeded; every rank did ``steps`` optimizer steps with finite losses; each
                 rank generated from its own prompts (disjoint across ranks).
- ``wrapping``:  the trained model is wrapped the way the backend wraps it (DDP, FSDP1, FSDP2,
                 DeepSpeedEngine, DataParallel) and the accelerator runs the backend's distributed type.
- ``placement``: each frozen model (reference, reward) lives on ``accelerator.device`` and, where the
                 backend shards (FSDP1/FSDP2/ZeRO-3 with N > 1 ranks), each rank holds ~1/N of it;
                 elsewhere each rank holds the full model.
- ``frozen``:    each frozen model is in eval mode and tracks no gradients.
"""

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .launcher import BACKENDS, DEFAULT_TIMEOUT, WorkerFailure, launch
from .marks import CellFailure, fixed_issues


TRAINERS = ("grpo", "online_dpo_judge", "online_dpo_rm", "rloo", "ppo")
BACKEND_NAMES = ("ddp", "fsdp1", "fsdp2", "zero2", "zero3", "dataparallel")
CHECKS = ("trains", "wrapping", "placement", "frozen")
STEPS = 2
SHARD_SLACK = 0.10  # a sharded rank may hold up to (1/N + 10%) of the full model (padding, tiny params)


@dataclass
class CellRun:
    trainer: str
    backend: str
    device: str
    world_size: int
    steps: int
    launch: object  # LaunchResult
    ranks: list = field(default_factory=list)  # per-rank JSON dicts, sorted by rank

    def failure(self, what):
        """WorkerFailure explaining that ``what`` is missing because the launch failed."""
        text = self.launch.failure_text() if not self.launch.ok else "launch succeeded"
        stages = ", ".join(f"rank {r.get('rank')}: {r.get('stage')}" for r in self.ranks) or "no rank wrote facts"
        return WorkerFailure(f"{what} not recorded ({stages})\n{text}")

    def require(self, key, what):
        if len(self.ranks) != self.world_size or any(r.get(key) is None for r in self.ranks):
            raise self.failure(what)
        return [r[key] for r in self.ranks]


class MatrixRunner:
    """Launches each (trainer, backend, device) cell once per session."""

    instances = []  # for the terminal summary (harness.pytest_plugin)

    def __init__(self, fixtures_dir, work_dir, *, worker, steps=STEPS, timeout=DEFAULT_TIMEOUT):
        """``worker``: the line's matrix worker script (one launch trains one trainer and writes its facts)."""
        MatrixRunner.instances.append(self)
        self.worker = Path(worker)
        self.fixtures_dir = Path(fixtures_dir)
        self.work_dir = Path(work_dir)
        self.steps = steps
        self.timeout = timeout
        self._runs = {}

    def run(self, trainer, backend, device="cpu", num_processes=2):
        key = (trainer, backend, device, num_processes)
        if key not in self._runs:
            world = 1 if backend == "dataparallel" else num_processes
            cell_dir = self.work_dir / f"{trainer}-{backend}-{device}{num_processes}"
            shutil.rmtree(cell_dir, ignore_errors=True)
            out = cell_dir / "out"
            args = ["--trainer", trainer, "--backend", backend, "--fixtures", str(self.fixtures_dir)]
            args += ["--out", str(out), "--steps", str(self.steps)]
            result = launch(
                self.worker,
                args,
                backend=backend,
                workdir=cell_dir,
                num_processes=num_processes,
                device=device,
                timeout=self.timeout,
            )
            ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
            ranks.sort(key=lambda r: r.get("rank", 0))
            self._runs[key] = CellRun(trainer, backend, device, world, self.steps, result, ranks)
            _check_same_trl(self._runs[key])
        return self._runs[key]


def summary_lines(outcomes):
    """One line per launched cell: launch time, each check's outcome, what each rank holds of the ref model.

    ``outcomes``: {(trainer, backend, device, check): "pass" | "xfail" | "FAIL" | "skip"}.
    """
    runs = [run for runner in MatrixRunner.instances for run in runner._runs.values()]
    if not runs:
        return []
    lines = [f"{'cell':<40}{'launch':>7}  " + "".join(f"{c:<10}" for c in CHECKS) + "ref model held per rank"]
    for run in runs:
        cells = [outcomes.get((run.trainer, run.backend, run.device, c), "-") for c in CHECKS]
        shares = []
        for r in run.ranks:
            ref = (r.get("frozen") or {}).get("ref_model")
            if ref:
                shares.append(f"{ref['local_numel'] / r['full_numel']['ref_model']:.0%}")
        name = f"{run.trainer}-{run.backend} ({run.device} x{run.world_size})"
        lines.append(
            f"{name:<40}{run.launch.duration:>6.0f}s  "
            + "".join(f"{c:<10}" for c in cells)
            + (" / ".join(shares) or "-")
        )
    return lines


def _check_same_trl(run):
    """The marks were computed from the trl the test process finds; the workers must use that one."""
    if os.environ.get("TRL_HARNESS_FIXED_ISSUES") is not None:
        return  # marks computed for a pretended set of fixes (see harness/marks.py)
    expected = sorted(fixed_issues())
    for r in run.ranks:
        info = r.get("trl") or {}
        if "fixed_issues" in info and info["fixed_issues"] != expected:
            raise AssertionError(
                f"workers imported trl from {info.get('file')} with FIXED_ISSUES={info['fixed_issues']}, but the "
                f"marks were computed for FIXED_ISSUES={expected} (test process: {sys.executable}); fix PYTHONPATH"
            )


# ----------------------------------------------------------------------------------------------- checks


def _loss_values(log_history):
    values = []
    for entry in log_history:
        for key, value in entry.items():
            if "loss" in key:
                values.append((key, value))
    return values


def check_trains(run):
    run.launch.check()
    problems = []
    if len(run.ranks) != run.world_size:
        problems.append(f"expected {run.world_size} rank reports, got {len(run.ranks)}")
    for r in run.ranks:
        rank = r.get("rank")
        if r.get("stage") != "trained":
            problems.append(f"rank {rank} stopped at stage {r.get('stage')!r}")
            continue
        if r.get("global_step") != run.steps:
            problems.append(f"rank {rank} did {r.get('global_step')} optimizer steps, expected {run.steps}")
        losses = _loss_values(r.get("log_history", []))
        if not losses:
            problems.append(f"rank {rank} logged no loss")
        bad = [(k, v) for k, v in losses if not isinstance(v, (int, float)) or not math.isfinite(v)]
        if bad:
            problems.append(f"rank {rank} logged non-finite losses: {bad[:4]}")
        if not r.get("prompts"):
            problems.append(f"rank {rank} never called generate")
    if run.world_size > 1 and not problems:
        seen = [{tuple(p) for p in r["prompts"]} for r in run.ranks]
        for i in range(len(seen)):
            for j in range(i + 1, len(seen)):
                shared = seen[i] & seen[j]
                if shared:
                    problems.append(
                        f"ranks {i} and {j} generated from {len(shared)} identical prompt(s): data not split per rank"
                    )
    if problems:
        raise CellFailure(problems)


EXPECTED_WRAPPER = {
    "ddp": ("DistributedDataParallel",),
    "fsdp1": ("FullyShardedDataParallel",),
    "fsdp2": ("FSDP",),  # fully_shard swaps the class for "FSDP<OriginalName>"
    "zero2": ("DeepSpeedEngine",),
    "zero3": ("DeepSpeedEngine",),
    "dataparallel": ("DataParallel",),
}


def expected_distributed_type(backend, device, world_size):
    family = BACKENDS[backend].family
    if family == "fsdp":
        return "FSDP"
    if family == "deepspeed":
        return "DEEPSPEED"
    if family == "dataparallel" or world_size == 1:
        return "NO"
    return "MULTI_CPU" if device == "cpu" else "MULTI_GPU"


def check_wrapping(run):
    policies = run.require("policy", "the trained model's wrapping (on_train_begin)")
    accelerators = run.require("accelerator", "the accelerator state")
    problems = []
    dist_type = expected_distributed_type(run.backend, run.device, run.world_size)
    for r, policy, acc in zip(run.ranks, policies, accelerators):
        outer = policy["wrappers"][0]
        single = run.backend == "ddp" and run.world_size == 1  # no launcher wrapper with one process
        if not single and not outer.startswith(EXPECTED_WRAPPER[run.backend]):
            problems.append(
                f"rank {r['rank']}: trained model is {'/'.join(policy['wrappers'])}, expected it wrapped in "
                f"{EXPECTED_WRAPPER[run.backend][0]} under {run.backend}"
            )
        if acc["distributed_type"] != dist_type:
            problems.append(f"rank {r['rank']}: accelerator runs {acc['distributed_type']}, expected {dist_type}")
        if acc["num_processes"] != run.world_size:
            problems.append(f"rank {r['rank']}: {acc['num_processes']} processes, expected {run.world_size}")
    if problems:
        raise CellFailure(problems)


def check_placement(run):
    frozen = run.require("frozen", "frozen-model facts (end of __init__)")
    full = run.ranks[0]["full_numel"]
    sharded = BACKENDS[run.backend].shards_params and run.world_size > 1
    problems = []
    held = {}
    for r, models in zip(run.ranks, frozen):
        for name, facts in models.items():
            n, local = full[name], facts["local_numel"]
            held[name] = held.get(name, 0) + local
            where = f"rank {r['rank']}: {name} ({'/'.join(facts['wrappers'])})"
            if not facts["on_accelerator_device"]:
                problems.append(
                    f"{where} is on {facts['devices']}, not on the accelerator device {facts['accelerator_device']}"
                )
            if sharded and local > n * (1 / run.world_size + SHARD_SLACK):
                problems.append(
                    f"{where} is not sharded: holds {local:,} of {n:,} params ({local / n:.0%}), "
                    f"expected ~1/{run.world_size} under {run.backend}"
                )
            if not sharded and local != n:
                problems.append(f"{where} holds {local:,} of {n:,} params, expected the full model")
    if sharded:
        for name, total in held.items():
            if total < full[name]:
                problems.append(f"{name}: ranks together hold {total:,} of {full[name]:,} params")
    if problems:
        raise CellFailure(problems)


def check_frozen(run):
    frozen = run.require("frozen", "frozen-model facts (end of __init__)")
    problems = []
    for r, models in zip(run.ranks, frozen):
        for name, facts in models.items():
            if facts["training"]:
                problems.append(f"rank {r['rank']}: {name} is in train mode, expected eval mode")
            if facts["requires_grad"]:
                problems.append(f"rank {r['rank']}: {name} has parameters with requires_grad=True")
    if problems:
        raise CellFailure(problems)


CHECK_FUNCTIONS = {
    "trains": check_trains,
    "wrapping": check_wrapping,
    "placement": check_placement,
    "frozen": check_frozen,
}
