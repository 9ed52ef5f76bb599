"""Every command-line option of TRL 1.16.0 still parses, with the same meaning, on the fork's 1.16.0 line (#26).

Dumps, on the pristine base and on the fork (trees built by tools/prove.py), the options of every `trl` training
command and `trl vllm-serve` (each script's `make_parser()`, which is what `trl <command>` parses with) and of every
trainer config class, including Online DPO's and GKD's in `trl.experimental`; the fork may add options, never drop or
change one. The comparison is the 0.16.1 line's (tests/harness/cli_options.py).
"""

import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
import forkbuild  # noqa: E402
import prove  # noqa: E402
from harness.cli_options import added, dump_tree, problems  # noqa: E402


LINE = forkbuild.get_line("1.16.0")
# Options the 1.16.0 line adds; each one added must be named here and in README.
FORK_OPTIONS = {
    "--generation_gather_budget_mb",
    "--generation-gather-budget-mb",
    "--vllm_server_request_timeout",
    "--vllm-server-request-timeout",
    "--api_key",  # `trl vllm-serve`'s token (patch 0021)
    "--api-key",
    "--vllm_sync_check_tolerance",  # the check that vLLM has the policy's weights (patch 0025)
    "--vllm-sync-check-tolerance",
    "--weight_transfer_backend",  # `trl vllm-serve`: the weights over gloo (patch 0027)
    "--weight-transfer-backend",
}


def dump(tree: str, tmp_path: Path) -> dict:
    return dump_tree(prove.tree_for(tree, LINE), tmp_path / f"{tree}.json")


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cli")
    return dump("base", tmp_path), dump("fork", tmp_path)


def test_every_base_option_parses_the_same_on_the_fork(options):
    base, fork = options
    for name in (
        "trl grpo",
        "trl rloo",
        "trl dpo",
        "trl kto",
        "trl vllm-serve",
        "GRPOConfig",
        "OnlineDPOConfig",
        "GKDConfig",
    ):
        assert base.get(name), f"{name}: nothing dumped from the base"
    found = problems(base, fork)
    assert not found, "\n".join(found)


def test_the_fork_only_adds_its_documented_options(options):
    base, fork = options
    assert added(base, fork) <= FORK_OPTIONS, sorted(added(base, fork) - FORK_OPTIONS)
