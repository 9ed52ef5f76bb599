"""Do no harm, in memory, on the 1.16.0 line: with no fork option set (no `gather_budget_mb`), generation holds no
more parameter memory on the fork than on TRL 1.16.0, under FSDP1, FSDP2 and ZeRO-3 (issue 29).

The shared gate (``tests/harness/memory_gate.py``) with this line's trees: ``benchmarks/generation_memory.py
--default-only`` runs ``unwrap_model_for_generation(model, accelerator)`` as TRL 1.16.0's trainers enter it (FSDP1: the
root unsharded with ``summon_full_params(recurse=False)``), then greedy ``generate()``, on 2 gloo ranks.

    make golden LINE=1.16.0
"""

import pytest
from harness.golden import tree_paths
from harness.memory_gate import check_default_path_memory, measure


pytestmark = [pytest.mark.golden, pytest.mark.slow, pytest.mark.dist]

# FSDP1 and FSDP2 (one layer gathered at each forward), ZeRO-3 (the whole model gathered once), and ZeRO-3 with
# DeepSpeed releasing each module after its forward
BACKENDS = ("fsdp1", "fsdp2", "zero3", "zero3-release")


@pytest.fixture(scope="module")
def peaks(tmp_path_factory):
    return measure(tree_paths("1.16.0"), BACKENDS, tmp_path_factory)


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_path_generation_memory(peaks, backend):
    check_default_path_memory(peaks, backend, "TRL 1.16.0")
