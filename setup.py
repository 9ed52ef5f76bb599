"""Install the TRL fork: the pinned TRL release with the patch series of this repository applied.

The repository holds no upstream source. Building (``pip install .``, ``pip install git+...``) fetches the pinned
sdist through pip, verifies its sha256, applies ``patches/series`` (see ``tools/forkbuild.py``) and packages the
result. An editable install (``pip install -e .``) points at the development tree ``trl-src/`` instead, which is
materialized on first use and then left to the developer (CONTRIBUTING.md).
"""

import re
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.editable_wheel import editable_wheel


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "tools"))

import forkbuild  # noqa: E402


# Upper bounds we have tested TRL 0.16.1 with. A fresh resolve without them picks releases that 0.16.1 does not run
# on (transformers 5.x, for one). Raise a bound only after running `make test` and `make test-dist` with the new
# release.
TESTED_UPPER_BOUNDS = {
    "transformers": "<4.52",
    "accelerate": "<1.7",
    "datasets": "<4",
    "peft": "<0.16",
    "deepspeed": "<0.17",
    # The first vLLM release that breaks what 0.16.1's vLLM paths call: from 0.8.2 on, a custom `worker_cls` no
    # longer falls back to vLLM's V0 engine, so `trl vllm-serve`'s V0 WeightSyncWorker lands on V1 and fails. Checked
    # on the wheels by tests/build/test_vllm_contract.py; the table per release is in docs/vllm_version.md.
    "vllm": "<0.8.2",
}
# What the fork's own test suite needs on top of upstream's `test` extra.
# fastapi, uvicorn and requests: the tests run `trl vllm-serve`'s app (with a stand-in engine) and its client.
FORK_EXTRAS = {"test": ["pytest-timeout", "tokenizers", "fastapi", "uvicorn", "requests"]}


def bounded(requirement: str) -> str:
    match = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$", requirement)
    name, extras, spec, marker = match.group(1), match.group(2) or "", match.group(3), match.group(4) or ""
    bound = TESTED_UPPER_BOUNDS.get(name.lower())
    if bound:
        spec = f"{spec},{bound}" if spec else bound
    return f"{name}{extras}{spec}{marker}"


def fork_dependencies(metadata):
    install_requires = [bounded(r) for r in metadata["REQUIRED_PKGS"]]
    extras = {key: [bounded(r) for r in reqs] for key, reqs in metadata["EXTRAS"].items() if key != "dev"}
    for key, reqs in FORK_EXTRAS.items():
        extras[key] = extras.get(key, []) + reqs
    extras["dev"] = sorted({r for key, reqs in extras.items() for r in reqs} | {"ruff"})
    return install_requires, extras


class EditableWheel(editable_wheel):
    """Editable installs import from the development tree (trl-src/), where patches are edited with git."""

    def finalize_options(self):
        tree = forkbuild.dev_tree()
        self.distribution.package_dir = {"": tree.relative_to(HERE).as_posix()}
        self.distribution.packages = find_packages(str(tree), include=["trl", "trl.*"])
        super().finalize_options()


try:
    TREE = forkbuild.build_tree()
    BASE = forkbuild.load_base()
    N_PATCHES = len(forkbuild.read_series())
    METADATA = forkbuild.upstream_metadata(TREE)
except forkbuild.BuildError as exc:
    sys.exit(f"error: building the TRL fork failed: {exc}")

if METADATA["__version__"] != BASE.version:
    sys.exit(f"error: the patched setup.py says version {METADATA['__version__']}, patches/base.json {BASE.version}")
INSTALL_REQUIRES, EXTRAS = fork_dependencies(METADATA)

setup(
    name="trl",
    version=forkbuild.fork_version(BASE, N_PATCHES),
    description="TRL 0.16.1 with fixes for distributed online RL training (FSDP, DeepSpeed ZeRO-3, DataParallel, vLLM).",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    url="https://github.com/huggingface/trl",
    classifiers=[
        "Development Status :: 2 - Pre-Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Programming Language :: Python :: 3",
    ],
    package_dir={"": TREE.relative_to(HERE).as_posix()},
    packages=find_packages(str(TREE), include=["trl", "trl.*"]),
    package_data={"trl": ["templates/*.md"]},
    include_package_data=False,
    entry_points={"console_scripts": ["trl=trl.cli:main"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    python_requires=">=3.9",
    zip_safe=False,
    cmdclass={"editable_wheel": EditableWheel},
)
