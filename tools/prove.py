"""Run tests against the pristine base and against the fork, to show what each patch fixes.

    python tools/prove.py --line 0.16.1 run --tree base -- lines/0.16.1/tests/dist -k grpo   # any selection, base
    python tools/prove.py --line 0.16.1 run --tree fork -- lines/0.16.1/tests/dist -k grpo   # base + the series
    python tools/prove.py run --tree 3 -- ...                      # base + the first 3 patches
    python tools/prove.py table [--matrix]                         # every patch: its tests before and after
    python tools/prove.py --line 1.16.0 table                      # the same for another line of the fork
    python tools/prove.py table --skip-if-proven                   # CI: skip when the record says it was proven

Trees are materialized from ``patches/`` into ``build/trees/`` (rebuilt when the series changes) and selected
with ``PYTHONPATH``, which also reaches the workers that ``accelerate launch`` starts; the installed ``trl`` is
never touched. The table runs each patch's own tests (the test classes and methods its diff adds under ``tests/``;
every test of a file it changes without adding tests to it) on the series before that patch (the pristine base
for the first), where at least one must fail (that run stops at the first failure), and on the series up to that
patch, where all must pass.
``--matrix`` also runs the line's distributed matrix (``lines/<version>/tests/dist``) on the pristine base and on
the whole series and lists the cells that flip.

A table that proves every patch records the proven state in the line's ``patches/proven.json``: a hash of what the
proof depends on (the pinned base, the series and every patch's diff with its tests and its ``Test-Needs:``, the
line's dependency bounds, and the revisions of the way trees are built and patches proven), and the same hash per
patch over the series up to it. Commit it with the patches. ``--skip-if-proven`` (CI) skips the proof when the current
state hashes to the recorded one, byte for byte; otherwise it proves every patch whose own state differs from its
record (a changed patch and every patch after it) and carries the others over: any change to a patch's code or tests
is always proven again; a change to its description alone (the PR's text) is not what the proof tested.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import forkbuild  # noqa: E402


LINE = forkbuild.get_line()  # set by --line


def tree_for(selector: str, line: forkbuild.Line | None = None) -> Path:
    """``base`` (pristine, no fork info), ``fork`` (whole series) or a number of patches, of ``line`` (default: the
    line given with ``--line``)."""
    line = line or LINE
    series = forkbuild.read_series(line.patches)
    upto = {"base": 0, "fork": len(series)}.get(selector)
    if upto is None:
        upto = int(selector)
        if not 0 <= upto <= len(series):
            raise SystemExit(f"error: --tree {selector}: the series has {len(series)} patches")
    trees = line.build_dir / "trees"
    return forkbuild.build_tree(line.patches, trees / ("base" if upto == 0 else f"upto-{upto:04d}"), upto=upto)


def logs_dir() -> Path:
    return LINE.build_dir / "prove-logs"


PROVEN = "proven.json"
# 2: names relative to the line's project (a line can move in the repository) and the line's pins read from its
# setup.py (forkbuild.line_pins) instead of the file's bytes; 3: the pins are the whole setup.py's syntax tree but its
# docstring and the statement that finds the build tools.
PROOF_REVISION = "4"  # 4: of a patch file, only what the proof reads (proven_content)


def proven_content(patch_file: Path) -> bytes:
    """What the proof of a patch reads of its file: the diff (from its first ``diff --git`` line: the code and the
    tests) and the ``Test-Needs:`` trailers (the Python its tests run with). Not the rest of its description (the
    PR's text, its other trailers, the commit id on its first line): a change to that alone leaves the proof
    standing, as `test_proof_record_is_skipped_only_for_the_identical_state` checks."""
    data = patch_file.read_bytes()
    start = data.find(b"\ndiff --git ")
    needs = ",".join(sorted(forkbuild.patch_test_needs(patch_file)))
    return f"Test-Needs: {needs}\n".encode() + (data[start + 1 :] if start >= 0 else data)


def _salted_digest(line: forkbuild.Line, *paths: Path):
    """A sha256 salted with the revisions of tree building and proving, fed with each path's name (relative to the
    line's project) and content (of a patch, its :func:`proven_content`; of any other file, its bytes), then with
    the line's pins."""
    digest = hashlib.sha256(f"{forkbuild.TOOL_REVISION}/{PROOF_REVISION}".encode())
    for path in paths:
        content = proven_content(path) if path.suffix == ".patch" else path.read_bytes()
        digest.update(path.relative_to(line.project).as_posix().encode() + b"\0" + content + b"\0")
    digest.update(forkbuild.line_pins(line.project).encode() + b"\0")
    return digest


def proof_state(line: forkbuild.Line | None = None) -> str:
    """A hash of everything the proof of the line depends on: the pinned base, the series, every patch (its tests
    are inside it), the line's pins in its setup.py (dependency bounds, extras, Python) and the revision of the way
    trees are built (``forkbuild.TOOL_REVISION``). Bump ``PROOF_REVISION`` when the way patches are proven changes."""
    line = line or LINE
    patches = [line.patches / name for name in forkbuild.read_series(line.patches)]
    return _salted_digest(line, line.patches / "base.json", line.patches / "series", *patches).hexdigest()


def patch_states(line: forkbuild.Line | None = None) -> dict[str, str]:
    """Per patch, a hash of what the proof of that patch alone depends on: the pinned base, the line's pins, the
    revisions, and every patch of the series up to it, in order (the tree before it and the tree with it). A change
    to a patch changes its state and those of the patches after it, never those before it."""
    line = line or LINE
    digest = _salted_digest(line, line.patches / "base.json")
    states = {}
    for name in forkbuild.read_series(line.patches):
        digest.update(name.encode() + b"\0" + proven_content(line.patches / name) + b"\0")
        states[name] = digest.copy().hexdigest()
    return states


def carry_over(revision: str) -> int:
    """Re-key the line's record after a change to the way states are computed (``PROOF_REVISION``), or a move of the
    line in the repository: ``revision`` (a commit whose record is the current one) must be proven by its own
    tools, and the line's base, series, patches (what the proof reads of them) and pins must be byte-identical there
    and here. Then the record's proof stands, and only its hashes are recomputed; anything else fails and the line is
    proven again."""
    record = recorded_proof()
    resolved = subprocess.run(
        ["git", "-C", str(forkbuild.ROOT), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if resolved.returncode != 0:
        print(f"error: carry-over: {revision!r} is not a commit of this repository", file=sys.stderr)
        return 1
    commit = resolved.stdout.strip()
    kept = ("state", "patch_states", "carried_over")  # what a carry-over rewrites; the rest must be the same record
    with tempfile.TemporaryDirectory(prefix="trl-carry-") as tmp:
        then_root = Path(tmp) / "tree"
        then_root.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(forkbuild.ROOT), "archive", commit], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(then_root)], input=archive.stdout, check=True)
        then = then_root / "lines" / LINE.name
        if not (then / "patches" / "base.json").is_file():
            then = then_root  # the layout before every line had its folder: the root was the 0.16.1 line
        record_path = then / "patches" / PROVEN
        old_record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        script = (
            "import json, sys; sys.path.insert(0, 'tools'); import forkbuild, prove; "
            f"prove.LINE = forkbuild.get_line({LINE.name!r}); print(json.dumps(prove.proof_state()))"
        )
        computed = subprocess.run([sys.executable, "-c", script], cwd=then_root, capture_output=True, text=True)
        problems = []
        if computed.returncode != 0:
            problems.append(f"the tools of {revision} cannot compute its state: {computed.stderr.strip()[-300:]}")
        elif not old_record or old_record.get("state") != json.loads(computed.stdout):
            problems.append(f"{revision} is not proven by its own record")
        if {k: v for k, v in old_record.items() if k not in kept} != {
            k: v for k, v in record.items() if k not in kept
        }:
            problems.append(f"the record here is not the one of {revision}")
        if (then / "patches" / "base.json").is_file() and proof_state(
            forkbuild.Line(LINE.name, then)
        ) != proof_state():
            problems.append(f"the base, series, patches or pins differ between {revision} and here")
    if problems:
        print(f"[prove] {LINE.name} line: not carried over: {'; '.join(problems)}", file=sys.stderr)
        return 1
    commit = commit[:12]
    record.update(state=proof_state(), patch_states=patch_states())
    record["carried_over"] = {"from": commit, "on": datetime.date.today().isoformat()}
    (LINE.patches / PROVEN).write_text(json.dumps(record, indent=1) + "\n")
    print(f"[prove] {LINE.name} line: the proof of {commit} carried over (same content, new hashes): commit it")
    return 0


def recorded_proof() -> dict:
    path = LINE.patches / PROVEN
    return json.loads(path.read_text()) if path.is_file() else {}


def record_proof(seconds: float, n_patches: int, reproven: int | None = None) -> None:
    import torch

    record = {
        "state": proof_state(),
        "patches": n_patches,
        "patch_states": patch_states(),
        "proven_on": datetime.date.today().isoformat(),
        "seconds": round(seconds),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if reproven is not None and reproven < n_patches:
        record["reproven"] = reproven  # the others' proofs were carried over from the previous record
    (LINE.patches / PROVEN).write_text(json.dumps(record, indent=1) + "\n")
    print(f"recorded the proven state in {(LINE.patches / PROVEN).relative_to(forkbuild.ROOT)}: commit it")


def run_pytest(
    tree: Path, args: list[str], junit: Path | None = None, log: Path | None = None, python: str | None = None
) -> int:
    """Runs pytest on ``tree`` with ``python`` (default: this one); with ``log``, its output goes to that file instead
    of the terminal."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    command = [python or sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    if junit is not None:
        command.append(f"--junitxml={junit}")
    if log is None:
        return subprocess.run(command, env=env, cwd=forkbuild.ROOT).returncode
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.run(command, env=env, cwd=forkbuild.ROOT, stdout=out, stderr=subprocess.STDOUT).returncode


@dataclass
class Outcome:
    counts: dict[str, int] = field(default_factory=dict)
    cells: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        order = ("passed", "failed", "error", "xfailed", "skipped")
        parts = [f"{self.counts[k]} {k}" for k in order if self.counts.get(k)]
        return ", ".join(parts) or "nothing ran"


def junit_cases(path: Path):
    """Yields ``(classname, name, result, message)`` for every test case of a junit xml file (none if it is missing);
    ``result`` is passed, failed, error, skipped or xfailed."""
    if not path.exists():
        return
    for case in ET.parse(path).iter("testcase"):
        result, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                result = "failed" if child.tag == "failure" else "error"
                message = (child.get("message") or child.text or "").strip()
            elif child.tag == "skipped" and result == "passed":  # a failure reported with it stays a failure
                result = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
                message = (child.get("message") or "").strip()
        yield case.get("classname") or "", case.get("name") or "?", result, message


def outcome_from_junit(path: Path, seconds: float) -> Outcome:
    outcome = Outcome(seconds=seconds)
    for classname, name, result, _ in junit_cases(path):
        outcome.cells[f"{classname}::{name}"] = result
        outcome.counts[result] = outcome.counts.get(result, 0) + 1
    return outcome


def measure(
    tree: Path, args: list[str], log: Path, expect_failures: bool = False, python: str | None = None
) -> Outcome:
    """Runs a selection with its output in ``log`` (CI logs stay small: runs before a patch fail on purpose).
    A run that should pass and does not prints the tail of its log (``expect_failures``: never)."""
    with tempfile.TemporaryDirectory(prefix="trl-prove-") as tmp:
        junit = Path(tmp) / "junit.xml"
        start = time.monotonic()
        tb = "line" if expect_failures else "short"
        run_pytest(tree, ["-q", "--no-header", "-rfE", f"--tb={tb}", *args], junit, log=log, python=python)
        outcome = outcome_from_junit(junit, time.monotonic() - start)
    if not expect_failures and set(outcome.counts) - {"passed", "skipped", "xfailed"}:
        lines = log.read_text(errors="replace").splitlines()
        print(f"----- {log} (last 150 of {len(lines)} lines) -----", *lines[-150:], sep="\n", flush=True)
    return outcome


def vllm_python() -> str | None:
    """The Python with vLLM's CPU build for the line (``TRL_FORK_VLLM_PYTHON``, else ``.venv-vllm`` of the line)."""
    python = os.environ.get("TRL_FORK_VLLM_PYTHON") or str(LINE.project / ".venv-vllm" / "bin" / "python")
    return python if Path(python).is_file() else None


def _outside_the_tree(tree: Path, stem: str, tests: dict) -> list[str]:
    """The patch's test files (``tests``: paths in ``tree``) as they run on the series before the patch: from a copy
    of ``tree``'s ``tests/`` outside any tree. Where ``tests/`` is a package (``tests/__init__.py``, the 1.16.0 line
    from patch 0004), pytest puts the directory above it first on ``sys.path``: run in place, the tests would import
    the patched ``trl`` of ``tree`` instead of the tree under test (``PYTHONPATH``). Without a package the copy runs
    exactly as the files in place do."""
    scratch = LINE.build_dir / "prove-tests" / stem
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(tree / "tests", scratch / "tests")
    return [str(scratch / path) for path in tests]


def table(matrix: bool, extra: list[str], against_base: bool = False, skip_if_proven: bool = False) -> int:
    series = forkbuild.read_series(LINE.patches)
    already_proven = set()
    if skip_if_proven:
        record = recorded_proof()
        if record.get("state") == proof_state():
            print(
                f"[prove] {LINE.name} line: skipped; its base pin, series, patch diffs (with their tests) and bounds "
                f"are byte-identical to the state proven on {record['proven_on']} ({record['seconds']} s, "
                f"torch {record['torch']}); recorded in {(LINE.patches / PROVEN).relative_to(forkbuild.ROOT)}"
            )
            if "patch_states" not in record:  # a record of the whole state covers each patch's own state
                record["patch_states"] = patch_states()
                (LINE.patches / PROVEN).write_text(json.dumps(record, indent=1) + "\n")
                print(f"[prove] added each patch's state to {PROVEN}: commit it")
            return 0
        # A patch whose own state (the series up to it) is the one recorded was proven on exactly these trees
        recorded = record.get("patch_states", {})
        already_proven = {name for name, state in patch_states().items() if recorded.get(name) == state}
        why = "no proven state recorded" if not record else "the state changed since the recorded proof"
        print(
            f"[prove] {LINE.name} line: {why}; proving {len(series) - len(already_proven)} of {len(series)} patches "
            f"(the others are byte-identical, with every patch before them, to their recorded proof)"
        )
    start = time.monotonic()
    base_tree = tree_for("base")
    rows, ok = [], True
    for index, name in enumerate(series, start=1):
        if name in already_proven:
            rows.append((name, "-", "proven before (recorded)", "-", "OK"))
            continue
        before_tree = base_tree if against_base else tree_for(str(index - 1))
        after_tree = tree_for(str(index))
        tests = forkbuild.patch_test_names(LINE.patches / name)
        if not tests:
            rows.append((name, "-", "no tests in patch", "-", "MISSING TESTS"))
            ok = False
            continue
        selection = [str(after_tree / path) for path in tests] + ["-m", "not gpu", *extra]
        if all(tests.values()):  # the tests the patch adds, where it adds some to every file it touches
            selection += ["-k", " or ".join(name for names in tests.values() for name in names)]
        stem = name.removesuffix(".patch")
        python = None
        if "vllm" in forkbuild.patch_test_needs(LINE.patches / name):  # a real vLLM: the line's vLLM venv
            python = vllm_python()
            if python is None:
                rows.append(
                    (
                        name,
                        "-",
                        f"needs vLLM: no Python at TRL_FORK_VLLM_PYTHON or {LINE.project}/.venv-vllm (make venv-vllm LINE={LINE.name})",
                        "-",
                        "NOT PROVEN",
                    )
                )
                ok = False
                continue
        # One failure is the proof: the run before the patch stops at the first one (`--maxfail=1`)
        before_selection = [*_outside_the_tree(after_tree, stem, tests), *selection[len(tests) :]]
        before = measure(
            before_tree,
            [*before_selection, "--maxfail=1"],
            logs_dir() / f"{stem}.before.log",
            expect_failures=True,
            python=python,
        )
        after = measure(after_tree, selection, logs_dir() / f"{stem}.patched.log", python=python)
        before_fails = before.counts.get("failed", 0) + before.counts.get("error", 0) > 0
        after_passes = after.counts.get("passed", 0) > 0 and set(after.counts) <= {"passed", "skipped"}
        verdict = "OK" if before_fails and after_passes else "NOT PROVEN"
        ok &= verdict == "OK"
        rows.append((name, str(len(after.cells)), before.summary(), after.summary(), verdict))
        print(f"[prove] {name}: before {before.summary()} | with {after.summary()} -> {verdict}", flush=True)

    widths = [max(len(row[i]) for row in rows + [HEADER]) for i in range(5)] if rows else [10] * 5
    before = "the pristine base" if against_base else "the series before it"
    print(f"\nRegression tests of each patch: {before} vs the series up to it")
    for row in [HEADER, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))

    if matrix:
        dist_tests = (LINE.project / "tests" / "dist").relative_to(forkbuild.ROOT).as_posix()
        selection = [dist_tests, "-m", "dist and not gpu", *extra]
        on_base = measure(base_tree, selection, logs_dir() / "matrix.base.log", expect_failures=True)
        on_fork = measure(tree_for("fork"), selection, logs_dir() / "matrix.fork.log")
        flipped = sorted(c for c, r in on_base.cells.items() if r == "xfailed" and on_fork.cells.get(c) == "passed")
        print(f"\nDistributed matrix ({dist_tests})")
        print(f"  pristine base: {on_base.summary()} ({on_base.seconds:.0f} s)")
        print(f"  fork:          {on_fork.summary()} ({on_fork.seconds:.0f} s)")
        print(f"  cells broken on the base and passing on the fork: {len(flipped)}")
        for cell in flipped:
            print(f"    {cell}")
        ok &= not any(r in ("failed", "error") for r in [*on_base.cells.values(), *on_fork.cells.values()])
    print(f"\n(pytest output of every run: {logs_dir()})")
    print("result:", "every patch proven" if ok else "NOT every patch is proven (see above)")
    if ok and not extra and not against_base:  # the whole proof, as CI runs it
        record_proof(time.monotonic() - start, len(series), reproven=len(series) - len(already_proven))
    return 0 if ok else 1


HEADER = ("patch", "tests", "before the patch (to the 1st failure)", "with the patch", "verdict")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line", default=forkbuild.DEFAULT_LINE, help="the line (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run pytest against one tree")
    p.add_argument("--tree", default="fork", help="base, fork, or a number of patches (default: fork)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER)
    p = sub.add_parser("table", help="each patch's tests: the series before it vs with it")
    p.add_argument("--matrix", action="store_true", help="also run the line's tests/dist on both trees; flipped cells")
    p.add_argument("--against-base", action="store_true", help="run each patch's tests on the pristine base instead")
    p.add_argument("--skip-if-proven", action="store_true", help="skip when patches/proven.json matches (CI)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER)
    p = sub.add_parser("carry-over", help="re-key the record of REVISION after the line moved or the hashing changed")
    p.add_argument("--from", dest="revision", required=True, help="a commit proven with the same content")
    args = parser.parse_args(argv)
    extra = [a for a in getattr(args, "pytest_args", []) if a != "--"]
    global LINE
    try:
        LINE = forkbuild.get_line(args.line)
        if args.command == "run":
            return run_pytest(tree_for(args.tree), extra)
        if args.command == "carry-over":
            return carry_over(args.revision)
        return table(args.matrix, extra, against_base=args.against_base, skip_if_proven=args.skip_if_proven)
    except forkbuild.BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
