"""Run TRL 0.16.1's own test suite (the sdist's ``tests/``) on the pristine base and on the fork; compare.

    python tools/upstream_suite.py                      # the default files, base then fork, table + verdict
    python tools/upstream_suite.py --files test_cli.py  # a selection (names in the base's tests/)
    python tools/upstream_suite.py -- -k "not peft"     # extra pytest arguments for both runs

The test files are the pristine base's ``tests/`` (``build/trees/base/tests``): the same upstream files run on
both trees, copied into a scratch directory (``from tests.testing_utils import ...`` resolves there), with
``PYTHONPATH`` selecting the tree's ``trl`` as ``tools/prove.py`` does. The patches' own new test files are not
part of this gate. ``lines/0.16.1/tests/upstream/upstream_offline.py`` (loaded with ``-p``) maps the hub ids the
tests load to tiny local models, a tokenizer with a chat template and a synthetic ``trl-internal-testing/zen``; it is
built once here and shared by both runs.

Exit status: 0 when every test that passes on the base passes on the fork; 1 when one fails, errors or is missing
on the fork (a regression), when nothing ran, when pytest could not run (exit 2-5), or when a required file
(``REQUIRED``) has no passing test on a tree. A test failing on both trees is listed but not fatal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared build and proof tools
import forkbuild  # noqa: E402
import prove  # noqa: E402


# the offline plugin, in the 0.16.1 line's tests (TRL 0.16.1's own suite is that line's gate)
PLUGIN_DIR = forkbuild.get_line("0.16.1").project / "tests" / "upstream"

# The files of the trainers and helpers the series touches: each must run (some passing test) on both trees.
REQUIRED = (
    "test_grpo_trainer.py",
    "test_online_dpo_trainer.py",
    "test_nash_md_trainer.py",
    "test_xpo_trainer.py",
    "test_rloo_trainer.py",
    "test_ppo_trainer.py",
    "test_gkd_trainer.py",
    "test_kto_trainer.py",
    "test_bco_trainer.py",
    "test_dpo_trainer.py",
    "test_utils.py",
    "test_callbacks.py",
    "test_cli.py",
)
# Cheap upstream files that also run by default (the rest of the sdist's suite: --files all).
EXTRA = (
    "test_cli_utils.py",
    "test_collators.py",
    "test_core.py",
    "test_data_utils.py",
    "test_modeling_geometric_mixture_wrapper.py",
    "test_modeling_value_head.py",
    "test_rich_progress_callback.py",
    "test_trainers_args.py",
)
FAILED = ("failed", "error")
# Deselected from the default run (time budget); each still runs with --files/--all-tests. Reason next to each.
DESELECTED = {
    "test_grpo_trainer.py::GRPOTrainerTester::test_training_torch_compile": (
        "torch.compile of the policy: ~3 min of compilation on 2 CPU cores whatever the model size; the GRPO "
        "training path it then runs is the one test_training covers"
    ),
}


@dataclass
class Run:
    tree: str
    returncode: int
    seconds: float
    cells: dict[str, str] = field(default_factory=dict)  # "file::Class::test" -> passed/failed/error/skipped
    messages: dict[str, str] = field(default_factory=dict)  # failures' first lines

    def counts(self, file: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, result in self.cells.items():
            if name.split("::", 1)[0] == file:
                out[result] = out.get(result, 0) + 1
        return out


def read_junit(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    cells, messages = {}, {}
    for classname, case_name, result, message in prove.junit_cases(path):
        parts = classname.split(".")
        # classname "tests.test_x.Class" (or "tests.test_x" for a module-level test / a collection error)
        module = next((p for p in parts if p.startswith("test_")), parts[-1] if parts else "?")
        rest = parts[parts.index(module) + 1 :] if module in parts else []
        name = "::".join([f"{module}.py", *rest, case_name])
        if result == "xfailed":  # this gate counts an expected failure as a skip
            result = "skipped"
        # a test that failed in its call and errored in teardown is reported twice: keep the worst
        if cells.get(name) in FAILED and result not in FAILED:
            continue
        cells[name] = result
        if message:
            messages[name] = message
    return cells, messages


def run_tree(tree_name: str, tree: Path, workdir: Path, files: list[str], extra: list[str], hub: Path) -> Run:
    junit = workdir / f"junit-{tree_name}.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), str(PLUGIN_DIR), env.get("PYTHONPATH")]))
    env["TRL_UPSTREAM_HUB_DIR"] = str(hub)
    env.setdefault("HF_HUB_OFFLINE", "1")
    if "-n" in extra:  # one torch thread per xdist worker: the workers share the cores
        env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "upstream_offline",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfEs",
        "--no-header",
        "-W",
        "ignore::DeprecationWarning",
        f"--junitxml={junit}",
        *[f"tests/{name}" for name in files],
        *extra,
    ]
    print(f"[upstream-suite] {tree_name}: {tree}", flush=True)
    start = time.monotonic()
    returncode = subprocess.run(command, env=env, cwd=workdir).returncode
    seconds = time.monotonic() - start
    cells, messages = read_junit(junit)
    print(f"[upstream-suite] {tree_name}: pytest exit {returncode}, {len(cells)} tests, {seconds:.0f} s", flush=True)
    return Run(tree_name, returncode, seconds, cells, messages)


def fmt(counts: dict[str, int]) -> str:
    return (
        f"{counts.get('passed', 0)} / {counts.get('failed', 0) + counts.get('error', 0)} / {counts.get('skipped', 0)}"
    )


def compare(base: Run, fork: Run, files: list[str], required: tuple[str, ...] = REQUIRED) -> tuple[list[str], int]:
    """Print the per-file table and the findings; return (the lines of the reasons to fail, number of them)."""
    rows = [("file", "base p / f / s", "fork p / f / s", "regressions")]
    regressions = sorted(
        name for name, result in base.cells.items() if result == "passed" and fork.cells.get(name) != "passed"
    )
    for file in files:
        mine = [r for r in regressions if r.split("::", 1)[0] == file]
        rows.append((file, fmt(base.counts(file)), fmt(fork.counts(file)), str(len(mine)) if mine else "-"))
    total = ("total", fmt(_total(base)), fmt(_total(fork)), str(len(regressions)) if regressions else "-")
    widths = [max(len(row[i]) for row in [*rows, total]) for i in range(4)]
    print("\nTRL 0.16.1's own tests (p / f / s = passed / failed or error / skipped): pristine base vs fork")
    for row in [rows[0], tuple("-" * w for w in widths), *rows[1:], tuple("-" * w for w in widths), total]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    print(f"time: base {base.seconds:.0f} s, fork {fork.seconds:.0f} s")

    reasons = []
    for name in regressions:
        got = fork.cells.get(name, "missing")
        text = f"REGRESSION {name}: passes on the base, {got} on the fork"
        if fork.messages.get(name):
            text += "\n    " + fork.messages[name].splitlines()[0][:400]
        reasons.append(text)
    both = sorted(n for n, r in base.cells.items() if r in FAILED and fork.cells.get(n) in FAILED)
    fixed = sorted(n for n, r in base.cells.items() if r in FAILED and fork.cells.get(n) == "passed")
    new_fail = sorted(n for n, r in fork.cells.items() if r in FAILED and n not in base.cells)
    for run in (base, fork):
        if run.returncode not in (0, 1):
            reasons.append(f"pytest on the {run.tree} exited {run.returncode} (interrupted, usage error or no tests)")
        if not any(r == "passed" for r in run.cells.values()):
            reasons.append(f"nothing passed on the {run.tree}: the gate ran nothing")
        for file in required:
            if file in files and not run.counts(file).get("passed"):
                reasons.append(f"{file} has no passing test on the {run.tree}: a required file must run")
    reasons += [f"FAILS ON THE FORK ONLY (not on the base's list) {n}" for n in new_fail]

    if both:
        print(f"\nfailing on both trees (not fatal): {len(both)}")
        for name in both:
            print(f"  {name}: {base.messages.get(name, '').splitlines()[0][:200] if base.messages.get(name) else ''}")
    if fixed:
        print(f"\nfailing on the base, passing on the fork: {len(fixed)}")
        for name in fixed:
            print(f"  {name}")
    return reasons, len(reasons)


def _total(run: Run) -> dict[str, int]:
    out: dict[str, int] = {}
    for result in run.cells.values():
        out[result] = out.get(result, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="+", help="test files in the base's tests/ ('all' = every test_*.py)")
    parser.add_argument("--keep", type=Path, help="keep the scratch directory (junit xml, hub) here")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="pytest-xdist workers per tree (default: 2)")
    parser.add_argument("--all-tests", action="store_true", help="do not deselect DESELECTED")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: extra pytest arguments")
    args = parser.parse_args(argv)
    extra = [a for a in args.pytest_args if a != "--"]
    if args.jobs > 1:
        extra = ["-n", str(args.jobs), "--dist", "load", *extra]
    if not args.all_tests:
        extra = [f"--deselect=tests/{node}" for node in DESELECTED] + extra
    try:
        line = forkbuild.get_line("0.16.1")  # TRL 0.16.1's own suite: the 0.16.1 line's trees
        base_tree, fork_tree = prove.tree_for("base", line), prove.tree_for("fork", line)
    except forkbuild.BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    upstream_tests = base_tree / "tests"
    available = sorted(p.name for p in upstream_tests.glob("test_*.py"))
    files = list(args.files or [*REQUIRED, *EXTRA])
    if files == ["all"]:
        files = available
    unknown = [f for f in files if f not in available]
    if unknown:
        print(f"error: not in the base's tests/: {unknown}", file=sys.stderr)
        return 1

    workdir = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="trl-upstream-suite-"))
    try:
        shutil.rmtree(workdir / "tests", ignore_errors=True)
        workdir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(upstream_tests, workdir / "tests")  # the pristine files only, for both trees
        # upstream's tests/ is a package (`from .testing_utils import ...`); the sdist leaves out its empty
        # __init__.py, which the repository has
        (workdir / "tests" / "__init__.py").touch()
        hub = workdir / "hub"
        env = dict(os.environ, TRL_UPSTREAM_HUB_DIR=str(hub), PYTHONPATH=str(PLUGIN_DIR))
        build = (
            "import shutil, upstream_offline as u; m = u.build(u.HUB_ROOT); shutil.rmtree(u.SCRATCH); "
            'print(f\'[upstream-suite] fixtures: {len(m["models"])} models, zen, {m["seconds"]:.1f} s\')'
        )
        subprocess.run([sys.executable, "-c", build], env=env, check=True)
        base = run_tree("base", base_tree, workdir, files, extra, hub)
        fork = run_tree("fork", fork_tree, workdir, files, extra, hub)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    reasons, n = compare(base, fork, files)
    print()
    for line in reasons:
        print(line)
    print("result:", "FAIL" if n else "OK: every test that passes on TRL 0.16.1 passes on the fork")
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
