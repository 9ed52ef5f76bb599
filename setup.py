"""Install the TRL fork's default line (``tools/forkbuild.py``'s ``DEFAULT_LINE``: TRL 1.16.0) from the repository's
root, so that the bare URL installs it:

    pip install "trl[vllm] @ git+<this repository>"                              # TRL 1.16.0 + the fork's patches
    pip install "trl @ git+<this repository>#subdirectory=lines/0.16.1"          # the 0.16.1 line

Each line is a project of its own in ``lines/<version>/`` (its ``setup.py`` holds its pins). This file runs the
default line's ``setup.py`` with the root as the directory ``setup()`` works in: the same pins, the same package.
"""

import runpy
import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "tools"))

import forkbuild  # noqa: E402
import forksetup  # noqa: E402


forksetup.SETUP_DIR = HERE  # setup() runs here, not in the line's folder: its paths are relative to this directory
try:
    runpy.run_path(str(forkbuild.get_line().project / "setup.py"), run_name="__main__")
finally:
    forksetup.SETUP_DIR = None
