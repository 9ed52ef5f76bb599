"""The trainer x backend matrix on CUDA (skipped, with a reason, when no GPU is visible).

Same worker and checks as the CPU matrix, launched with the user configs in ``examples/accelerate_configs/``
(only the process count, the port and the tiny model's ZeRO-3 persistence threshold are changed), no CPU
shim.  With one GPU each backend runs at world size 1: FSDP1/FSDP2 then leave GRPO's reference model on the
CPU while the policy is on ``cuda:0`` (the seed's device mismatch), which ``placement`` and ``trains`` show
for real.  ``dataparallel`` forces ``n_gpu = 2`` as on the CPU (``DataParallel`` over one device).
Expectations: ``expectations.py`` (``gpu_expected``; derived, not yet measured on a GPU).
"""

import pytest
from expectations import gpu_expected
from harness.launcher import gpu_count
from harness.marks import marks_for
from harness.matrix import BACKEND_NAMES, CHECK_FUNCTIONS, CHECKS, TRAINERS


def _params():
    expected = gpu_expected(max(1, min(2, gpu_count())))
    for backend in BACKEND_NAMES:
        for trainer in TRAINERS:
            for check in CHECKS:
                marks = marks_for(expected.get((trainer, backend, check), ()))
                yield pytest.param(trainer, backend, check, marks=marks, id=f"gpu-{trainer}-{backend}-{check}")


@pytest.mark.gpu
@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("trainer,backend,check", list(_params()))
def test_matrix_gpu(trainer, backend, check, matrix_runner):
    n_gpus = gpu_count()
    if n_gpus == 0:
        pytest.skip("needs a CUDA GPU")
    num_processes = min(2, n_gpus)  # one rank per GPU (NCCL refuses two ranks on one device)
    run = matrix_runner.run(trainer, backend, device="cuda", num_processes=num_processes)
    CHECK_FUNCTIONS[check](run)
