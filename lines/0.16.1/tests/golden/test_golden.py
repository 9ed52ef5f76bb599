"""Golden equivalence: with no fork option set, the fork trains exactly as TRL 0.16.1 does.

Each case (trainer x mode) runs ``golden_worker.py`` (``harness.golden``) on the pristine base and on the fork with the same seeds and
fixtures, and compares rank 0's logged values at every step (full float precision; only wall-clock figures are
left out) and the sha256 of every tensor of the trained model. ``mode``: ``single`` (one process) or ``ddp``
(2 gloo ranks through ``accelerate launch``). Bit-for-bit equality is the rule; every exception is an entry in
``DELIBERATE`` that states what differs and why, and is itself checked (a stale entry fails).

    make golden LINE=0.16.1                                              # the gate
    pytest -m golden lines/0.16.1/tests/golden -k "ppo and ddp"     # one case (the line's venv)
"""

import re
from dataclasses import dataclass

import pytest
from harness.golden import (
    VERDICTS,
    check_same_saved_files,
    check_trained,
    check_tree,
    error_text,
    log_differences,
    magnitude,
    weight_differences,
)


pytestmark = [pytest.mark.golden, pytest.mark.slow, pytest.mark.dist]

TRAINERS = ("grpo", "online_dpo_judge", "online_dpo_rm", "rloo", "ppo", "gkd", "dpo", "kto")
MODES = ("single", "ddp")


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


@pytest.mark.parametrize("trainer,mode", [(t, m) for m in MODES for t in TRAINERS], ids=lambda v: v)
def test_golden(trainer, mode, golden_runner):
    runs = golden_runner.pair(trainer, mode)
    base, fork = runs["base"], runs["fork"]
    for run in (base, fork):
        check_tree(run, golden_runner.trees)
    expected = DELIBERATE.get((trainer, mode))

    if isinstance(expected, BaseFails):
        assert not base.launch.ok, f"stale expectation: 0.16.1 now trains {trainer} under {mode} ({expected.why})"
        assert re.search(expected.match, error_text(base)), f"base failed otherwise:\n{error_text(base)}"
        check_trained(fork)
        assert fork.result.get("saved"), f"the fork's final save wrote no weight file: {fork.result.get('save_error')}"
        VERDICTS[(trainer, mode)] = f"deliberate: base fails, fork trains (patch {expected.patch})"
        return

    check_trained(base)
    check_trained(fork)
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
        lines.append(f"first differing log value: step {step}, {key}: base {b!r}, fork {f!r} ({magnitude(b, f)})")
        lines += [f"  step {s}, {k}: base {bv!r}, fork {fv!r}" for s, k, bv, fv in logs[1:12]]
    if weights:
        total = len(base.result["weights"]["tensors"])
        lines.append(f"{len(weights)} of {total} tensors differ; first: {weights[0][0]}")
        lines += [f"  {name}: {what}" for name, _, what in weights[:12]]
    where = f"step {logs[0][0]} {logs[0][1]}" if logs else f"weights {weights[0][0]}"
    VERDICTS[(trainer, mode)] = f"DIFFERS (first: {where})"
    raise AssertionError("\n".join(lines))


def _within(b, f, tolerance):
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (b, f))
    return numbers and abs(b - f) <= tolerance.log_atol + tolerance.log_rtol * abs(b)
