"""Fixtures the build tests share."""

import subprocess
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone of the committed state of this repository (what `pip install git+...` sees)."""
    dest = tmp_path_factory.mktemp("clone") / "trl-fork"
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(dest)], check=True, capture_output=True)
    return dest
