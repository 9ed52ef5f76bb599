"""The 1.16.0 line's trainer x backend matrix on CPU: one 2-rank launch per backend trains every trainer.

Each (trainer, backend) cell has five checks (``trains``, ``wrapping``, ``placement``, ``frozen``, ``saves``;
``matrix116.py``),
read from that backend's launch (cached for the session).  Checks that fail on pristine TRL 1.16.0 are strict
expected failures keyed by the fixing issue (``expectations116.py``).

    pytest lines/1.16.0/tests/dist/test_matrix_116.py                       # 5 launches, 200 checks
    pytest lines/1.16.0/tests/dist/test_matrix_116.py -k "fsdp1"            # one launch
"""

import pytest
from expectations116 import EXPECTED
from harness.marks import marks_for
from matrix116 import BACKEND_NAMES, CHECK_FUNCTIONS, CHECKS, TRAINERS


def _params():
    for backend in BACKEND_NAMES:
        for trainer in TRAINERS:
            for check in CHECKS:
                marks = marks_for(EXPECTED.get((trainer, backend, check), ()))
                yield pytest.param(trainer, backend, check, marks=marks, id=f"{trainer}-{backend}-{check}")


@pytest.mark.dist
@pytest.mark.parametrize("trainer,backend,check", list(_params()))
def test_matrix116(trainer, backend, check, matrix116):
    CHECK_FUNCTIONS[check](matrix116.run(trainer, backend))
