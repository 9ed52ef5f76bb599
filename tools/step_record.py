"""Skip a heavy CI step when nothing it reads has changed since it last passed (#39 item 4): the 0.16.1 line's (in
maintenance) matrix, own suite and golden; the 1.16.0 line's patch tests against a real vLLM (`make test-real-vllm`).

    python3 tools/step_record.py --line 0.16.1 --step matrix -- make test-dist LINE=0.16.1 DIST_MARK="..."
    python3 tools/step_record.py --line 0.16.1 --step matrix --skip-if-recorded -- make ...   # CI

Runs the command after ``--``; when it passes, run as CI runs it (no ``PYTEST_ADDOPTS``, no ``TRL_HARNESS_*`` in the
environment) and with nothing it reads changed while it ran, records the step's state in the line's
``patches/steps_proven.json``. The state is a hash of the step's name and command, the Python version (major.minor),
the packages installed in each venv given with ``--environment`` (``pip freeze``, editable installs left out) and every
file the step reads (``hashed_files``): the line's own folder (its tests, patches with their tests, pins), the tools,
the test harness (``tests/harness``), the benchmarks (the memory gate runs one), the accelerate configs, the Makefile
and the root's pyproject.toml (pytest's settings for the root's tests), except documentation (docs folders, markdown
files) and the records themselves. ``--skip-if-recorded`` exits 0 without running the command when the current state
is the recorded one, byte for byte, the record is at most ``MAX_AGE_DAYS`` old and the step is run as CI runs it (no
make settings, the line's ``trl-src/`` its series: ``altered_settings``); anything else runs the step in full. CI never
records: commit the file written by a passing run here (``make heavy-steps LINE=0.16.1``, ``make test-real-vllm``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import forkbuild  # noqa: E402


RECORD = "steps_proven.json"
RECORDS = ("proven.json", "torch26_proven.json", RECORD)  # written by the proofs and runs: never part of a state
MAX_AGE_DAYS = 7
# What a line's recorded steps read outside the line's own folder (relative to the repository's root): the
# tools, the harness (its pytest plugin, launcher, workers' shared parts), the benchmarks (the memory gate runs one),
# the accelerate configs, the Makefile and pytest's settings. The root's other tests (build, recipes, demo) belong to
# no heavy step.
SHARED = ("tools/", "tests/harness/", "benchmarks/", "examples/accelerate_configs/", "Makefile", "pyproject.toml")
# Make variables that change what a step runs (the Makefile's `?=` settings): a run with any of them set, on make's
# command line or in the environment, is not the step CI runs, and is never recorded.
SETTINGS = ("PYTHON", "VENV", "EXTRAS", "RUFF", "TORCH", "TREE", "PYTEST_ARGS", "DIST_MARK", "UPSTREAM_ARGS",
            "VENV26", "TORCH26", "VENV_VLLM", "VLLM_CPU", "DEMO_ARGS", "PYTEST_ADDOPTS")  # fmt: skip


def hashed_files(line: forkbuild.Line) -> list[str]:
    """The files a step of ``line`` reads: tracked (or not ignored) files of the line's folder and of ``SHARED``,
    without documentation (docs folders, markdown) and records."""
    own = line.project.relative_to(forkbuild.ROOT).as_posix() + "/"
    keep = []
    for rel in forkbuild.repo_files():
        parts = rel.split("/")
        if not (rel.startswith(own) or rel in SHARED or any(s.endswith("/") and rel.startswith(s) for s in SHARED)):
            continue
        if "docs" in parts[:-1] or rel.endswith(".md") or parts[-1] in RECORDS:
            continue
        keep.append(rel)
    return keep


def environment(python: str) -> str:
    """The packages installed in the venv of ``python`` (``pip freeze`` but editable installs, which are the line's
    own tree, sorted), or why there are none: part of a step's state, so a venv that pip resolved to other releases
    (within the line's bounds) does not match a record made with another."""
    try:
        result = subprocess.run(
            [python, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, cwd=forkbuild.ROOT
        )
    except OSError as exc:
        return f"unavailable: {exc.strerror}"
    if result.returncode != 0:
        return f"unavailable: pip freeze exited with {result.returncode}"
    return "\n".join(sorted(result.stdout.split()))


def step_state(line: forkbuild.Line, step: str, command: list[str], environments: list[str] = ()) -> str:
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    salt = f"steps/2\0{line.name}\0{step}\0{shlex.join(command)}\0python {python}\0".encode()
    for venv_python in environments:
        salt += f"environment\0{environment(venv_python)}\0".encode()
    paths = [forkbuild.ROOT / rel for rel in hashed_files(line)]
    return forkbuild.files_digest(salt, paths, relative_to=forkbuild.ROOT).hexdigest()


def load(line: forkbuild.Line) -> dict:
    path = line.patches / RECORD
    return json.loads(path.read_text()) if path.is_file() else {}


def recorded(line: forkbuild.Line, step: str, state: str) -> str | None:
    """Why the step may be skipped (a line to print), or None."""
    entry = load(line).get(step, {})
    if entry.get("state") != state:
        return None
    age = (datetime.date.today() - datetime.date.fromisoformat(entry["proven_on"])).days
    if age > MAX_AGE_DAYS:
        print(f"[step] {line.name} {step}: its record is {age} days old (> {MAX_AGE_DAYS}): running it", flush=True)
        return None
    return (
        f"[step] {line.name} {step}: skipped, what it reads is byte-identical to the state it passed on "
        f"{entry['proven_on']} ({entry['seconds']} s; {line.patches.relative_to(forkbuild.ROOT)}/{RECORD})"
    )


def altered_settings(line: forkbuild.Line) -> list[str]:
    """Why a passing run is not the step CI runs: make settings or pytest options given, harness switches set, or a
    development tree (which the line's venv imports) that is not the line's series as ``patches/`` builds it."""
    given = [k for k in os.environ if k in SETTINGS or k.startswith("TRL_HARNESS_")]
    given += [w.split("=", 1)[0] for w in os.environ.get("MAKEFLAGS", "").split() if "=" in w]
    reasons = [f"{k} set" for k in dict.fromkeys(given) if k not in ("LINE", "SKIP_IF_RECORDED")]
    if line.dev_tree.is_dir():
        import prove

        def tree_of(path: Path) -> str:
            return forkbuild.git(path, "rev-parse", "HEAD^{tree}").stdout.strip()

        dirty = forkbuild.git(line.dev_tree, "status", "--porcelain").stdout.strip()
        if dirty or tree_of(line.dev_tree) != tree_of(prove.tree_for("fork", line)):
            reasons.append(f"{line.dev_tree.relative_to(forkbuild.ROOT)} differs from the series in patches/")
    return reasons


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("error: give the step's command after --", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line", required=True, help="the line whose step this is")
    parser.add_argument("--step", required=True, help="the step's name in the record")
    parser.add_argument("--skip-if-recorded", action="store_true", help="skip when the record matches (CI)")
    parser.add_argument(
        "--environment",
        action="append",
        default=[],
        metavar="PYTHON",
        help="a venv's Python the step runs: its installed packages are part of the state (repeatable)",
    )
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        print("error: give the step's command after --", file=sys.stderr)
        return 2
    try:
        line = forkbuild.get_line(args.line)
    except forkbuild.BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    before = step_state(line, args.step, command, args.environment)
    if args.skip_if_recorded:
        why = recorded(line, args.step, before)
        altered = altered_settings(line) if why else []
        if why and not altered:
            print(why, flush=True)
            return 0
        why = "; ".join(altered) if altered else "no matching record"
        print(f"[step] {line.name} {args.step}: {why}: running it", flush=True)
    start = time.monotonic()
    code = subprocess.run(command, cwd=forkbuild.ROOT).returncode
    seconds = round(time.monotonic() - start)
    altered = altered_settings(line)
    if (
        code == 0
        and not os.environ.get("CI")
        and not altered
        and step_state(line, args.step, command, args.environment) == before
    ):
        entries = load(line)
        entries[args.step] = {
            "state": before,
            "command": shlex.join(command),
            "proven_on": datetime.date.today().isoformat(),
            "seconds": seconds,
        }
        (line.patches / RECORD).write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
        print(f"[step] {line.name} {args.step}: passed in {seconds} s, recorded in {RECORD}: commit it", flush=True)
    elif code == 0:
        why = "CI never records" if os.environ.get("CI") else "; ".join(altered) or "what it reads changed meanwhile"
        print(f"[step] {line.name} {args.step}: passed in {seconds} s, not recorded ({why})", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
