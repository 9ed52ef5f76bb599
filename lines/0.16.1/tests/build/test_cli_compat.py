"""Every command-line option of TRL 0.16.1 still parses, with the same meaning, on the fork (#13).

The fork may add options (`--disable_unwrapping_for_generation`, `--vllm_sync_bucket_size_mb`) but must not drop or
change one: an earlier version of the series turned `ds3_gather_for_generation` into an `Optional[bool]`, which made
`HfArgumentParser` drop `--no_ds3_gather_for_generation`. This test dumps, on the pristine base and on the fork, the
options of every `trl` subcommand and of every trainer config class (as `TrlParser` builds them), then compares.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "tools"))

import forkbuild  # noqa: E402
import prove  # noqa: E402


sys.path.insert(0, str(ROOT / "tests"))
from harness.cli_options import added, dump_tree, problems  # noqa: E402


def dump(tree: str, tmp_path: Path) -> dict:
    return dump_tree(prove.tree_for(tree, forkbuild.get_line("0.16.1")), tmp_path / f"{tree}.json")


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cli")
    return dump("base", tmp_path), dump("fork", tmp_path)


def test_every_base_option_parses_the_same_on_the_fork(options):
    base, fork = options
    assert len(base) >= 20, f"too few parsers dumped from the base: {sorted(base)}"
    found = problems(base, fork)
    assert not found, "\n".join(found)


def test_the_fork_only_adds_its_documented_options(options):
    base, fork = options
    new = added(base, fork)
    expected = {
        "--disable_unwrapping_for_generation",
        "--disable-unwrapping-for-generation",
        "--vllm_sync_bucket_size_mb",
        "--vllm-sync-bucket-size-mb",
        # GRPO's requests to `trl vllm-serve` and the server's checks (patches 0024, 0025, 0027)
        "--vllm_server_request_timeout",
        "--vllm-server-request-timeout",
        "--vllm_server_verify_weights",
        "--vllm-server-verify-weights",
        "--check_weights",
        "--check-weights",
        "--no_check_weights",
        "--no-check-weights",
        # `trl vllm-serve`'s token (patch 0041)
        "--api_key",
        "--api-key",
        # the memory budget of keep-sharded generation (patches 0031, 0032)
        "--generation_gather_budget_mb",
        "--generation-gather-budget-mb",
    }
    assert new <= expected, sorted(new - expected)
    assert "--no_ds3_gather_for_generation" in fork["GRPOConfig"]


def test_readme_lists_every_option_the_fork_adds(options):
    """README's "If you opt into nothing" names every option the fork adds (it once left out
    generation_gather_budget_mb); `--no_x` and dashed spellings count as `x`."""
    base, fork = options
    names = {option.lstrip("-").replace("-", "_") for option in added(base, fork)}
    names = {name[3:] if name.startswith("no_") and name[3:] in names else name for name in names}
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## If you opt into nothing", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())  # the list wraps over lines
    missing = sorted(name for name in names if f"`{name}`" not in section and f"--{name}`" not in section)
    assert not missing, f"README 'If you opt into nothing' does not name: {missing}"
