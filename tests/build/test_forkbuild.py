"""The build layer: fetching and verifying the base, applying and exporting the series, installing the fork."""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import forkbuild  # noqa: E402


TOOL = [sys.executable, str(ROOT / "tools" / "forkbuild.py"), "--line", "0.16.1"]
LINE = forkbuild.get_line("0.16.1")  # the tools' tests run on the 0.16.1 line (its venv); test_lines.py covers both
BASE = forkbuild.load_base(LINE.patches)
SERIES = forkbuild.read_series(LINE.patches)
# Every patch of every line (the checks on patch form apply to all of them)
ALL_PATCHES = [
    forkbuild.get_line(line).patches / name
    for line in forkbuild.known_lines()
    for name in forkbuild.read_series(forkbuild.get_line(line).patches)
]


def run(command, *, env=None, cwd=None, check=False):
    merged = {**os.environ, **(env or {})}
    result = subprocess.run(command, capture_output=True, text=True, env=merged, cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(f"{command} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def error_line(result) -> str:
    """The tool's failure: exit code 1 and exactly one line on stderr, starting with 'error:'."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("[trl-fork]")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="session")
def sdist() -> Path:
    return forkbuild.fetch_sdist(BASE)


@pytest.fixture()
def patches_copy(tmp_path) -> Path:
    copy = tmp_path / "patches"
    shutil.copytree(LINE.patches, copy)
    return copy


def test_base_pin_is_the_registry_sdist(sdist):
    assert BASE.sdist == "trl-0.16.1.tar.gz"
    assert BASE.sha256 == "166acab64811acfbaaa3839688547d78fec806f9b12b99497b168431e13968be"
    assert forkbuild.sha256_of(sdist) == BASE.sha256


def test_wrong_hash_is_rejected_with_one_clear_line(tmp_path, sdist):
    corrupt = tmp_path / BASE.sdist
    corrupt.write_bytes(sdist.read_bytes() + b"\0")
    result = run([*TOOL, "materialize", "--dest", str(tmp_path / "tree")], env={"TRL_FORK_SDIST": str(corrupt)})
    line = error_line(result)
    assert str(corrupt) in line and BASE.sha256 in line and forkbuild.sha256_of(corrupt) in line
    assert not (tmp_path / "tree").exists(), "a failed build must not leave a half-made tree"


def test_missing_local_sdist_is_named(tmp_path):
    result = run([*TOOL, "fetch"], env={"TRL_FORK_SDIST": str(tmp_path / "nope.tar.gz")})
    assert "TRL_FORK_SDIST=" in error_line(result)


def test_offline_copy_is_used_and_verified(tmp_path, sdist):
    copy = tmp_path / "offline" / BASE.sdist
    copy.parent.mkdir()
    shutil.copy(sdist, copy)
    result = run([*TOOL, "fetch"], env={"TRL_FORK_SDIST": str(copy)}, check=True)
    assert result.stdout.strip() == str(copy)


def test_failed_download_names_the_cause(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {
        "TRL_FORK_CACHE": str(tmp_path / "cache"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(empty),
    }
    line = error_line(run([*TOOL, "fetch"], env=env))
    assert "could not download trl==0.16.1 through pip" in line
    assert "TRL_FORK_SDIST" in line  # and says how to build offline


def test_corrupt_cache_entry_is_not_used(tmp_path, sdist):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / BASE.sdist).write_bytes(b"not a tarball")
    env = {"TRL_FORK_CACHE": str(cache), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
    line = error_line(run([*TOOL, "fetch"], env=env))  # discarded, then the (disabled) download fails
    assert "could not download" in line
    assert not (cache / BASE.sdist).exists()


def test_materialized_tree_is_base_commit_plus_one_commit_per_patch(tmp_path):
    tree = forkbuild.materialize(tmp_path / "tree", patches_dir=LINE.patches)
    log = forkbuild.git(tree, "log", "--reverse", "--format=%s", f"{BASE.tag}~0..HEAD").stdout.splitlines()
    assert len(log) == len(SERIES)
    assert forkbuild.git(tree, "log", "-1", "--format=%s", BASE.tag).stdout.strip() == "trl 0.16.1 (pristine sdist)"
    for subject, name in zip(log, SERIES):
        header = (LINE.patches / name).read_text().split("\n---\n", 1)[0]
        assert f"Subject: [PATCH] {subject}" in header.replace("\n ", " ")
    assert forkbuild.git(tree, "status", "--porcelain").stdout == "", "generated files must be git-ignored"
    info = (tree / "trl" / "_fork_info.py").read_text()
    assert f"VERSION = '0.16.1+fork.{len(SERIES)}'" in info
    for name in SERIES:
        assert name in info


def test_pristine_base_has_no_fork_info(tmp_path, sdist):
    tree = forkbuild.materialize(tmp_path / "base", patches_dir=LINE.patches, upto=0, fork_info=False)
    assert not (tree / "trl" / "_fork_info.py").exists()
    assert 'version__ = "0.16.1"' in (tree / "trl" / "__init__.py").read_text()


def test_every_patch_has_upstream_pr_header_and_dep3_trailers():
    for path in ALL_PATCHES:
        name, text = path.name, path.read_text()
        assert re.match(r"\d{4}-[A-Za-z0-9._\-]+\.patch$", name), name
        assert text.startswith("From 0000000000000000000000000000000000000000 "), name
        header = text.split("\n---\n", 1)[0]
        assert re.search(r"^Subject: \[PATCH\] \S", header, re.M), name
        assert re.search(r"^Forwarded: \S", header, re.M), f"{name}: no Forwarded: trailer"
        assert re.search(r"^Last-Update: \d{4}-\d{2}-\d{2}$", header, re.M), f"{name}: no Last-Update: trailer"
        assert re.search(r"^Bug-Fork: #\d+$", header, re.M), f"{name}: no Bug-Fork: trailer naming the issue"
        assert forkbuild.patch_test_files(Path("/tree"), path.parent, names=[name]), f"{name} carries no tests"


def test_test_needs_trailer_selects_the_tests_that_need_a_real_vllm():
    """`Test-Needs: vllm` sends a patch's tests to the line's vLLM venv (`make prove`, `make test-real-vllm`); a
    patch without it keeps its tests in the line's venv."""
    patches = forkbuild.get_line("1.16.0").patches
    needing = [name for name in forkbuild.read_series(patches) if forkbuild.patch_test_needs(patches / name)]
    colocate = "0022-vLLM-colocate-sync-through-vLLM-s-own-reload-on-its-CPU-platform.patch"
    assert (
        colocate in needing
        and "0021-vLLM-server-a-token-guards-every-route-but-vLLM-s-probes-VLLM_API_KEY.patch" not in needing
    )
    assert forkbuild.patch_test_needs(patches / colocate) == {"vllm"}
    selected = forkbuild.patch_test_files(Path("/tree"), patches, needs="vllm")
    assert Path("/tree/tests/test_vllm_colocate_reload.py") in selected
    assert Path("/tree/tests/test_vllm_serve_token.py") not in selected


def test_patch_that_does_not_apply_names_patch_and_file(tmp_path, patches_copy):
    broken = patches_copy / "9999-broken.patch"
    broken.write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: Someone <someone@example.invalid>\nDate: Sat, 21 Nov 2026 00:00:00 +0000\n"
        "Subject: [PATCH] broken\n\n---\n"
        "diff --git a/trl/core.py b/trl/core.py\n--- a/trl/core.py\n+++ b/trl/core.py\n"
        "@@ -1,3 +1,3 @@\n-this line is not in the file\n+replacement\n context\n context\n"
    )
    with open(patches_copy / "series", "a") as handle:
        handle.write("9999-broken.patch\n")
    result = run([*TOOL, "--patches", str(patches_copy), "materialize", "--dest", str(tmp_path / "tree")])
    line = error_line(result)
    assert "patch 9999-broken.patch does not apply" in line and "trl/core.py" in line
    assert not (tmp_path / "tree").exists()


def test_series_naming_a_missing_patch_is_an_error(tmp_path, patches_copy):
    with open(patches_copy / "series", "a") as handle:
        handle.write("0042-missing.patch\n")
    line = error_line(run([*TOOL, "--patches", str(patches_copy), "materialize", "--dest", str(tmp_path / "t")]))
    assert "0042-missing.patch" in line


def test_round_trip_leaves_patches_byte_identical():
    forkbuild.check_roundtrip(LINE.patches)


def test_edit_commit_export_adds_a_patch_that_materializes_again(tmp_path, patches_copy):
    tree = forkbuild.materialize(tmp_path / "tree", patches_dir=patches_copy)
    (tree / "trl" / "core.py").write_text((tree / "trl" / "core.py").read_text() + "\n# an edit\n")
    forkbuild.git(
        tree, "commit", "-q", "-am", "core: an edit\n\nBug-Fork: #99\nForwarded: no\nLast-Update: 2026-11-21"
    )
    names = forkbuild.export(tree, patches_dir=patches_copy)
    assert len(names) == len(SERIES) + 1 and names[-1].endswith("-core-an-edit.patch")
    assert forkbuild.read_series(patches_copy) == names
    assert forkbuild.patch_issues(patches_copy / names[-1]) == (99,)
    again = forkbuild.materialize(tmp_path / "again", patches_dir=patches_copy)
    assert (again / "trl" / "core.py").read_text().endswith("# an edit\n")
    assert "(99,)" in (again / "trl" / "_fork_info.py").read_text()


def test_export_refuses_uncommitted_changes(tmp_path, patches_copy):
    tree = forkbuild.materialize(tmp_path / "tree", patches_dir=patches_copy)
    (tree / "trl" / "core.py").write_text("changed\n")
    with pytest.raises(forkbuild.BuildError, match="uncommitted changes"):
        forkbuild.export(tree, patches_dir=patches_copy)


def test_pr_branches(tmp_path):
    tree = forkbuild.materialize(tmp_path / "tree", patches_dir=LINE.patches)
    report, failed = forkbuild.pr_branches(tree, patches_dir=LINE.patches, descriptions=tmp_path / "pr")
    descriptions = sorted((tmp_path / "pr").glob("*.md"))
    assert len(descriptions) == len(SERIES)
    for index, path in enumerate(descriptions, start=1):
        text = path.read_text()
        assert path.name.startswith(f"{index:04d}-") and f"  description: {path}" in report
        sections = re.findall(r"^## (.+)$", text, flags=re.M)
        assert sections == ["Motivation", "What changed", "Tests", "Upstream status"], (path.name, sections)
        subject, _, trailers = forkbuild.split_message(
            forkbuild.git(tree, "log", "-1", "--format=%B", f"pr-stack/{path.stem}").stdout
        )
        assert text.startswith(f"# {subject}\n") and trailers["Upstream-Status"] in text
    branches = forkbuild.git(tree, "branch", "--format=%(refname:short)").stdout.split()
    for index in range(1, len(SERIES) + 1):
        stack = [b for b in branches if b.startswith(f"pr-stack/{index:04d}-")]
        assert len(stack) == 1
        count = forkbuild.git(tree, "rev-list", "--count", f"{BASE.tag}..{stack[0]}").stdout.strip()
        assert count == str(index)
        alone = [b for b in branches if b.startswith(f"pr/{index:04d}-")]
        (line,) = [line for line in report if line.startswith(f"pr/{index:04d}-")]
        if alone:  # the base, what its Depends name (transitively), and the patch
            count = forkbuild.git(tree, "rev-list", "--count", f"{BASE.tag}..{alone[0]}").stdout.strip()
            assert count == str(1 + (line.count(",") + 1 if "(its Depends)" in line else 0)), line
        else:
            assert "needs earlier patches" in line or "does not apply through its Depends" in line
        assert (index in failed) == (not alone), line
    assert report[-1].startswith("[pr] ") and " PRs depend on nothing" in report[-1]
    assert forkbuild.git(tree, "worktree", "list").stdout.count("\n") == 1, "scratch worktree left behind"


def test_declared_depends():
    message = "x: y\n\nBody.\n\nBug-Fork: #1\nDepends: 0005, 0010 (the tests' helpers; 0013 is not one)\nLast-Update: 2026-11-28\n"
    assert forkbuild.declared_depends(message) == [5, 10]
    assert forkbuild.declared_depends(message.replace("Depends: 0005, 0010", "X-Note: 0005")) == []
    assert forkbuild.declared_depends(message.replace(", 0010 (", " (x (0007)), 0010 (")) == [5, 10]


def test_depends_closures():
    """A PR branch carries what its patch's `Depends:` names, and what those name in turn."""
    messages = ["a: b\n\nBody.\n"] * 3 + ["a: b\n\nBody.\n\nDepends: 0002\n", "a: b\n\nBody.\n\nDepends: 0004, 0001\n"]
    assert forkbuild.depends_closures(messages) == {1: set(), 2: set(), 3: set(), 4: {2}, 5: {1, 2, 4}}
    with pytest.raises(forkbuild.BuildError, match=r"patch 0002: `Depends:` names \[3\]"):
        forkbuild.depends_closures(["a: b\n\nBody.\n", "a: b\n\nBody.\n\nDepends: 0003\n"])


def test_pr_description_sections():
    message = """core: fix a thing

What it does and why.

Default paths: unchanged.

Failure fixed: it crashed with
  ValueError: boom

Tests: tests/test_thing.py
- ThingTester: fails on the base.

Audit: every other caller checked.

Bug-Fork: #9
Forwarded: no
Upstream-Status: not upstream as of trl 1.16.0 (upstream does
 something else)
Last-Update: 2026-11-23
"""
    subject, paragraphs, trailers = forkbuild.split_message(message)
    assert subject == "core: fix a thing" and len(paragraphs) == 5
    assert trailers["Upstream-Status"] == "not upstream as of trl 1.16.0 (upstream does something else)"
    text = forkbuild.pr_description(message, base="0.16.1", depends_on=["0001 fork: x"])
    assert "## Motivation\n\nit crashed with\n  ValueError: boom\n" in text
    assert "## What changed\n\nWhat it does and why.\n\nDefault paths: unchanged.\n" in text
    assert "## Tests\n\ntests/test_thing.py\n- ThingTester: fails on the base.\n\n## Upstream" in text
    # a paragraph after "Tests:" (an audit, say) is part of what changed, not of the tests
    assert "Default paths: unchanged.\n\nAudit: every other caller checked.\n\n## Tests" in text
    assert "## Upstream status\n\nnot upstream as of trl 1.16.0 (upstream does something else)\n" in text
    assert "0001 fork: x" in text
    with pytest.raises(forkbuild.BuildError, match="no Upstream-Status"):
        forkbuild.pr_description(message.replace("Upstream-Status", "X-Note"), base="0.16.1")
    # the private names the diff uses get their own section, where the header names them
    assert "## Private names used" not in text
    named = message.replace("\nBug-Fork", "\nPrivate names used: `torch.x._y` (no public way to do it).\n\nBug-Fork")
    text = forkbuild.pr_description(named, base="1.16.0")
    assert "## Tests\n\ntests/test_thing.py\n- ThingTester: fails on the base.\n\n## Private names used\n\n" in text
    assert "## Private names used\n\n`torch.x._y` (no public way to do it).\n\n## Upstream status" in text
    tests_only = named.replace("used: `torch", "used, tests only: `torch")
    assert "## Private names used\n\ntests only: `torch.x._y`" in forkbuild.pr_description(tests_only, base="1.16.0")


def test_every_patch_states_its_upstream_status():
    for path in ALL_PATCHES:
        _, _, trailers = forkbuild.split_message(path.read_text().split("\n---\n")[0])
        assert trailers.get("Upstream-Status", "").startswith(
            ("fixed in trl", "not upstream as of trl", "not applicable")
        ), path.name


def test_git_tracks_no_upstream_source():
    assert forkbuild.tracked_upstream_files() == []


def test_dependencies_have_tested_upper_bounds(tmp_path):
    sys.path.insert(0, str(ROOT))
    tree = forkbuild.materialize(tmp_path / "tree", patches_dir=LINE.patches)
    metadata = forkbuild.upstream_metadata(tree)
    assert metadata["__version__"] == BASE.version
    source = (LINE.project / "setup.py").read_text()
    for name in ("transformers", "accelerate", "datasets", "peft", "deepspeed", "vllm"):
        assert re.search(rf'"{name}": "<[\d.]+"', source), f"no tested upper bound for {name}"
    # the extra's lower bound comes from the series (patch 0002), the upper one from setup.py
    assert "vllm>=0.7.2; sys_platform != 'win32'" in metadata["EXTRAS"]["vllm"]


# ------------------------------------------------------------------------------ reuse of a build tree (setup.py)


@pytest.fixture()
def built(tmp_path, monkeypatch, sdist):
    """A build tree of the base + the first patch, as `pip install .` leaves it in build/fork-tree."""
    monkeypatch.delenv("TRL_FORK_SDIST", raising=False)
    tree = forkbuild.build_tree(LINE.patches, dest=tmp_path / "fork-tree", upto=1)
    (tree / "sentinel").write_text("gone when the tree is rebuilt\n")  # untracked: ignored by the checks
    return tree


def test_build_tree_is_reused_when_nothing_changed(built, capsys):
    assert forkbuild.build_tree(LINE.patches, dest=built, upto=1) == built
    assert (built / "sentinel").exists()
    assert (
        f"reusing {built}: {BASE.sdist} (sha256 {BASE.sha256[:12]}) + 1 patch(es), verified" in capsys.readouterr().err
    )


def test_build_tree_with_an_edited_file_is_rebuilt(built, capsys):
    """An edit in build/fork-tree used to go into the wheel silently (its stamp only covers patches/)."""
    init = built / "trl" / "__init__.py"
    pristine = init.read_text()
    init.write_text(pristine + "EDITED = True\n")
    forkbuild.build_tree(LINE.patches, dest=built, upto=1)
    assert init.read_text() == pristine and not (built / "sentinel").exists()
    assert "files were changed there since it was built: trl/__init__.py" in capsys.readouterr().err


def test_build_tree_ignores_the_egg_info_a_build_rewrites(built):
    pkg_info = built / "trl.egg-info" / "PKG-INFO"
    pkg_info.write_text(pkg_info.read_text() + "Written-By: setuptools\n")
    forkbuild.build_tree(LINE.patches, dest=built, upto=1)
    assert (built / "sentinel").exists()


def test_build_tree_with_other_commits_is_rebuilt(built):
    (built / "trl" / "extra.py").write_text("x = 1\n")
    forkbuild.git(built, "add", "trl/extra.py")
    forkbuild.git(built, "commit", "--quiet", "-m", "an extra commit")
    forkbuild.build_tree(LINE.patches, dest=built, upto=1)
    assert not (built / "trl" / "extra.py").exists()


def test_build_tree_from_another_sdist_is_rebuilt(built, capsys):
    record = json.loads((built / forkbuild.BUILD_RECORD).read_text())
    assert record["sdist_sha256"] == BASE.sha256 and record["patches"] == 1
    (built / forkbuild.BUILD_RECORD).write_text(json.dumps(dict(record, sdist_sha256="0" * 64)))
    forkbuild.build_tree(LINE.patches, dest=built, upto=1)
    assert not (built / "sentinel").exists()
    assert "built from an sdist with sha256 " + "0" * 64 in capsys.readouterr().err


def test_build_tree_without_a_record_is_rebuilt(built):
    """A tree made before records were kept (or by hand) cannot be checked: it is rebuilt."""
    (built / forkbuild.BUILD_RECORD).unlink()
    forkbuild.build_tree(LINE.patches, dest=built, upto=1)
    assert not (built / "sentinel").exists() and (built / forkbuild.BUILD_RECORD).is_file()


def test_reused_build_tree_still_verifies_trl_fork_sdist(built, tmp_path, monkeypatch, sdist):
    """TRL_FORK_SDIST used to be ignored (not even read) when build/fork-tree was reused."""
    corrupt = tmp_path / BASE.sdist
    corrupt.write_bytes(sdist.read_bytes() + b"\0")
    monkeypatch.setenv("TRL_FORK_SDIST", str(corrupt))
    with pytest.raises(forkbuild.BuildError, match="refusing to build on an unverified base"):
        forkbuild.build_tree(LINE.patches, dest=built, upto=1)
    monkeypatch.setenv("TRL_FORK_SDIST", str(tmp_path / "missing.tar.gz"))
    with pytest.raises(forkbuild.BuildError, match="does not exist"):
        forkbuild.build_tree(LINE.patches, dest=built, upto=1)
    monkeypatch.setenv("TRL_FORK_SDIST", str(sdist))  # the right file: the tree is reused
    forkbuild.build_tree(LINE.patches, dest=built, upto=1)
    assert (built / "sentinel").exists()


# ------------------------------------------------------------------------------------ builds from a clone


@pytest.mark.build
def test_wheel_from_fresh_clone(clone, tmp_path):
    series = forkbuild.read_series(clone / "lines" / "0.16.1" / "patches")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(tmp_path),
            str(clone / "lines" / "0.16.1"),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("trl-*.whl")
    version = f"0.16.1+fork.{len(series)}"
    assert wheel.name.startswith(f"trl-{version}-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = archive.read("trl/_fork_info.py").decode()
        metadata = archive.read(f"trl-{version}.dist-info/METADATA").decode()
    assert "trl/trainer/grpo_trainer.py" in names and not any(n.startswith("tests/") for n in names)
    assert all(name in info for name in series)
    assert re.search(r"^Requires-Dist: transformers<[\d.]+,>=4\.46\.0$", metadata, re.M)
    # the tested vLLM range (lines/0.16.1/docs/vllm_version.md, lines/0.16.1/tests/build/test_vllm_contract.py)
    assert re.search(r'^Requires-Dist: vllm<0\.8\.2,>=0\.7\.2; .*extra == "vllm"$', metadata, re.M), metadata

    site = tmp_path / "site"
    run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)], check=True
    )
    env = {"PYTHONPATH": str(site)}
    out = run([sys.executable, "-c", "import trl; print(trl.__version__, trl.__file__)"], env=env, check=True)
    assert out.stdout.split()[0] == version and out.stdout.split()[1].startswith(str(site))
    env_out = run([sys.executable, "-m", "trl.cli", "env"], env=env, check=True).stdout
    assert f"- TRL version: {version}" in env_out and "- TRL base version: 0.16.1" in env_out
    for name in series:
        assert f"  - {name}" in env_out
    help_out = run([str(site / "bin" / "trl"), "grpo", "--help"], env=env, check=True).stdout
    assert "--beta" in help_out


@pytest.mark.build
def test_editable_install_points_at_the_development_tree(clone, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], check=True)
    run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "-e",
            str(clone / "lines" / "0.16.1"),
        ],
        check=True,
    )
    code = "import importlib.util; print(importlib.util.find_spec('trl').origin)"
    origin = run([str(venv / "bin" / "python"), "-c", code], check=True).stdout.strip()
    assert origin == str(clone / "lines" / "0.16.1" / "trl-src" / "trl" / "__init__.py")
    assert (clone / "lines" / "0.16.1" / "trl-src" / ".git").is_dir()  # the development tree is a git repo to edit


@pytest.mark.build
@pytest.mark.slow
def test_pip_install_git_url_in_a_fresh_venv(clone, tmp_path):
    """What users of the 0.16.1 line do: `pip install git+<fork>#subdirectory=lines/0.16.1` into a new environment,
    then the `trl` CLI."""
    venv = tmp_path / "venv"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    run([sys.executable, "-m", "venv", str(venv)], check=True)
    run([*pip, "torch==2.13.0"], check=True)  # the CPU build; README says so for this machine
    run([*pip, f"git+file://{clone}#subdirectory=lines/0.16.1"], check=True)  # what users type, with their URL
    trl = str(venv / "bin" / "trl")
    env_out = run([trl, "env"], check=True).stdout
    series = forkbuild.read_series(clone / "lines" / "0.16.1" / "patches")
    assert f"- TRL version: 0.16.1+fork.{len(series)}" in env_out
    assert all(f"  - {name}" in env_out for name in series)
    assert "--num_generations" in run([trl, "grpo", "--help"], check=True).stdout
    versions = json.loads(run([*pip[:-2], "list", "--format=json"], check=True).stdout)
    installed = {p["name"].lower(): p["version"] for p in versions}
    assert installed["transformers"].startswith("4.")  # the tested bound kept transformers 5.x out


@pytest.mark.build
def test_wheel_rebuilt_from_a_stale_build_tree(tmp_path, sdist):
    """`pip install .` in a checkout with a build/fork-tree left from an earlier build: an edit there does not reach
    the wheel, and a wrong TRL_FORK_SDIST fails the build instead of being ignored."""
    clone = tmp_path / "trl-fork"
    run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(clone)], check=True)
    wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w"]
    run(
        [*wheel, str(tmp_path / "first"), str(clone / "lines" / "0.16.1")],
        env={"TRL_FORK_SDIST": str(sdist)},
        check=True,
    )
    tree = clone / "lines" / "0.16.1" / "build" / "fork-tree"
    (tree / "trl" / "__init__.py").write_text((tree / "trl" / "__init__.py").read_text() + "STALE = True\n")

    corrupt = tmp_path / BASE.sdist
    corrupt.write_bytes(sdist.read_bytes() + b"\0")
    failed = run(
        [*wheel, str(tmp_path / "bad"), str(clone / "lines" / "0.16.1")], env={"TRL_FORK_SDIST": str(corrupt)}
    )
    assert failed.returncode != 0 and "refusing to build on an unverified base" in failed.stdout + failed.stderr
    assert not list(tmp_path.glob("bad/*.whl"))

    built = run(
        [*wheel, str(tmp_path / "second"), str(clone / "lines" / "0.16.1"), "-v"],
        env={"TRL_FORK_SDIST": str(sdist)},
        check=True,
    )
    assert "files were changed there since it was built: trl/__init__.py" in built.stdout + built.stderr
    (second,) = (tmp_path / "second").glob("trl-*.whl")
    with zipfile.ZipFile(second) as archive:
        assert b"STALE" not in archive.read("trl/__init__.py")
    # nothing changed since: reused (the build's own rewrite of trl.egg-info/ in the tree is no edit)
    again = run(
        [*wheel, str(tmp_path / "third"), str(clone / "lines" / "0.16.1"), "-v"],
        env={"TRL_FORK_SDIST": str(sdist)},
        check=True,
    )
    assert f"reusing {tree}" in again.stderr + again.stdout and "rebuilding" not in again.stderr + again.stdout


def test_no_patch_test_imports_a_sibling_test_module_as_a_top_level_module():
    """`from test_prepare_fsdp import ...` works where pytest puts tests/ on sys.path (a tree without
    tests/__init__.py) and fails in upstream's tests package: a patch's tests import a sibling relatively."""
    offenders = []
    for path in ALL_PATCHES:
        current = None
        for line in path.read_text().splitlines():
            if line.startswith("diff --git "):
                current = line.split()[2]
            elif current and current.startswith("a/tests/") and re.match(r"\+\s*(from|import) test_\w+", line):
                offenders.append(f"{path.name}: {current[2:]}: {line[1:].strip()}")
    assert not offenders, "\n".join(offenders)


def pr_size_problem(text: str) -> str | None:
    """Why a patch (its file's text) is larger than one reviewable PR, or None: at most 420 added lines outside
    tests/ and 8 files, unless a ``Spans-Files: N (why)`` trailer (one line, in the header) declares a mechanical
    change across trainers or scripts (#38 item 12): then N must be the patch's file count, 9 to 16, and the reason
    must be given; the line limit stays."""
    files = re.findall(r"^diff --git a/(\S+) ", text, flags=re.M)
    added, current = 0, None
    for line in text.splitlines():
        if line.startswith("diff --git "):
            current = line.split()[2]
        elif line.startswith("+") and not line.startswith("+++") and not current.startswith("a/tests/"):
            added += 1
    if added > 420:
        return f"{added} added non-test lines"
    declared = re.search(r"^Spans-Files: (\d+) \((.+)\)$", text.split("\ndiff --git ")[0], flags=re.M)
    if declared and int(declared.group(1)) != len(files):
        return f"Spans-Files declares {declared.group(1)} files, the diff has {len(files)}"
    if declared and not 8 < len(files) <= 16:
        return f"Spans-Files on a patch of {len(files)} files (it is for 9 to 16)"
    if len(files) > 8 and not declared:
        return f"{len(files)} files and no Spans-Files trailer saying why"
    return None


def test_a_patch_over_the_file_limit_must_declare_why():
    def patch(n_files, trailer=""):
        diffs = "".join(f"diff --git a/trl/f{i}.py b/trl/f{i}.py\n+x = {i}\n" for i in range(n_files))
        return f"Subject: x\n\nBody.\n\nForwarded: no\n{trailer}---\n{diffs}"

    assert pr_size_problem(patch(8)) is None
    assert pr_size_problem(patch(9)) == "9 files and no Spans-Files trailer saying why"
    assert pr_size_problem(patch(9, "Spans-Files: 9 (the same call in nine trainers)\n")) is None
    assert pr_size_problem(patch(9, "Spans-Files: 12 (the same call)\n")) == (
        "Spans-Files declares 12 files, the diff has 9"
    )
    assert pr_size_problem(patch(9, "Spans-Files: 9\n")) == "9 files and no Spans-Files trailer saying why"
    assert pr_size_problem(patch(8, "Spans-Files: 8 (x)\n")) == "Spans-Files on a patch of 8 files (it is for 9 to 16)"
    assert (
        pr_size_problem(patch(17, "Spans-Files: 17 (x)\n")) == "Spans-Files on a patch of 17 files (it is for 9 to 16)"
    )
    big = patch(1).replace("+x = 0\n", "+x = 0\n" * 421)
    assert pr_size_problem(big.replace("Forwarded: no\n", "Forwarded: no\nSpans-Files: 1 (x)\n")) == (
        "421 added non-test lines"
    )


def test_every_patch_is_one_reviewable_pr():
    """At most about 400 added lines outside tests/ and 8 files per patch, or more files declared with Spans-Files
    (CONTRIBUTING.md, "Patches are PRs")."""
    problems = [f"{path.name}: {why}" for path in ALL_PATCHES if (why := pr_size_problem(path.read_text()))]
    assert not problems, "\n".join(problems)
