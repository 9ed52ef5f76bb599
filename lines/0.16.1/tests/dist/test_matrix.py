"""The trainer x backend matrix on CPU: 2 gloo ranks per backend (DataParallel: one process, n_gpu=2).

Every cell is one launch of ``matrix_worker.py``; the four checks of a cell (``trains``, ``wrapping``,
``placement``, ``frozen``; see ``harness/matrix.py``) read that launch's facts.  Cells known broken on the
pristine base carry strict marks keyed by the fixing issue (``expectations.py``).

    pytest lines/0.16.1/tests/dist/test_matrix.py -m "dist and not slow"      # fast subset
    pytest lines/0.16.1/tests/dist/test_matrix.py -k "grpo and fsdp1"          # one cell
"""

import pytest
from expectations import CPU_EXPECTED, SLOW_CELLS
from harness.marks import marks_for
from harness.matrix import BACKEND_NAMES, CHECK_FUNCTIONS, CHECKS, TRAINERS


def _params():
    for backend in BACKEND_NAMES:
        for trainer in TRAINERS:
            slow = [pytest.mark.slow] if (trainer, backend) in SLOW_CELLS else []
            for check in CHECKS:
                marks = slow + marks_for(CPU_EXPECTED.get((trainer, backend, check), ()))
                yield pytest.param(trainer, backend, check, marks=marks, id=f"{trainer}-{backend}-{check}")


@pytest.mark.dist
@pytest.mark.parametrize("trainer,backend,check", list(_params()))
def test_matrix(trainer, backend, check, matrix_runner):
    run = matrix_runner.run(trainer, backend, device="cpu", num_processes=2)
    CHECK_FUNCTIONS[check](run)
