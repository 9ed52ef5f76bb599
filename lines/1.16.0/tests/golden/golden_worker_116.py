"""One golden-equivalence run on the 1.16.0 line: the shared worker (``tests/harness/golden_worker.py``: train a few
steps, record every logged value and the trained weights) with the 1.16.0 trainers, built as the
1.16.0 matrix builds them (``lines/1.16.0/tests/dist/matrix_worker.py``: tiny fixtures, float32 on CPU, no fork
option set). The tree (pristine TRL 1.16.0 or the fork) is chosen by ``PYTHONPATH``.
"""

import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path[:0] = [str(ROOT / "tests"), str(HERE.parent / "dist")]

import matrix_worker  # noqa: E402
from harness import golden_worker  # noqa: E402


TRAINERS = ("grpo", "rloo", "online_dpo", "gkd", "dpo", "kto")


class _Facts:
    """What the matrix builder records about a trainer; the golden run keeps none of it."""

    def __init__(self):
        self.data, self.trainer = {"prompts": []}, None

    def flush(self):
        pass


def build(kind, manifest, out_dir, steps):
    facts = _Facts()
    facts.trainer = matrix_worker.build_trainer(kind, manifest, out_dir, steps, facts)
    return facts.trainer


if __name__ == "__main__":
    golden_worker.main(build=build, trainers=TRAINERS)
