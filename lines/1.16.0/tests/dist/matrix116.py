"""The 1.16.0 line's trainer x backend matrix on CPU: one launch per backend, every trainer in it.

``matrix_worker.py`` trains each trainer of ``TRAINERS`` in turn inside one ``accelerate launch --num_processes 2``
per backend and writes per-trainer, per-rank JSON.  This module launches it (once per backend and session),
turns each trainer's JSON into a :class:`harness.matrix.CellRun` and runs the checks of the 0.16.1 line's matrix
(``harness.matrix``: ``trains``, ``wrapping``, ``placement``, ``frozen``) on it, with two additions:

- a trainer that failed inside the launch fails its checks with its own first error line (the launch itself
  succeeded: the worker goes on with the next trainer); one still running when the launch hit its timeout is a hang;
- ``wrapping`` of the LoRA cells (``grpo_lora``, ``online_dpo_lora``) also checks that the trained model is a
  ``PeftModel`` whose trainable parameters are the adapter only;
- ``trains`` of ``online_dpo_lora`` also checks what reached the stand-in vLLM server and the base weights after
  training (``check_vllm_sync``);
- ``saves`` (#40): ``trainer.save_model(dir)`` after training, as the ``trl`` scripts end, leaves in ``dir`` what
  ``from_pretrained`` loads (LoRA: the adapter files), equal to the trained policy (``check_saves``).
"""

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import accelerate110
from harness.marks import CellFailure
from harness.matrix import CHECK_FUNCTIONS as BASE_CHECKS
from harness.matrix import CellRun, _check_same_trl


WORKER = Path(__file__).resolve().parent / "matrix_worker.py"
TRAINERS = ("grpo", "rloo", "online_dpo", "gkd", "dpo", "kto", "grpo_lora", "online_dpo_lora")
LORA_TRAINERS = ("grpo_lora", "online_dpo_lora")
SYNC_ATOL = 1e-5  # the merge in float32: base + scale * B @ A, computed in another order than PEFT's
BACKEND_NAMES = ("ddp", "fsdp1", "fsdp2", "zero2", "zero3")
CHECKS = ("trains", "wrapping", "placement", "frozen", "saves")
STEPS = 2
LAUNCH_TIMEOUT = 300  # seconds per launch (a whole backend); the launch takes 20-40 s on 2 idle cores
LORA_MAX_TRAINABLE = 0.10  # the adapter's share of the policy's parameters (r=4 on q/v, and down: a few %)
PER_DEVICE_BATCH = 2  # prompts per rank and step (harness.fixtures.training_kwargs)
FINAL_STAGES = ("trained",)


@dataclass
class TrainerLaunch:
    """Stands in for a ``LaunchResult`` for one trainer of a launch (what ``harness.matrix`` checks read)."""

    launch: object  # the backend's LaunchResult
    trainer: str
    ranks: list

    @property
    def duration(self):
        return max((r.get("seconds") or 0 for r in self.ranks), default=0.0)

    @property
    def hung(self):
        return self.launch.timed_out and any(r.get("stage") not in FINAL_STAGES for r in self.ranks)

    @property
    def ok(self):
        if self.hung or not self.ranks:
            return False
        return all(r.get("stage") in FINAL_STAGES for r in self.ranks)

    def error_lines(self):
        lines = []
        for r in self.ranks:
            if r.get("error_line"):
                lines.append(f"rank {r['rank']}: {r['error_line']}")
        return lines

    def failure_text(self):
        if self.hung:
            stages = ", ".join(f"rank {r.get('rank')}: {r.get('stage')}" for r in self.ranks)
            return f"{self.trainer}: HANG, the launch timed out while it ran ({stages})\n{self.launch.failure_text()}"
        if not self.ranks:
            return f"{self.trainer}: never started (no rank wrote facts)\n{self.launch.failure_text()}"
        lines = self.error_lines() or [
            f"rank {r.get('rank')}: stopped at stage {r.get('stage')!r}" for r in self.ranks
        ]
        errors = [r["error"] for r in self.ranks if r.get("error")]
        return "\n".join([f"{self.trainer} failed:", *lines, *(errors[:1])])

    def check(self):
        if not self.ok:
            raise CellFailure([self.failure_text()])
        return self


@dataclass
class BackendLaunch:
    backend: str
    launch: object  # LaunchResult
    wall: float
    runs: dict = field(default_factory=dict)  # trainer -> CellRun


class Matrix116:
    """One launch per backend (cached for the session); ``run(trainer, backend)`` returns that trainer's CellRun."""

    instances = []

    def __init__(self, fixtures_dir, work_dir, *, steps=STEPS, timeout=LAUNCH_TIMEOUT, trainers=TRAINERS):
        Matrix116.instances.append(self)
        self.fixtures_dir = Path(fixtures_dir)
        self.work_dir = Path(work_dir)
        self.steps = steps
        self.timeout = timeout
        self.trainers = tuple(trainers)
        self.launches = {}

    def launch(self, backend):
        if backend not in self.launches:
            workdir = self.work_dir / backend
            shutil.rmtree(workdir, ignore_errors=True)
            out = workdir / "out"
            args = ["--fixtures", str(self.fixtures_dir), "--out", str(out), "--steps", str(self.steps)]
            args += ["--trainers", ",".join(self.trainers)]
            start = time.monotonic()
            result = accelerate110.launch(
                WORKER,
                args,
                backend=backend,
                workdir=workdir,
                timeout=self.timeout,
                extra_env={"TRL_MATRIX_BACKEND": backend},
                fresh=[out],  # a launch once more: no trainer passes on what the first launch wrote
            )
            done = BackendLaunch(backend, result, time.monotonic() - start)
            for trainer in self.trainers:
                ranks = [json.loads(p.read_text()) for p in sorted((out / trainer).glob("rank*.json"))]
                ranks.sort(key=lambda r: r.get("rank", 0))
                run = CellRun(trainer, backend, "cpu", 2, self.steps, TrainerLaunch(result, trainer, ranks), ranks)
                _check_same_trl(run)
                done.runs[trainer] = run
            self.launches[backend] = done
        return self.launches[backend]

    def run(self, trainer, backend):
        return self.launch(backend).runs[trainer]


# ----------------------------------------------------------------------------------------------- checks


def _trainer_failed(run):
    """The trainer's own failure (first error line per rank), whatever the check: nothing else can be judged."""
    if not run.launch.ok and run.launch.error_lines() and not all(r.get("frozen") for r in run.ranks):
        raise CellFailure([run.launch.failure_text()])


def check_trains(run):
    run.launch.check()
    BASE_CHECKS["trains"](run)
    if run.trainer == "online_dpo_lora":
        check_vllm_sync(run)


def check_vllm_sync(run):
    """Online DPO with LoRA through the stand-in server: only the main process talks to it, through one client; it
    connects once, and each step is one packed stream, one cache reset, one generation for every rank's prompts; the
    first sync (of the freshly wrapped policy) sends every checkpoint weight under its name, equal to the checkpoint's
    with the adapter merged; the second sends the weights without an adapter bit for bit as in the checkpoint and the
    others changed by the step; after training every rank's base weights are bit-identical to the checkpoint."""
    problems = []
    for r in run.ranks:
        facts = r.get("vllm") or {}
        if r.get("vllm_error"):
            problems.append(f"rank {r['rank']}: reading what reached the server failed: {r['vllm_error']}")
        after = r.get("base_after")
        if after is None:
            problems.append(f"rank {r['rank']}: base weights after training not read")
        elif after["changed"] or after["missing"] or not after["compared"]:
            problems.append(
                f"rank {r['rank']}: base weights after training differ from the checkpoint: {after['changed'][:4]}, "
                f"missing {after['missing'][:4]} ({after['compared']} compared)"
            )
        if r["rank"] != 0:
            if facts.get("clients"):
                problems.append(f"rank {r['rank']}: talked to the server ({facts.get('calls', [])[:4]})")
            continue
        if facts.get("clients") != 1:
            problems.append(f"rank 0: {facts.get('clients')} clients, expected one")
        wanted = [run.world_size * PER_DEVICE_BATCH, 2]
        if any(list(entry) != wanted for entry in facts.get("generated", [])):
            problems.append(f"rank 0: generated for {facts.get('generated')} (prompts, n), expected {wanted} a step")
        calls = [call for call in facts.get("calls", []) if call != "weight_update"]
        if calls[:1] != ["init_communicator"] or calls.count("init_communicator") != 1:
            problems.append(f"rank 0: expected one init_communicator first, got {calls[:4]}")
        per_step = ["update_named_params", "reset_prefix_cache", "generate"]
        if "update_named_param" in calls:
            problems.append("rank 0: one request per tensor (update_named_param), not one packed stream per sync")
        elif calls[1:] != per_step * run.steps:
            problems.append(f"rank 0: expected {per_step} per step ({run.steps} steps), got {calls[1:12]}")
        first = facts.get("first_sync")
        if first is None:
            problems.append("rank 0: no sync reached the server")
            continue
        if first["missing"] or first["extra"]:
            problems.append(f"rank 0: first sync misses {first['missing'][:4]}, has extra {first['extra'][:4]}")
        if not first["max_abs_diff"] <= SYNC_ATOL:
            problems.append(
                f"rank 0: first sync differs from the checkpoint with the adapter merged by {first['max_abs_diff']} "
                f"({first['worst']})"
            )
        second = facts.get("second_sync")
        if second is None:
            problems.append(f"rank 0: {facts.get('syncs')} syncs reached the server, expected {run.steps}")
        elif any(second.values()):
            problems.append(f"rank 0: second sync: {second}")
    if problems:
        raise CellFailure(problems)


def check_wrapping(run):
    _trainer_failed(run)
    problems = []
    try:
        BASE_CHECKS["wrapping"](run)
    except CellFailure as exc:
        problems += exc.problems
    if run.trainer in LORA_TRAINERS:
        for r in run.ranks:
            policy = r.get("policy") or {}
            if not policy.get("is_peft") or "PeftModel" not in "/".join(policy.get("wrappers", [])):
                problems.append(f"rank {r['rank']}: trained model is {policy.get('wrappers')}, expected a PeftModel")
            share = policy.get("trainable_numel", 0) / max(policy.get("numel", 0), 1)
            if not 0 < share <= LORA_MAX_TRAINABLE:
                problems.append(
                    f"rank {r['rank']}: {policy.get('trainable_numel')} of {policy.get('numel')} policy parameters "
                    f"trainable ({share:.1%}), expected the LoRA adapter only (<= {LORA_MAX_TRAINABLE:.0%})"
                )
    if problems:
        raise CellFailure(problems)


def check_placement(run):
    _trainer_failed(run)
    BASE_CHECKS["placement"](run)


def check_frozen(run):
    _trainer_failed(run)
    BASE_CHECKS["frozen"](run)


def check_saves(run):
    """``trainer.save_model(dir)`` after training, on every rank, as the ``trl`` scripts end: ``dir`` holds what
    ``from_pretrained`` loads (with LoRA: PEFT's adapter files), every parameter at its shape and equal to the trained
    policy gathered in the worker apart from ``save_model``."""
    import torch
    from safetensors.torch import load_file

    _trainer_failed(run)
    run.launch.check()
    problems = [f"rank {r['rank']}: save_model raised: {r['save_error']}" for r in run.ranks if r.get("save_error")]
    problems += [f"rank {r['rank']}: not saved: {r['save_skipped']}" for r in run.ranks if r.get("save_skipped")]
    if problems:
        raise CellFailure(problems)
    folder = Path(run.ranks[0]["saved_to"])
    expected = load_file(str(folder.parent / "expected.safetensors"))
    files = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if run.trainer in LORA_TRAINERS:
        if "adapter_model.safetensors" not in files or "adapter_config.json" not in files:
            raise CellFailure([f"{folder} holds no adapter weights: {files}"])
        saved = load_file(str(folder / "adapter_model.safetensors"))
    else:
        if not any(name.endswith(".safetensors") or name.endswith(".bin") for name in files):
            raise CellFailure([f"{folder} holds no model weights: {files}"])
        from transformers import AutoModelForCausalLM

        saved = dict(AutoModelForCausalLM.from_pretrained(folder).named_parameters())
    if sorted(saved) != sorted(expected):
        missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
        problems.append(f"{folder}: missing {missing[:4]}, unexpected {extra[:4]} ({len(saved)} tensors)")
    for name in sorted(set(saved) & set(expected)):
        if saved[name].shape != expected[name].shape or not torch.equal(saved[name].detach(), expected[name]):
            problems.append(f"{folder}: {name} is not the trained weight ({tuple(saved[name].shape)})")
    if problems:
        raise CellFailure(problems[:6])


CHECK_FUNCTIONS = {
    "trains": check_trains,
    "wrapping": check_wrapping,
    "placement": check_placement,
    "frozen": check_frozen,
    "saves": check_saves,
}


# ------------------------------------------------------------------------------------------------ report


def shares(run):
    """{frozen model: "50% / 50%"}: the share of each frozen model each rank holds."""
    out = {}
    for r in run.ranks:
        full = r.get("full_numel") or {}
        for name, facts in (r.get("frozen") or {}).items():
            out.setdefault(name, []).append(f"{facts['local_numel'] / full[name]:.0%}")
    return {name: " / ".join(values) for name, values in out.items()}


def _errors(launches):
    """``(trainer, backend, error)`` for each distinct first error line of a run (every failing rank), or its hang."""
    for done in launches:
        for trainer, run in done.runs.items():
            errors = sorted({e.split(": ", 1)[1] for e in run.launch.error_lines()})
            if run.launch.hung:
                errors = ["HANG (launch timed out while it ran)"]
            for error in errors:
                yield trainer, done.backend, error


def markdown(outcomes, reasons):
    """The matrix as markdown: ``outcomes[(trainer, backend, check)]`` ("pass", "xfail #27", "FAIL", ...),
    ``reasons[(trainer, backend, check)]``: the mark's reason of an expected failure."""
    launches = [done for m in Matrix116.instances for done in m.launches.values()]
    if not launches:
        return ""
    backends = [done.backend for done in launches]
    trainers = [t for t in TRAINERS if any(t in done.runs for done in launches)]
    lines = ["| trainer | " + " | ".join(backends) + " |", "| --- |" + " --- |" * len(backends)]
    for trainer in trainers:
        cells = []
        for done in launches:
            run = done.runs.get(trainer)
            if run is None:
                cells.append("-")
                continue
            parts = []
            for check in CHECKS:
                outcome = outcomes.get((trainer, done.backend, check), "-")
                parts.append(f"{check}: {outcome}")
            held = shares(run)
            if held:
                parts.append("held: " + ", ".join(f"{name.removesuffix('_model')} {v}" for name, v in held.items()))
            cells.append("<br>".join(parts))
        lines.append(f"| {trainer} | " + " | ".join(cells) + " |")
    lines += ["", "| backend | launch wall time | per trainer (s, rank max) |", "| --- | --- | --- |"]
    for done in launches:
        per = ", ".join(f"{t} {run.launch.duration:.1f}" for t, run in done.runs.items())
        status = "timed out" if done.launch.timed_out else f"exit {done.launch.returncode}"
        lines.append(f"| {done.backend} | {done.wall:.0f} s ({status}) | {per} |")
    failing = [f"| {trainer} | {backend} | `` {error} `` |" for trainer, backend, error in _errors(launches)]
    if failing:
        lines += ["", "| trainer | backend | first error line (every failing rank) |", "| --- | --- | --- |", *failing]
    if reasons:
        lines += ["", "| cell | expected failure (issue: reason) |", "| --- | --- |"]
        for (trainer, backend, check), reason in sorted(reasons.items()):
            lines.append(f"| {trainer}-{backend}-{check} | {reason} |")
    return "\n".join(lines) + "\n"


def terminal(outcomes, width=120):
    """The matrix for a terminal, one row per trainer and one column per backend launch: ``passed/checks``, then
    ``xf N`` (expected failures), and each failing or unexpectedly passing check by name. The full table, with the
    reasons and the models each rank held, is ``markdown``'s (``TRL_MATRIX_REPORT=<file>``)."""
    launches = [done for m in Matrix116.instances for done in m.launches.values()]
    if not launches:
        return ""
    trainers = [t for t in TRAINERS if any(t in done.runs for done in launches)]
    rows = [["trainer", *(done.backend for done in launches)]]
    for trainer in trainers:
        row = [trainer]
        for done in launches:
            if trainer not in done.runs:
                row.append("-")
                continue
            got = [outcomes.get((trainer, done.backend, check), "-") for check in CHECKS]
            cell = f"{got.count('pass')}/{len(CHECKS)}"
            expected = sum(outcome.startswith("xfail") for outcome in got)
            if expected:
                cell += f" xf {expected}"
            odd = [check for check, outcome in zip(CHECKS, got) if outcome in ("FAIL", "XPASS!")]
            if odd:
                cell += " " + ",".join(f"{check}:{got[CHECKS.index(check)]}" for check in odd)
            row.append(cell)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(
        "launch wall time: "
        + ", ".join(
            f"{done.backend} {done.wall:.0f} s"
            + ("" if done.launch.returncode == 0 else f" (exit {done.launch.returncode})")
            for done in launches
        )
    )
    lines += [f"{trainer} / {backend}: {error}"[:width] for trainer, backend, error in _errors(launches)]
    return "\n".join(lines) + "\n"
