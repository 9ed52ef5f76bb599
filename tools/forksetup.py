"""What every line's ``setup.py`` shares: build the line's tree, bound its dependencies, call ``setup()``.

Each line (``lines/<version>/``) has a short ``setup.py`` that holds what is its own (the dependency bounds it was
tested with, its description) and calls :func:`fork_setup`; the repository's root ``setup.py`` runs the default line's
(``SETUP_DIR``). Building (``pip install .``, ``pip install git+...[#subdirectory=lines/<version>]``) fetches the
line's pinned sdist through pip, verifies its sha256, applies the line's ``patches/series`` (``tools/forkbuild.py``)
and packages the result. An editable install points at the line's development tree (``trl-src/`` next to its
``setup.py``) instead.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.editable_wheel import editable_wheel


sys.path.insert(0, str(Path(__file__).resolve().parent))
import forkbuild  # noqa: E402


# The directory setup() runs in: the line's own folder, unless the root setup.py (the default line) says otherwise.
SETUP_DIR: Path | None = None


def bounded(requirement: str, bounds: dict[str, str]) -> str:
    """``requirement`` with the tested upper bound of its package, if ``bounds`` has one, added to its specifier."""
    match = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$", requirement)
    name, extras, spec, marker = match.group(1), match.group(2) or "", match.group(3), match.group(4) or ""
    bound = bounds.get(name.lower())
    if bound:
        spec = f"{spec},{bound}" if spec else bound
    return f"{name}{extras}{spec}{marker}"


def fork_dependencies(metadata: dict, bounds: dict[str, str], fork_extras: dict[str, list[str]]):
    """``install_requires`` and ``extras_require``: upstream's, bounded, plus the fork's extras. ``dev``: upstream's
    own ``dev`` extra plus the fork's extras where upstream declares one (TRL 1.x), else every extra (TRL 0.16.1's
    setup.py builds its ``dev`` in code, which the fork reproduces)."""
    install_requires = [bounded(r, bounds) for r in metadata["REQUIRED_PKGS"]]
    extras = {key: [bounded(r, bounds) for r in reqs] for key, reqs in metadata["EXTRAS"].items()}
    for key, reqs in fork_extras.items():
        extras[key] = extras.get(key, []) + reqs
    if "dev" in metadata["EXTRAS"]:
        extras["dev"] = list(dict.fromkeys(extras["dev"] + [r for reqs in fork_extras.values() for r in reqs]))
    else:
        extras["dev"] = sorted({r for key, reqs in extras.items() for r in reqs} | {"ruff"})
    return install_requires, extras


def fork_setup(
    project: Path,
    *,
    description: str,
    bounds: dict[str, str],
    fork_extras: dict[str, list[str]],
    python_requires: str,
    package_data: dict[str, list[str]],
) -> None:
    """``setup()`` for the line whose ``setup.py`` lives in ``project``."""
    project = Path(project).resolve()
    setup_dir = (SETUP_DIR or project).resolve()
    minimum = re.fullmatch(r">=\s*(\d+)\.(\d+)", python_requires.strip())
    if minimum and sys.version_info[:2] < (int(minimum.group(1)), int(minimum.group(2))):
        # pip runs setup.py before it reads python_requires from the metadata: say it here, in one line
        old = forkbuild.LINES_DIR / "0.16.1"
        hint = (
            "; the 0.16.1 line runs on Python 3.9+: add #subdirectory=lines/0.16.1 to the URL"
            if project != old
            else ""
        )
        sys.exit(
            f"error: this line of the TRL fork needs Python {python_requires.strip()[2:].strip()} or newer "
            f"(this is Python {sys.version_info[0]}.{sys.version_info[1]}){hint}"
        )
    line = next(
        (forkbuild.get_line(n) for n in forkbuild.known_lines() if forkbuild.get_line(n).project == project), None
    )
    if line is None:
        sys.exit(f"error: {project} is not a line of the TRL fork (lines: {', '.join(forkbuild.known_lines())})")

    class EditableWheel(editable_wheel):
        """Editable installs import from the line's development tree, where patches are edited with git."""

        def finalize_options(self):
            tree = forkbuild.dev_tree(line.patches, line.dev_tree)
            self.distribution.package_dir = {"": tree.relative_to(setup_dir).as_posix()}
            self.distribution.packages = find_packages(str(tree), include=["trl", "trl.*"])
            super().finalize_options()

    try:
        tree = forkbuild.build_tree(line.patches, line.build_tree)
        base = forkbuild.load_base(line.patches)
        n_patches = len(forkbuild.read_series(line.patches))
        metadata = forkbuild.upstream_metadata(tree)
    except forkbuild.BuildError as exc:
        sys.exit(f"error: building the TRL fork ({line.name} line) failed: {exc}")
    if metadata["__version__"] != base.version:
        sys.exit(
            f"error: the patched tree says version {metadata['__version__']}, {line.patches}/base.json {base.version}"
        )
    install_requires, extras = fork_dependencies(metadata, bounds, fork_extras)

    setup(
        name="trl",
        version=forkbuild.fork_version(base, n_patches),
        description=description,
        long_description=(forkbuild.ROOT / "README.md").read_text(encoding="utf-8"),
        long_description_content_type="text/markdown",
        license="Apache-2.0",
        url="https://github.com/huggingface/trl",
        classifiers=[
            "Development Status :: 2 - Pre-Alpha",
            "Intended Audience :: Developers",
            "Intended Audience :: Science/Research",
            "Programming Language :: Python :: 3",
        ],
        package_dir={"": tree.relative_to(setup_dir).as_posix()},
        packages=find_packages(str(tree), include=["trl", "trl.*"]),
        package_data=package_data,
        include_package_data=False,
        entry_points={"console_scripts": ["trl=trl.cli:main"]},
        install_requires=install_requires,
        extras_require=extras,
        python_requires=python_requires,
        zip_safe=False,
        cmdclass={"editable_wheel": EditableWheel},
    )
