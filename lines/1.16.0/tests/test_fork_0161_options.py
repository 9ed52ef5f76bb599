"""Every option the fork's 0.16.1 line added works on this line or stops at parsing, naming what to use (#39 item 1).

The list is read from the 0.16.1 line's patches (``lines/0.16.1/patches``): each field a patch adds to a config class
or to ``trl vllm-serve``'s arguments. A new 0.16.1 option, or a 0.16.1 file not mapped here, fails this test until the
1.16.0 line either has the option or its parser refuses it (patch 0024, ``_FORK_0161_OPTIONS`` in
``trl/scripts/utils.py``). For each option and each 1.16.0 parser that stands for the 0.16.1 class:

- the parser has the option (the same name; the 0.16.1 line's meaning is checked by the patch that added it here), or
- ``--<option> 1`` exits with status 2 and one line that names the 0.16.1 line and, where it names options to use
  instead, only options that this parser has.
"""

import re
from pathlib import Path

import pytest


PATCHES_0161 = Path(__file__).resolve().parents[2] / "0.16.1" / "patches"
ADDED_FIELD = re.compile(r"^\+    (\w+): [^=]+= field\(")


def _grpo():
    from trl.scripts.grpo import make_parser

    return make_parser(prog="trl grpo")


def _rloo():
    from trl.scripts.rloo import make_parser

    return make_parser(prog="trl rloo")


def _online_dpo():
    from trl import TrlParser
    from trl.experimental.online_dpo import OnlineDPOConfig

    return TrlParser([OnlineDPOConfig], prog="online_dpo.py")


def _gkd():
    from trl import TrlParser
    from trl.experimental.gkd import GKDConfig

    return TrlParser([GKDConfig], prog="gkd.py")


def _vllm_serve():
    from trl.scripts.vllm_serve import make_parser

    return make_parser(prog="trl vllm-serve")


# the file of the 0.16.1 tree a field was added to -> the 1.16.0 parsers that stand for its class
PARSERS = {
    "trl/trainer/grpo_config.py": {"GRPO": _grpo},
    "trl/trainer/online_dpo_config.py": {"Online DPO": _online_dpo},
    "trl/trainer/gkd_config.py": {"GKD": _gkd},
    # `OnPolicyConfig`, the base of 0.16.1's PPO and RLOO configs; TRL 1.16.0 has no PPO trainer
    "trl/trainer/utils.py": {"RLOO": _rloo},
    "trl/scripts/vllm_serve.py": {"vllm-serve": _vllm_serve},
}


def options_0161():
    """(0.16.1 file, option) for every field the 0.16.1 line's patches add, in series order."""
    found = []
    for line in (PATCHES_0161 / "series").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        path = None
        for text in (PATCHES_0161 / line.strip()).read_text().splitlines():
            if text.startswith("+++ "):
                path = text[len("+++ b/") :] if text.startswith("+++ b/") else None
            elif path and not path.startswith("tests/") and (match := ADDED_FIELD.match(text)):
                if (path, match.group(1)) not in found:
                    found.append((path, match.group(1)))
    return found


def test_the_list_is_read_from_the_0161_patches():
    options = {name for _, name in options_0161()}
    # the options #39 names, and the rest the 0.16.1 line is known to add
    assert {"disable_unwrapping_for_generation", "vllm_sync_bucket_size_mb", "vllm_server_verify_weights"} <= options
    assert {"generation_gather_budget_mb", "vllm_server_request_timeout", "api_key", "check_weights"} <= options
    unmapped = sorted({path for path, _ in options_0161()} - set(PARSERS))
    assert not unmapped, f"0.16.1 files with added options that no 1.16.0 parser stands for here: {unmapped}"


def test_the_refusal_table_names_only_0161_options():
    from trl.scripts.utils import _FORK_0161_OPTIONS

    assert set(_FORK_0161_OPTIONS) <= {name for _, name in options_0161()}


CASES = [(path, label, name) for path, name in options_0161() for label in PARSERS.get(path, {})]


@pytest.mark.parametrize(("path", "label", "name"), CASES, ids=[f"{label}-{name}" for _, label, name in CASES])
def test_each_0161_option_works_or_names_its_equivalent(capsys, path, label, name):
    parser = PARSERS[path][label]()
    known = {action.dest for action in parser._actions}
    if name in known:
        return  # the same option on this line
    with pytest.raises(SystemExit) as excinfo:
        parser.parse_args_and_config([f"--{name}", "1"], return_remaining_strings=True)
    assert excinfo.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"`--{name}` is an option of the fork's TRL 0.16.1 line, not of TRL 1.16.0: " in err, err
    named = set(re.findall(r"`--(\w+)", err)) - {name}
    assert named <= known, f"{label}: the line names options this parser lacks: {sorted(named - known)}"
