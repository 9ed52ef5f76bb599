"""The options of every `trl` command and trainer config class, as TRL's parsers build them (CLI compatibility).

    PYTHONPATH=<tree> python tests/harness/cli_options.py out.json

dumps them for the `trl` importable from ``<tree>`` (TRL 0.16.1 or 1.16.0: each builds its command parsers its own
way); ``problems(base, fork)`` lists what the fork drops or changes, ``added(base, fork)`` what it adds. Used by
``lines/0.16.1/tests/build/test_cli_compat.py`` and ``lines/1.16.0/tests/build/test_cli_compat.py``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path


def describe(parser: argparse.ArgumentParser) -> dict:
    options = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or not action.option_strings:
            continue
        for option in action.option_strings:
            options[option] = {
                "dest": action.dest,
                "action": type(action).__name__,
                "default": repr(action.default),
                "nargs": repr(action.nargs),
                "const": repr(action.const),
                "choices": repr(sorted(map(repr, action.choices))) if action.choices else None,
                "type": getattr(action.type, "__name__", repr(action.type)),
            }
    return options


def command_parsers() -> dict:
    """``{"trl <command>": parser}`` for every subcommand that takes options."""
    import trl

    if trl.__version__.startswith("0."):
        from trl.scripts.utils import TrlParser

        root = TrlParser(prog="trl")
        subparsers = root.add_subparsers(dest="command", parser_class=TrlParser)
        for name in ("chat", "dpo", "grpo", "kto", "sft", "vllm_serve"):
            importlib.import_module(f"trl.scripts.{name}").make_parser(subparsers)
        return {f"trl {name}": parser for name, parser in subparsers.choices.items()}
    # TRL 1.x: `trl <name>` parses with trl/scripts/<name>.py's make_parser() (trl/cli/commands/training.py)
    from trl.cli.commands import get_commands

    parsers = {}
    for command in get_commands():
        script = command.name.replace("-", "_")
        try:
            module = importlib.import_module(f"trl.scripts.{script}")
        except ImportError:
            continue  # `trl env`: no options
        if hasattr(module, "make_parser"):
            parsers[f"trl {command.name}"] = module.make_parser()
    return parsers


def config_classes() -> dict:
    import trl

    modules = [trl]
    if not trl.__version__.startswith("0."):
        for name in ("trl.experimental.online_dpo", "trl.experimental.gkd"):
            modules.append(importlib.import_module(name))
    found = {}
    for module in modules:
        for name in sorted(dir(module)):
            if not name.endswith("Config"):
                continue  # no getattr: TRL's lazy module would import every trainer (some need optional packages)
            cls = getattr(module, name)
            if isinstance(cls, type) and "output_dir" in getattr(cls, "__dataclass_fields__", {}):
                found[name] = cls
    return found


def dump(path: str) -> None:
    from trl.scripts.utils import TrlParser

    out = {name: describe(parser) for name, parser in command_parsers().items()}
    out.update({name: describe(TrlParser((cls,))) for name, cls in config_classes().items()})
    with open(path, "w") as handle:
        json.dump(out, handle)


def dump_tree(tree: Path, out: Path) -> dict:
    """The options as the ``trl`` of ``tree`` builds them, dumped by a fresh interpreter (this one's executable)."""
    import os
    import subprocess

    tests = Path(__file__).resolve().parents[1]
    code = "import sys; sys.path.insert(0, sys.argv[2]); from harness.cli_options import dump; dump(sys.argv[1])"
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    result = subprocess.run(
        [sys.executable, "-c", code, str(out), str(tests)],
        env=env,
        cwd=tests.parent,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(Path(out).read_text())


def problems(base: dict, fork: dict) -> list[str]:
    found = []
    for parser, base_options in base.items():
        fork_options = fork.get(parser)
        if fork_options is None:
            found.append(f"{parser}: missing on the fork")
            continue
        for option, described in base_options.items():
            if option not in fork_options:
                found.append(f"{parser} {option}: dropped")
            elif fork_options[option] != described:
                found.append(f"{parser} {option}: {described} -> {fork_options[option]}")
    return found


def added(base: dict, fork: dict) -> set[str]:
    return {option for parser, opts in fork.items() for option in opts if option not in base.get(parser, {})}


if __name__ == "__main__":
    dump(sys.argv[1])
