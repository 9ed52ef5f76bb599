"""Every command-line option of TRL 0.16.1 still parses, with the same meaning, on the fork (#13).

The fork may add options (`--disable_unwrapping_for_generation`, `--vllm_sync_bucket_size_mb`) but must not drop or
change one: an earlier version of the series turned `ds3_gather_for_generation` into an `Optional[bool]`, which made
`HfArgumentParser` drop `--no_ds3_gather_for_generation`. This test dumps, on the pristine base and on the fork, the
options of every `trl` subcommand and of every trainer config class (as `TrlParser` builds them), then compares.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import prove  # noqa: E402


DUMP = r"""
import argparse, json, sys
import trl
from trl.scripts.utils import TrlParser

def describe(parser):
    options = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or not action.option_strings:
            continue
        default = action.default
        for option in action.option_strings:
            options[option] = {
                "dest": action.dest,
                "action": type(action).__name__,
                "default": repr(default),
                "nargs": repr(action.nargs),
                "const": repr(action.const),
                "choices": repr(sorted(map(repr, action.choices))) if action.choices else None,
                "type": getattr(action.type, "__name__", repr(action.type)),
            }
    return options

out = {}
root = TrlParser(prog="trl")
subparsers = root.add_subparsers(dest="command", parser_class=TrlParser)
from trl.scripts import chat, dpo, grpo, kto, sft, vllm_serve
for module in (chat, dpo, grpo, kto, sft, vllm_serve):
    module.make_parser(subparsers)
for name, parser in subparsers.choices.items():
    out["trl " + name] = describe(parser)
for name in sorted(dir(trl)):
    if name.endswith("Config") and isinstance(getattr(trl, name), type):
        cls = getattr(trl, name)
        if hasattr(cls, "__dataclass_fields__") and "output_dir" in cls.__dataclass_fields__:
            out[name] = describe(TrlParser((cls,)))
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


def dump(tree: str, tmp_path: Path) -> dict:
    path = prove.tree_for(tree)
    env = dict(os.environ, PYTHONPATH=str(path), HF_HUB_OFFLINE="1")
    out = tmp_path / f"{tree}.json"
    result = subprocess.run(
        [sys.executable, "-c", DUMP, str(out)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cli")
    return dump("base", tmp_path), dump("fork", tmp_path)


def test_every_base_option_parses_the_same_on_the_fork(options):
    base, fork = options
    assert len(base) >= 20, f"too few parsers dumped from the base: {sorted(base)}"
    problems = []
    for parser, base_options in base.items():
        fork_options = fork.get(parser)
        if fork_options is None:
            problems.append(f"{parser}: missing on the fork")
            continue
        for option, described in base_options.items():
            if option not in fork_options:
                problems.append(f"{parser} {option}: dropped")
            elif fork_options[option] != described:
                problems.append(f"{parser} {option}: {described} -> {fork_options[option]}")
    assert not problems, "\n".join(problems)


def test_the_fork_only_adds_its_documented_options(options):
    base, fork = options
    added = {option for parser, opts in fork.items() for option in opts if option not in base.get(parser, {})}
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
        # the memory budget of keep-sharded generation (patches 0031, 0032)
        "--generation_gather_budget_mb",
        "--generation-gather-budget-mb",
    }
    assert added <= expected, sorted(added - expected)
    assert "--no_ds3_gather_for_generation" in fork["GRPOConfig"]


def test_readme_lists_every_option_the_fork_adds(options):
    """README's "If you opt into nothing" names every option the fork adds (it once left out
    generation_gather_budget_mb); `--no_x` and dashed spellings count as `x`."""
    base, fork = options
    added = {option for parser, opts in fork.items() for option in opts if option not in base.get(parser, {})}
    names = {option.lstrip("-").replace("-", "_") for option in added}
    names = {name[3:] if name.startswith("no_") and name[3:] in names else name for name in names}
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## If you opt into nothing", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())  # the list wraps over lines
    missing = sorted(name for name in names if f"`{name}`" not in section and f"--{name}`" not in section)
    assert not missing, f"README 'If you opt into nothing' does not name: {missing}"
