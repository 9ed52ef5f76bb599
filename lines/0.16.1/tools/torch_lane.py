"""The torch 2.6.0 lane (#13): the fork's tests on the torch that vLLM 0.8.x pins (lines/0.16.1/docs/torch_versions.md).

    make test-torch26 LINE=0.16.1                       # creates lines/0.16.1/.venv-torch26 (torch 2.6.0), then this
    lines/0.16.1/.venv-torch26/bin/python tools/torch_lane.py [pytest args, e.g. -k fsdp1]

One pytest session, in this interpreter, over

- the build tests (``tests/build``, ``lines/0.16.1/tests/build``) without the ``slow`` tests,
- the patches' own tests (the test files the series adds or changes, inside the fork tree),
- the matrix cells of ``LANE_CELLS`` (``lines/0.16.1/tests/dist/test_matrix.py``, all four checks of each launch),

with ``PYTHONPATH`` set to the 0.16.1 line's ``build/trees/upto-NNNN`` (base + ``patches/series``, rebuilt by
``tools/prove.py`` when the series changes), so the test process and every worker that ``accelerate launch``
starts import the fork as ``patches/`` builds it: never ``trl-src/`` nor a copy installed in the venv.

Limitation, not a skip without reason: FSDP2's forward cannot run on CPU with torch 2.6, because its CPU
``Stream`` has no ``record_event`` (``foreach_all_gather`` calls it: ``AttributeError: 'Stream' object has no
attribute 'record_event'``). While the running torch lacks it, the FSDP2 matrix cells and the tests listed in
``FSDP2_FORWARD_TESTS`` are skipped with that reason; each listed pattern must match a collected test, so the
list cannot silently go stale. FSDP2 tests that run no FSDP2 forward (the weight sync's ``test_fsdp2``) still run.

A whole lane that passes, run as CI runs it (no pytest arguments, no ``PYTEST_ADDOPTS`` or ``TRL_HARNESS_*`` in the
environment), records its state in ``lines/0.16.1/patches/torch26_proven.json``: a hash of every file git tracks except the
documentation folders and the proof records (``_hashed_files``), of the torch requirement and of the Python version.
``--is-proven`` (CI, through ``make test-torch26 LANE_SKIP_IF_PROVEN=1``) exits 0 when the current state hashes to
that record, byte for byte, and the record is at most ``MAX_AGE_DAYS`` old, so that CI does not re-prove what has not
changed (13 minutes of its budget); anything else runs the whole lane again.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared build and proof tools
import forkbuild  # noqa: E402
import prove  # noqa: E402


LINE = prove.LINE = forkbuild.get_line("0.16.1")  # the lane runs the 0.16.1 line (vLLM 0.8.x's torch)


# Matrix cells (trainer, backend) the lane launches. The whole CPU matrix without FSDP2 is 25 launches of ~25 s,
# too much for the lane's CI budget (~12 min with the torch download). What it keeps:
# - every trainer under FSDP1: the series reaches into FSDP1's private internals (flat parameters, _reshard,
#   training states), and each trainer prepares its frozen models differently (reference, reward, value);
# - GRPO under DDP, ZeRO-2, ZeRO-3 and DataParallel (the harness's fast cells for those backends), and the trainers
#   with a reward model (Online DPO, RLOO, PPO) under ZeRO-3, whose frozen models go through DeepSpeed's
#   partitioned forward;
# - Online DPO with a judge under DataParallel (patch 0003's wrapped-model facts).
# Left to `make test-dist` (torch 2.13): the other trainers under DDP / ZeRO-2 / DataParallel and Online DPO with a
# judge under ZeRO-3, whose torch-facing code paths are the ones the cells above take (public DDP / DeepSpeed API).
LANE_CELLS = {
    *((trainer, "fsdp1") for trainer in ("grpo", "online_dpo_judge", "online_dpo_rm", "rloo", "ppo")),
    ("grpo", "ddp"),
    ("grpo", "zero2"),
    ("grpo", "zero3"),
    ("online_dpo_rm", "zero3"),
    ("rloo", "zero3"),
    ("ppo", "zero3"),
    ("grpo", "dataparallel"),
    ("online_dpo_judge", "dataparallel"),
}

FSDP2_REASON = (
    "limitation of the torch 2.6 lane: FSDP2 cannot run a forward on CPU with this torch "
    "(its CPU Stream lacks record_event; lines/0.16.1/docs/torch_versions.md)"
)
# The patches' tests that run an FSDP2 forward (regexes searched in the node id). Each must match a test.
FSDP2_FORWARD_TESTS = (
    *(  # fsdp_version=2
        rf"test_frozen_models\.py::PrepareFrozenModelTester::{name}_1$"
        for name in ("test_fsdp", "test_grpo_fsdp", "test_dpo_kto_bco_gkd_fsdp", "test_get_reward_fsdp")
    ),
    r"test_frozen_models\.py::PrepareFrozenModelTester::test_online_dpo_ppo_rloo_fsdp_1$",  # fsdp_version=2
    r"test_frozen_models\.py::PrepareFrozenModelTester::test_sync_ref_model_fsdp_2$",  # (2, False)
    r"test_unwrap_for_generation\.py::FSDP2GenerationTester::",
    r"test_unwrap_for_generation\.py::PolicyAndValueWrapperTester::test_fsdp2_mixed_precision$",
    r"test_frozen_models\.py::PrepareFrozenModelTester::test_fsdp2_one_process$",
    r"test_save_model_fsdp\.py::SaveModelFSDP2Tester::",  # trains under FSDP2, then saves
)

# Tests the lane leaves out, with the reason (regexes searched in the node id). Each must match a test.
NOT_IN_LANE = {
    r"test_forkbuild\.py::test_editable_install_points_at_the_development_tree$": (
        "asserts where a venv without PYTHONPATH finds trl; the lane's PYTHONPATH (the fork tree) reaches its venv; "
        "`make test` runs it"
    ),
    r"test_forkbuild\.py::test_wheel_rebuilt_from_a_stale_build_tree$": (
        "builds a wheel with the lane venv's pip, which has no `wheel` package (bdist_wheel); `make test` runs it"
    ),
}


def fsdp2_runs_on_cpu() -> bool:
    import torch

    return hasattr(torch.cpu.Stream, "record_event")


class LanePlugin:
    def __init__(self, tree: Path, patch_tests: list[Path]):
        self.tree = tree
        self.patch_tests = [str(p.resolve()) for p in patch_tests]
        self.fsdp2 = fsdp2_runs_on_cpu()
        self.budget_deselected: list[str] = []
        self.limited: list[str] = []
        self.left_out: list[str] = []
        self.start = time.monotonic()

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):
        skip_fsdp2 = pytest.mark.skip(reason=FSDP2_REASON)
        unmatched = {*FSDP2_FORWARD_TESTS, *NOT_IN_LANE}
        keep, deselected = [], []
        for item in items:
            left_out = {p for p in NOT_IN_LANE if re.search(p, item.nodeid)}
            if left_out:
                unmatched -= left_out
                deselected.append(item)
                self.left_out += [f"{item.nodeid} ({NOT_IN_LANE[p]})" for p in left_out]
                continue
            path = str(item.path.resolve())
            params = getattr(getattr(item, "callspec", None), "params", {})
            if path.endswith("tests/dist/test_matrix.py"):
                cell = (params["trainer"], params["backend"])
                if cell[1] == "fsdp2" and not self.fsdp2:
                    item.add_marker(skip_fsdp2)
                    self.limited.append(item.nodeid)
                elif cell not in LANE_CELLS:
                    deselected.append(item)
                    self.budget_deselected.append("-".join(cell))
                    continue
            elif "/tests/build/" in path and item.get_closest_marker("slow"):
                deselected.append(item)
                continue
            elif path in self.patch_tests:
                matched = {p for p in FSDP2_FORWARD_TESTS if re.search(p, item.nodeid)}
                unmatched -= matched
                if matched and not self.fsdp2:
                    item.add_marker(skip_fsdp2)
                    self.limited.append(item.nodeid)
            keep.append(item)
        if unmatched:  # runs before -k / -m deselect anything (tryfirst)
            raise pytest.UsageError(f"tools/torch_lane.py: entries that match no test: {sorted(unmatched)}")
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = keep

    def pytest_terminal_summary(self, terminalreporter):
        import torch

        write = terminalreporter.write_line
        terminalreporter.section("torch lane")
        write(f"torch {torch.__version__}, trl from {self.tree}, {time.monotonic() - self.start:.0f} s")
        write(f"matrix cells launched: {', '.join('-'.join(c) for c in sorted(LANE_CELLS))}")
        cells = sorted(set(self.budget_deselected))
        write(f"matrix cells left to `make test-dist` (torch 2.13), for the CI budget: {', '.join(cells) or 'none'}")
        for line in self.left_out:
            write(f"left out: {line}")
        if self.limited:
            write(f"skipped as the lane's FSDP2 limitation ({len(self.limited)} tests): {FSDP2_REASON}")


# Patch test files the lane runs in a pytest process of their own, after the main session. The 2-process cases of
# test_same_settings_on_every_process.py (forkserver workers) timed out (180 s) twice in fresh-clone CI on torch 2.6,
# once at the end of the lane's long session and once run apart (2026-11-26). Diagnosed with faulthandler: a worker
# that had written its report never returned from `destroy_process_group()` once the other had exited (about 1
# launch in 5 on torch 2.6); patch 0033's launcher now kills such a worker 20 s after every
# worker reported (15 of 15 launches passed on torch 2.6, one of them through the grace). Still run apart: a fresh
# interpreter, as under `make test`.
ISOLATED = ("test_same_settings_on_every_process.py",)


PROVEN = "torch26_proven.json"
PROOF_RECORDS = ("proven.json", PROVEN, "steps_proven.json")  # written by the proofs and runs: never in a state
MAX_AGE_DAYS = 7  # a record older than this runs the lane again (new releases within the line's dependency bounds)


def _hashed_files() -> list[str]:
    """Every file git tracks (or would track) in the repository, as in the working tree, except documentation
    folders and the proof records: the lane runs tests that read README.md and lines/, builds a wheel from a clone
    of the whole tree, and launches with examples/accelerate_configs."""
    return [
        rel
        for rel in forkbuild.repo_files()
        if "docs" not in rel.split("/")[:-1] and rel.rsplit("/", 1)[-1] not in PROOF_RECORDS
    ]


def lane_state(torch_requirement: str) -> str:
    """A hash of what the lane's result depends on: the files of ``_hashed_files``, the torch requirement it installs
    and the Python it runs on (major.minor)."""
    salt = f"torch-lane/2\0{torch_requirement}\0python {sys.version_info[0]}.{sys.version_info[1]}\0".encode()
    return forkbuild.files_digest(salt, [forkbuild.ROOT / rel for rel in _hashed_files()]).hexdigest()


def is_proven(torch_requirement: str) -> int:
    path = LINE.patches / PROVEN
    record = json.loads(path.read_text()) if path.is_file() else {}
    age = None
    if record.get("proven_on"):
        age = (datetime.date.today() - datetime.date.fromisoformat(record["proven_on"])).days
    if record.get("state") != lane_state(torch_requirement):
        print(f"torch lane: the state differs from lines/0.16.1/patches/{PROVEN}: running the lane")  # noqa: T201
        return 1
    if age is None or age > MAX_AGE_DAYS:
        print(f"torch lane: lines/0.16.1/patches/{PROVEN} is {age} days old (> {MAX_AGE_DAYS}): running the lane")  # noqa: T201
        return 1
    print(  # noqa: T201
        f"torch lane: skipped, byte-identical to the state it passed on {record['proven_on']} "
        f"(torch {record['torch']}, {record['summary']}, {record['seconds']} s; lines/0.16.1/patches/{PROVEN})"
    )
    return 0


def record(seconds: float, summary: str, state: str) -> None:
    import torch

    entry = {
        "state": state,
        "proven_on": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "summary": summary,
        "seconds": round(seconds),
    }
    (LINE.patches / PROVEN).write_text(json.dumps(entry, indent=1) + "\n")
    print(f"torch lane: recorded the passing state in lines/0.16.1/patches/{PROVEN}: commit it")  # noqa: T201


class _Counts:
    def __init__(self):
        self.outcomes: dict[str, int] = {}

    def pytest_terminal_summary(self, terminalreporter):
        for key in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
            self.outcomes[key] = len(terminalreporter.stats.get(key, []))


def _isolated_counts(junit: Path) -> tuple[int, int]:
    import xml.etree.ElementTree as ET

    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
    return tests - skipped - int(suite.get("failures", 0)) - int(suite.get("errors", 0)), skipped


def main(argv: list[str]) -> int:
    torch_requirement = "torch"
    if argv[:1] == ["--torch-requirement"]:
        torch_requirement, argv = argv[1], argv[2:]
    if argv[:1] == ["--is-proven"]:
        return is_proven(torch_requirement)
    # Only a run of the whole lane, as CI runs it, is recorded: no pytest arguments, no options from the environment
    altered = [k for k in os.environ if k == "PYTEST_ADDOPTS" or k.startswith("TRL_HARNESS_")]
    whole = not argv and not altered
    state_before, started = lane_state(torch_requirement), time.monotonic()
    tree = prove.tree_for("fork")
    patch_tests = forkbuild.patch_test_files(tree, LINE.patches)
    isolated = [path for path in patch_tests if path.name in ISOLATED]
    patch_tests = [path for path in patch_tests if path.name not in ISOLATED]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(tree))
    os.chdir(forkbuild.ROOT)
    own = LINE.project.relative_to(forkbuild.ROOT) / "tests"
    args = ["-p", "no:cacheprovider", "-m", "not gpu", "tests/build", str(own / "build"), *map(str, patch_tests)]
    args += [str(own / "dist" / "test_matrix.py"), "tests/harness/test_harness_teardown.py", *argv]
    counts = _Counts()
    code = pytest.main(args, plugins=[LanePlugin(tree, patch_tests), counts])
    isolated_done = []
    for path in isolated:  # own process; its exit code 5 (nothing collected) fails the lane like any other
        print(f"\n[torch lane] {path.name} in a process of its own", flush=True)
        junit = LINE.build_dir / f"torch-lane-{path.stem}.xml"
        junit.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not gpu", f"--junitxml={junit}"]
        result = subprocess.run([*command, str(path)])
        code = code or result.returncode
        if result.returncode == 0:
            passed, skipped = _isolated_counts(junit)
            isolated_done.append((path.name, passed, skipped))
    ran_isolated = len(isolated_done) == len(isolated) and all(passed for _, passed, _ in isolated_done)
    state = lane_state(torch_requirement)
    if code == 0 and whole and counts.outcomes.get("passed") and ran_isolated and state == state_before:
        done = ", ".join(f"{n} {k}" for k, n in counts.outcomes.items() if n)
        apart = "; ".join(f"{name}: {p} passed, {s} skipped" for name, p, s in isolated_done)
        record(time.monotonic() - started, f"{done}; apart: {apart}", state)
    elif code == 0 and not whole:
        print(f"torch lane: not recorded (pytest arguments or {', '.join(altered) or 'none'})")  # noqa: T201
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
