"""Strict marks for matrix cells that are known broken on the pristine base, keyed by the fixing issue.

A cell's expectation is a list of :class:`Broken` entries.  An entry is *active* while its issue is not in
the fork's ``trl._fork_info.FIXED_ISSUES`` (no ``_fork_info`` file, as in pristine TRL: nothing fixed); a
known limitation (no issue) is always active.  While any entry is active the cell is
``xfail(strict=True, raises=KnownFailure)``: it must fail, and fail *the way the entry says*
(``harness.pytest_plugin`` turns a failure whose text matches an active entry's regex into ``KnownFailure``;
any other failure stays a plain failure).  Once every entry's issue is fixed the mark disappears and the
cell must pass.  So a cell that starts passing without its fix, keeps failing with it, or fails for a new
reason, fails the run.
"""

import functools
import importlib.util
import os
import re
from dataclasses import dataclass

import pytest


class KnownFailure(AssertionError):
    """A cell failed exactly as one of its active marks predicts."""


class CellFailure(AssertionError):
    """A check found problems; each problem must match an active mark for the cell to count as known."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("\n".join(f"- {p}" for p in self.problems))


@dataclass(frozen=True)
class Broken:
    issues: frozenset  # issues whose fixes make this entry go away; empty: a known limitation
    match: str  # regex searched (re.S) in the failure text
    why: str = ""

    @property
    def label(self):
        if not self.issues:
            return f"known limitation: {self.why}"
        return f"issue {'+'.join(f'#{i}' for i in sorted(self.issues))}: {self.why}"

    def active(self, fixed):
        return not self.issues or not self.issues <= fixed


def known_broken(*issues, match, why=""):
    """Broken on the base until all of ``issues`` are fixed; fails with text matching ``match``."""
    if not issues:
        raise ValueError("known_broken needs the issue number(s) of the fix; use limitation() otherwise")
    return Broken(frozenset(issues), match, why)


def limitation(match, why):
    """A cell no open issue fixes (a backend the trainer never supported)."""
    return Broken(frozenset(), match, why)


@functools.cache
def fixed_issues():
    """``FIXED_ISSUES`` of the ``trl`` that workers import (found like Python finds it, not imported)."""
    override = os.environ.get("TRL_HARNESS_FIXED_ISSUES")  # e.g. "5,7": try marks without a build
    if override is not None:
        return frozenset(int(x) for x in override.replace(",", " ").split())
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    for location in spec.submodule_search_locations:
        path = os.path.join(location, "_fork_info.py")
        if os.path.isfile(path):
            namespace = {}
            with open(path) as f:
                exec(compile(f.read(), path, "exec"), namespace)
            return frozenset(namespace.get("FIXED_ISSUES", ()))
    return frozenset()


def active_entries(entries, fixed=None):
    fixed = fixed_issues() if fixed is None else fixed
    return [e for e in entries if e.active(fixed)]


def marks_for(entries, fixed=None):
    """pytest marks for a cell with these expectation entries (none when every fix is in)."""
    active = active_entries(entries, fixed)
    if not active:
        return []
    reason = " | ".join(e.label for e in active)
    return [
        pytest.mark.xfail(strict=True, raises=KnownFailure, reason=reason),
        pytest.mark.known_failure(patterns=tuple(e.match for e in active), reason=reason),
    ]


def classify(exc, patterns):
    """Return a KnownFailure if ``exc`` is explained by ``patterns``, else None."""
    if isinstance(exc, CellFailure):
        texts = exc.problems
    else:
        texts = [f"{type(exc).__name__}: {exc}"]
    unexplained = [t for t in texts if not any(re.search(p, t, re.S) for p in patterns)]
    if unexplained:
        return None
    return KnownFailure(f"known failure, as marked ({len(texts)} problem(s)):\n" + "\n".join(texts))
