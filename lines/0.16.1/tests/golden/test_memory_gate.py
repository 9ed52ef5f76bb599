"""Do no harm, in memory: on default paths the fork generates within the memory TRL 0.16.1 generates in (issue 25).

The golden gate compares numbers and the upstream suite behaviour; neither measures memory, and the fork once made
FSDP2 generation gather the whole model for users who set nothing (0.16.1: one module at a time). This gate runs
``benchmarks/generation_memory.py --default-only`` on the pristine base and on the fork (trees of ``tools/prove.py``)
with the same tiny Qwen2 model on 2 gloo ranks: ``unwrap_model_for_generation(model, accelerator)`` entered as
0.16.1's trainers enter it, then greedy ``generate()``. The probe samples, at every module's forward, the bytes of
every storage holding parameter data (shards, gathered parameters, FSDP2 all-gather outputs).

Per backend and rank: the fork's peak must not exceed the base's by more than ``SLACK`` and its tokens must equal the
plain model's where the base's do. FSDP1 is not compared: 0.16.1 cannot generate under FSDP1 at all (``'weight' must
be 2-D``, fixed by patch 0015), so there is no base figure.

    pytest -m golden lines/0.16.1/tests/golden/test_memory_gate.py      # part of `make golden LINE=0.16.1`
"""

import pytest
from harness.golden import tree_paths
from harness.memory_gate import check_default_path_memory, measure


pytestmark = [pytest.mark.golden, pytest.mark.slow, pytest.mark.dist]

# FSDP2 (0.16.1: FSDP2's own hooks, one module at a time) and ZeRO-3 with DeepSpeed releasing each module after its
# forward (0.16.1: the whole model gathered once for generation)
BACKENDS = ("fsdp2", "zero3-release")


@pytest.fixture(scope="module")
def peaks(tmp_path_factory):
    return measure(tree_paths("0.16.1"), BACKENDS, tmp_path_factory)


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_path_generation_memory(peaks, backend):
    check_default_path_memory(peaks, backend, "TRL 0.16.1")
