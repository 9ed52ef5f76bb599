"""Golden equivalence: with no fork option set, the fork trains exactly as TRL 0.16.1 does.

Each case (trainer x mode) runs ``golden_worker.py`` on the pristine base and on the fork with the same seeds and
fixtures, and compares rank 0's logged values at every step (full float precision; only wall-clock figures are
left out) and the sha256 of every tensor of the trained model. ``mode``: ``single`` (one process) or ``ddp``
(2 gloo ranks through ``accelerate launch``). Bit-for-bit equality is the rule; every exception is an entry in
``DELIBERATE`` that states what differs and why, and is itself checked (a stale entry fails).

    pytest -m golden tests/golden                      # the gate (make golden)
    pytest -m golden tests/golden -k "ppo and ddp"     # one case
"""

import math
import re
from dataclasses import dataclass

import pytest
from golden_runs import STEPS, VERDICTS


pytestmark = [pytest.mark.golden, pytest.mark.slow, pytest.mark.dist]

TRAINERS = ("grpo", "online_dpo_judge", "online_dpo_rm", "rloo", "ppo", "gkd", "dpo", "kto")
MODES = ("single", "ddp")
# wall-clock figures: the only logged values that may differ between two identical runs
TIMING_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second", "eps"})


@dataclass(frozen=True)
class BaseFails:
    """0.16.1 cannot run this case at all (the bug a patch fixes): the base must fail with ``match``, the fork
    must train; there is nothing on the base to compare the fork's numbers with."""

    patch: str
    match: str
    why: str


_ONLINE_DPO_DDP = BaseFails(
    patch="0003",
    match=r"AttributeError: 'DistributedDataParallel' object has no attribute 'config'",
    why="0.16.1's OnlineDPOTrainer reads model.config on the DDP-wrapped model while training; the fork caches the "
    "model facts it needs before wrapping",
)


@dataclass(frozen=True)
class NotReproducible:
    """Two runs of the same tree already differ in float rounding, so bit-for-bit equality cannot be asked of the
    fork: every logged number must be within ``log_atol + log_rtol * |base|`` of the base's and every weight within
    ``weight_atol``; anything else (keys, steps, non-numbers) must be equal."""

    log_atol: float
    log_rtol: float
    weight_atol: float
    why: str


# Measured on the 2-core CPU machine: 3 runs of RLOO (single process) on the pristine base gave 3 different weights
# (largest differences across runs of base and fork: logs 6e-7 absolute, weights 2.2e-6); GRPO, Online DPO, GKD, DPO
# and KTO reproduced bit for bit in every run. The source (in the rollout code that RLOO and PPO share) is not
# pinned yet; the tolerances are ~20x the measured spread, far below a real change of behaviour.
_ROLLOUT_NOISE = NotReproducible(
    log_atol=1e-5,
    log_rtol=1e-4,
    weight_atol=5e-5,
    why="RLOO and PPO are not bit-reproducible on CPU run to run, on the pristine base as on the fork",
)
TOLERANCES = {(t, m): _ROLLOUT_NOISE for t in ("rloo", "ppo") for m in ("single", "ddp")}

DELIBERATE = {
    ("online_dpo_judge", "ddp"): _ONLINE_DPO_DDP,
    ("online_dpo_rm", "ddp"): _ONLINE_DPO_DDP,
}


def _error_text(run):
    return "\n".join(filter(None, [run.result.get("error"), run.launch.failure_text()]))


def _check_tree(run, trees):
    """The worker imported trl from the tree it was meant to run on."""
    info = run.result.get("trl")
    if info is None:  # the worker died before importing trl
        raise AssertionError(f"{run.tree} run wrote no trl info:\n{_error_text(run)}")
    assert info["file"].startswith(str(trees[run.tree])), f"{run.tree} run imported trl from {info['file']}"
    assert (info["fixed_issues"] is None) == (run.tree == "base"), f"{run.tree} run: FIXED_ISSUES={info}"


def _check_trained(run):
    run.launch.check()
    assert run.result.get("global_step") == STEPS, f"{run.tree}: {run.result.get('global_step')} steps, not {STEPS}"
    losses = [v for entry in run.result["logs"] for k, v in entry.items() if "loss" in k]
    assert losses and all(isinstance(v, (int, float)) and math.isfinite(v) for v in losses), losses


def _magnitude(a, b):
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


@pytest.mark.parametrize("trainer,mode", [(t, m) for m in MODES for t in TRAINERS], ids=lambda v: v)
def test_golden(trainer, mode, golden_runner):
    runs = golden_runner.pair(trainer, mode)
    base, fork = runs["base"], runs["fork"]
    for run in (base, fork):
        _check_tree(run, golden_runner.trees)
    expected = DELIBERATE.get((trainer, mode))

    if isinstance(expected, BaseFails):
        assert not base.launch.ok, f"stale expectation: 0.16.1 now trains {trainer} under {mode} ({expected.why})"
        assert re.search(expected.match, _error_text(base)), f"base failed otherwise:\n{_error_text(base)}"
        _check_trained(fork)
        assert fork.result.get("saved"), f"the fork's final save wrote no weight file: {fork.result.get('save_error')}"
        VERDICTS[(trainer, mode)] = f"deliberate: base fails, fork trains (patch {expected.patch})"
        return

    _check_trained(base)
    _check_trained(fork)
    logs = log_differences(base.result["logs"], fork.result["logs"])
    weights = weight_differences(base, fork)
    tolerance = TOLERANCES.get((trainer, mode))
    if tolerance is not None and (logs or weights):
        too_far = [d for d in logs if not _within(d[2], d[3], tolerance)]
        too_far_w = [w for w in weights if not w[1] <= tolerance.weight_atol]
        if not too_far and not too_far_w:
            check_same_saved_files(base, fork, same_bytes=False)
            worst_log = max((abs(b - f) for _, _, b, f in logs), default=0.0)
            worst_w = max((w[1] for w in weights), default=0.0)
            VERDICTS[(trainer, mode)] = (
                f"within tolerance (not reproducible run to run): logs |diff| <= {worst_log:.2g}, "
                f"weights <= {worst_w:.2g}"
            )
            return
        logs, weights = too_far, too_far_w
    if not logs and not weights:
        assert base.result["weights"]["sha256"] == fork.result["weights"]["sha256"]
        check_same_saved_files(base, fork)
        VERDICTS[(trainer, mode)] = "identical (losses, metrics, weights, saved files)"
        return
    beyond = f" beyond its tolerance ({tolerance.why})" if tolerance else ""
    lines = [f"{trainer} under {mode}: the fork differs from TRL 0.16.1 on a default path{beyond}"]
    if logs:
        step, key, b, f = logs[0]
        lines.append(f"first differing log value: step {step}, {key}: base {b!r}, fork {f!r} ({_magnitude(b, f)})")
        lines += [f"  step {s}, {k}: base {bv!r}, fork {fv!r}" for s, k, bv, fv in logs[1:12]]
    if weights:
        total = len(base.result["weights"]["tensors"])
        lines.append(f"{len(weights)} of {total} tensors differ; first: {weights[0][0]}")
        lines += [f"  {name}: {what}" for name, _, what in weights[:12]]
    where = f"step {logs[0][0]} {logs[0][1]}" if logs else f"weights {weights[0][0]}"
    VERDICTS[(trainer, mode)] = f"DIFFERS (first: {where})"
    raise AssertionError("\n".join(lines))


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


def _within(b, f, tolerance):
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (b, f))
    return numbers and abs(b - f) <= tolerance.log_atol + tolerance.log_rtol * abs(b)
