"""``make demo`` (``examples/demo/run_demo.py``): the "equivalent command" it prints reproduces the demo by hand.

On CPU the demo's FSDP (and ZeRO-3) run needs the test harness's start-up shim (``tests/harness/_site`` on
``PYTHONPATH`` and ``TRL_HARNESS_CPU_FSDP=1``); without it accelerate drops FSDP and every rank trains a full
replica. The printed command must carry that environment and name files that still exist once the demo is over.

The demo runs the ``trl`` of the Python that runs it, so each line's tests run with that line's venv and skip on the
other's::

    lines/0.16.1/.venv/bin/python -m pytest tests/demo    # TRL 0.16.1+fork: --backend fsdp2, fsdp1, zero3, ddp
    lines/1.16.0/.venv/bin/python -m pytest tests/demo    # TRL 1.16.0: pristine vs the fork under FSDP2

The 1.16.0 demo runs the same launch on pristine TRL 1.16.0 (its tree first on ``PYTHONPATH``) and on the fork; on
CPU it also needs ``tests/harness/accelerate110.py`` (preloaded), without which accelerate >= 1.10 starts no
distributed run on a machine without GPUs.
"""

import contextlib
import importlib.util
import io
import json
import os
import shlex
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest
import yaml
from harness.accelerate110 import SHIM_FILE as ACCELERATE110_SHIM
from harness.cpu_shims import DS_NO_SHM_FLAG, FSDP_FLAG
from harness.launcher import GLOO_ABORT, REPO_ROOT, SITE_DIR, LaunchResult, aborted_by_gloo


DEMO = REPO_ROOT / "examples" / "demo" / "run_demo.py"


def _load_demo():
    spec = importlib.util.spec_from_file_location("run_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_demo = _load_demo()
TRL_VERSION, TRL_FILE, TRL_LINE = run_demo.installed_trl()


def on_line(line):
    """Skip (with the reason) unless this Python's ``trl`` is ``line``'s: the demo runs the installed ``trl``."""
    return pytest.mark.skipif(
        TRL_LINE != line,
        reason=f"the {line} line's demo: this Python imports trl {TRL_VERSION}; run it with "
        f"lines/{line}/.venv/bin/python -m pytest tests/demo",
    )


def printed_command(stdout):
    """The equivalent command as the demo prints it (a user copies these lines): (environment, argv)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "equivalent command" in line.lower())
    if lines[start].rstrip().endswith(":"):
        start += 1  # on the lines after its label
    else:
        lines[start] = lines[start].split("command: ", 1)[1]
    end = start
    while lines[end].rstrip().endswith("\\"):
        end += 1
    words = shlex.split("\n".join(lines[start : end + 1]).replace("\\\n", ""))  # the shell's line continuation
    env = {}
    while words and "=" in words[0] and not words[0].startswith(("/", "-")):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def _fake_launch(*args, **kwargs):
    workdir = Path(kwargs["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "launch.log").write_text("")
    return LaunchResult(
        backend=kwargs["backend"], cmd=list(args[0]), returncode=0, duration=1.0, timed_out=False,
        log_path=workdir / "launch.log", error_dir=workdir / "errors",
    )  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("demo")  # shared: the fixtures are built once and reused


@pytest.mark.parametrize("line", ["0.16.1", "1.16.0"])
def test_default_workdir_is_kept(line):
    """The default work directory is not a temporary one that the demo deletes (the command names files in it); one
    per line (a line's fixtures are saved by its own transformers)."""
    default = run_demo.parse_args(["--line", line]).workdir
    # In the clone (wherever the clone itself is, /tmp included), not in a temporary directory of the demo's own
    assert default == {"0.16.1": REPO_ROOT / "build" / "demo", "1.16.0": REPO_ROOT / "lines/1.16.0/build/demo"}[line]
    assert "TemporaryDirectory" not in Path(run_demo.__file__).read_text()
    if TRL_LINE == line:  # without --line: the line of this Python's trl
        assert run_demo.parse_args([]).workdir == default


def test_line_defaults_to_the_installed_trl_and_refuses_another():
    """``--line`` defaults to the installed ``trl``'s line; another line, or a ``trl`` of no line, is refused with one
    line (before anything is built)."""
    if TRL_LINE is None:
        pytest.skip(f"this Python imports trl {TRL_VERSION}, no line of the fork")
    assert run_demo.resolve_line() == TRL_LINE == run_demo.resolve_line(TRL_LINE)
    other = next(line for line in run_demo.LINES if line != TRL_LINE)
    with pytest.raises(SystemExit) as refused:
        run_demo.main(["--line", other, "--workdir", "/nonexistent/never-created"])
    message = str(refused.value)
    assert "\n" not in message and f"--line {other} needs TRL {other}" in message
    assert f"lines/{other}/.venv/bin/python" in message
    unknown = mock.patch.object(run_demo, "installed_trl", return_value=("2.0.0", "/x/trl/__init__.py", None))
    with unknown, pytest.raises(SystemExit) as refused:
        run_demo.main([])
    message = str(refused.value)
    assert "\n" not in message and "trl 2.0.0 (/x/trl/__init__.py) is no line of the fork" in message


@on_line("0.16.1")
@pytest.mark.parametrize("backend", ["fsdp2", "fsdp1", "zero3", "ddp"])
def test_printed_command_reproduces_the_launch(workdir, backend, capsys):
    """main() with the launch faked: the printed command is the launch's argv and environment, its files exist once
    the demo has returned, and it carries what enables the CPU shim (FSDP, ZeRO-3)."""
    with mock.patch.object(run_demo, "run_command", side_effect=_fake_launch) as launch:
        run_demo.main(["--backend", backend, "--workdir", str(workdir)])
    stdout = capsys.readouterr().out
    env, argv = printed_command(stdout)
    (call,) = launch.call_args_list
    launched_argv, launched_env = [str(a) for a in call.args[0]], call.kwargs["env"]

    assert argv == launched_argv
    for key, value in launched_env.items():  # everything the demo sets, except where tracebacks go
        if key not in run_demo.NOT_SHOWN and os.environ.get(key) != value:
            assert env.get(key) == value, key
    assert env["HF_HUB_OFFLINE"] == "1" and env["CUDA_VISIBLE_DEVICES"] == ""

    # Files: the program, the fixtures, the default accelerate config of HF_HOME, the start-up hook and the demo hook
    assert os.access(argv[0], os.X_OK), argv[0]
    paths = [Path(a) for i, a in enumerate(argv) if a.startswith("/") and argv[i - 1] != "--output_dir"]
    assert len(paths) >= 4, argv
    for path in paths:
        assert path.exists(), path
    config = yaml.safe_load((Path(env["HF_HOME"]) / "accelerate" / "default_config.yaml").read_text())
    site = env["PYTHONPATH"].split(os.pathsep)[0]
    assert Path(site) == SITE_DIR and (SITE_DIR / "sitecustomize.py").is_file()
    assert all(Path(p).is_file() for p in env["TRL_HARNESS_PRELOAD"].split(os.pathsep))

    if backend.startswith("fsdp"):
        assert env[FSDP_FLAG] == "1" and config["distributed_type"] == "FSDP"
        assert "enables FSDP through the test harness's shim" in stdout
    elif backend == "zero3":
        assert env[DS_NO_SHM_FLAG] == "1" and env["DS_ACCELERATOR"] == "cpu"
        assert Path(config["deepspeed_config"]["deepspeed_config_file"]).is_file()
    else:
        assert FSDP_FLAG not in env and DS_NO_SHM_FLAG not in env
    assert "On GPUs no shim is involved" in stdout


def _run_printed_command(output, error_dir):
    """Runs the equivalent command the demo printed in ``output``, by hand in a shell with neither PYTHONPATH nor
    HF_HOME from this process; returns the ranks' reports.

    As the harness's launches are, it is run once more, with a warning, when it failed only by gloo's rare C++ abort
    at exit (``harness.launcher.aborted_by_gloo``; seen once in a fresh-clone CI run, 1 run in 12 on a loaded CPU
    here) after both ranks reported their trained models: the workers' tracebacks go to ``error_dir``
    (``TRL_HARNESS_ERROR_DIR``, which the demo leaves out of the command because it changes nothing in the run), and
    the reports of the first run are removed."""
    env, argv = printed_command(output)
    command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(argv)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HOME")}
    clean["TRL_HARNESS_ERROR_DIR"] = str(error_dir)
    report_dir = Path(env["TRL_DEMO_REPORT_DIR"])

    def run():
        ran = subprocess.run(["bash", "-c", command], env=clean, capture_output=True, text=True, timeout=600)
        return ran.returncode, ran.stdout + ran.stderr

    def trained():  # every rank reported its trained models: the abort came after the run's work
        reports = [json.loads(p.read_text()) for p in report_dir.glob("rank*.json")]
        return len(reports) == 2 and all(r.get("stage") == "trained" for r in reports)

    returncode, text = run()
    if returncode != 0 and aborted_by_gloo(text, error_dir) and trained():
        warnings.warn(f"the printed command: a worker aborted ({GLOO_ABORT!r}); run once more", stacklevel=2)
        for report in report_dir.glob("rank*.json"):
            report.unlink()
        returncode, text = run()
    assert returncode == 0, text[-4000:]
    return [json.loads(p.read_text()) for p in sorted(report_dir.glob("rank*.json"))]


@pytest.mark.dist
def test_printed_command_shards_by_hand(workdir, capsys):
    """The fsdp2 command, run by hand in a shell as printed: each rank holds half of the reference model."""
    with mock.patch.object(run_demo, "run_command", side_effect=_fake_launch):
        run_demo.main(["--backend", "fsdp2", "--workdir", str(workdir), "--steps", "1"])
    reports = _run_printed_command(capsys.readouterr().out, workdir / "by-hand-errors")
    assert [r["rank"] for r in reports] == [0, 1]
    for report in reports:
        assert report["backend"] == "FSDP" and report["stage"] == "trained", report
        ref = report["models"]["reference model"]
        assert ref["local_numel"] * 2 <= ref["full_numel"] + 64, ref  # half of it (padding aside)


# ------------------------------------------------------------------------------------------------ the 1.16.0 line

FAKE_MANIFEST = {"policy": "/fixtures/policy", "reward": "/fixtures/reward", "prompt_only": "/fixtures/prompt_only"}


def test_grpo_args_per_line():
    """The same launch on both lines, in what each line's `trl grpo` parses: TRL 1.x has no --max_prompt_length, and
    defaults to bf16, which CPU ranks do not run (--bf16 false)."""
    old = run_demo.grpo_cli_args("0.16.1", FAKE_MANIFEST, "/out", 3)
    new = run_demo.grpo_cli_args("1.16.0", FAKE_MANIFEST, "/out", 3)
    assert "--bf16" not in old and "--max_prompt_length" not in new
    for args, only in ((old, ["--max_prompt_length", "32"]), (new, ["--bf16", "false"])):
        at = args.index(only[0])
        assert args[at : at + 2] == only
        del args[at : at + 2]
    assert old == new  # nothing else differs
    # a reward model, and beta > 0: a reference model
    assert new[new.index("--reward_model_name_or_path") + 1] == "/fixtures/reward"
    assert float(new[new.index("--beta") + 1]) > 0


@pytest.mark.parametrize("line", [pytest.param(line, marks=on_line(line)) for line in ("0.16.1", "1.16.0")])
def test_grpo_args_parse_with_the_lines_parser(line, tmp_path):
    """The demo's arguments parse with the `trl grpo` parser of the line's TRL (GRPOConfig included)."""
    from trl.scripts.grpo import make_parser

    argv = run_demo.grpo_cli_args(line, FAKE_MANIFEST, tmp_path / "out", 3)
    assert argv[0] == "grpo"
    script_args, training_args, *_ = make_parser().parse_args_and_config(args=argv[1:])
    assert script_args.reward_model_name_or_path == "/fixtures/reward"
    assert script_args.dataset_name == "/fixtures/prompt_only"
    assert training_args.beta == 0.04 and training_args.max_steps == 3 and training_args.bf16 is False
    assert training_args.num_generations == 2 and training_args.max_completion_length == 8
    if line == "1.16.0":  # why the 1.16.0 launch leaves it out
        with pytest.raises((ValueError, SystemExit)):
            make_parser().parse_args_and_config(args=[*argv[1:], "--max_prompt_length", "32"])


def _rank_report(rank, trl_file, fork_info, held):
    """A rank's report as demo_hook.py writes it; ``held``: {model name: parameters held of 100}."""
    models = {
        name: {"local_numel": n, "full_numel": 100, "local_bytes": 4 * n, "devices": ["cpu"], "wrappers": ["FSDP"]}
        for name, n in held.items()
    }
    return {
        "rank": rank, "backend": "FSDP", "accelerator_device": "cpu", "stage": "trained", "global_step": 3,
        "losses": [1.49e-08, 6.255e-06, 1.828e-05], "models": models,
        "trl": {"file": str(trl_file), "version": "1.16.0", "fork_info": fork_info},
    }  # fmt: skip


@pytest.mark.parametrize("broken", [None, "fork keeps a replica", "pristine imported the fork", "fork run failed"])
def test_summary_1160_passes_only_when_the_fork_shards_each_run_on_its_trl(broken, tmp_path, capsys):
    """The 1.16.0 summary (no launch): pristine vs fork per model in plain words, and a failed demo when the fork
    keeps a full replica, a pristine rank imported the fork (PYTHONPATH lost to the editable install) or a run
    failed."""
    tree, fork_file = tmp_path / "base", tmp_path / "fork" / "trl" / "__init__.py"
    pristine_file = fork_file if broken == "pristine imported the fork" else tree / "trl" / "__init__.py"
    pristine_info = broken == "pristine imported the fork"
    fork_reward = 100 if broken == "fork keeps a replica" else 50
    reports = {
        "pristine": [_rank_report(r, pristine_file, pristine_info, {"reference model": 50, "reward model": 100})
                     for r in (0, 1)],
        "fork": [_rank_report(r, fork_file, True, {"reference model": 50, "reward model": fork_reward})
                 for r in (0, 1)],
    }  # fmt: skip
    failed = {"fork": 1 if broken == "fork run failed" else 0, "pristine": 0}
    results = {
        v: LaunchResult("fsdp2", ["trl"], failed[v], 20.0, False, tmp_path / "launch.log", tmp_path)
        for v in run_demo.VARIANTS
    }
    args = run_demo.parse_args(["--line", "1.16.0", "--steps", "3"])
    passed = run_demo.summarize_1160(reports, results, args, tree, "1.16.0+fork.27", fork_file, 50.0)
    stdout = capsys.readouterr().out
    reference = "reference model: pristine 1.16.0 sharded, each rank holds 50%; fork: sharded, each rank holds 50%"
    assert reference in stdout
    assert "losses (rank 0)   [1.49e-08, 6.255e-06, 1.828e-05]" in stdout
    if broken is None:
        assert passed and stdout.rstrip().splitlines()[-1].startswith("DEMO PASSED in 50s")
        assert (
            "reward model: pristine 1.16.0 a full replica on every rank (100%); fork: sharded, each rank holds 50%"
            in stdout
        )
        return
    assert not passed and "DEMO FAILED:" in stdout
    expected = {
        "fork keeps a replica": "the fork did not shard the reward model: a full replica on every rank (100%)",
        "pristine imported the fork": f"pristine run: rank 0 imported trl 1.16.0 from {fork_file}, not the pristine",
        "fork run failed": "fork run: [fsdp2] launch failed with exit code 1",
    }[broken]
    assert expected in stdout


@on_line("1.16.0")
def test_printed_command_reproduces_the_fork_launch_1160(workdir, capsys):
    """main() with both launches faked: first pristine TRL 1.16.0, then the fork, through the same `trl grpo`. The
    printed command is the fork's launch; the pristine launch differs from it only by the pristine tree first on
    PYTHONPATH (which `import trl` then finds) and its own reports and output. Ranks that never report fail the demo."""
    with mock.patch.object(run_demo, "run_command", side_effect=_fake_launch) as launch:
        returncode = run_demo.main(["--workdir", str(workdir)])
    stdout = capsys.readouterr().out
    assert returncode == 1 and "DEMO FAILED" in stdout and "pristine run: no rank reported" in stdout
    env, argv = printed_command(stdout)
    pristine_call, fork_call = launch.call_args_list
    fork_argv, fork_env = [str(a) for a in fork_call.args[0]], fork_call.kwargs["env"]

    # The fork: the printed command, with everything the demo sets
    assert argv == fork_argv
    for key, value in fork_env.items():
        if key not in run_demo.NOT_SHOWN and os.environ.get(key) != value:
            assert env.get(key) == value, key
    assert env["HF_HUB_OFFLINE"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "" and env[FSDP_FLAG] == "1"
    assert argv[1] == "grpo" and os.access(argv[0], os.X_OK), argv[:2]
    assert "--max_prompt_length" not in argv and argv[argv.index("--bf16") + 1] == "false"
    paths = [Path(a) for i, a in enumerate(argv) if a.startswith("/") and argv[i - 1] != "--output_dir"]
    assert len(paths) >= 4, argv
    for path in paths:
        assert path.exists(), path
    config = yaml.safe_load((Path(env["HF_HOME"]) / "accelerate" / "default_config.yaml").read_text())
    assert config["distributed_type"] == "FSDP" and config["fsdp_config"]["fsdp_version"] == 2
    assert Path(env["PYTHONPATH"].split(os.pathsep)[0]) == SITE_DIR
    preload = [Path(p) for p in env["TRL_HARNESS_PRELOAD"].split(os.pathsep)]
    assert preload == [ACCELERATE110_SHIM, run_demo.HOOK] and all(p.is_file() for p in preload)
    assert "enables FSDP through the test harness's shims" in stdout and "On GPUs no shim is involved" in stdout

    # Pristine: the same launch, the pristine tree first on PYTHONPATH
    pristine_argv, pristine_env = [str(a) for a in pristine_call.args[0]], pristine_call.kwargs["env"]
    tree, *rest = pristine_env["PYTHONPATH"].split(os.pathsep)
    assert rest == fork_env["PYTHONPATH"].split(os.pathsep)
    assert (Path(tree) / "trl" / "__init__.py").is_file() and not (Path(tree) / "trl" / "_fork_info.py").exists()
    changed = {k for k in set(pristine_env) | set(fork_env) if pristine_env.get(k) != fork_env.get(k)}
    assert changed == {"PYTHONPATH", "TRL_DEMO_REPORT_DIR", "TRL_HARNESS_ERROR_DIR"}
    out = argv.index("--output_dir") + 1
    assert pristine_argv[:out] + pristine_argv[out + 1 :] == argv[:out] + argv[out + 1 :]
    assert pristine_argv[out] != argv[out]
    # that PYTHONPATH wins over the editable install of the fork (a .pth entry), start-up hooks included
    probe = "import importlib.util, trl; print(trl.__file__, importlib.util.find_spec('trl._fork_info') is None)"
    for launch_env, expected in ((pristine_env, f"{tree}/trl/__init__.py True"), (fork_env, f"{TRL_FILE} False")):
        ran = subprocess.run([sys.executable, "-c", probe], env=launch_env, capture_output=True)
        assert ran.returncode == 0 and ran.stdout.decode().split("\n")[-2] == expected, ran.stdout + ran.stderr


@pytest.fixture(scope="module")
def demo_1160(workdir):
    """The 1.16.0 demo, run for real once (1 step each run): (exit code, output)."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        returncode = run_demo.main(["--workdir", str(workdir), "--steps", "1"])
    return returncode, output.getvalue()


@on_line("1.16.0")
@pytest.mark.dist
def test_demo_1160_pristine_keeps_a_reward_model_replica_the_fork_shards_it(demo_1160, workdir):
    """The whole 1.16.0 demo: under FSDP2 pristine TRL 1.16.0 keeps the reward model a full replica on every rank, the
    fork shards it; both shard the reference model; each run imported the `trl` it should."""
    returncode, stdout = demo_1160
    assert returncode == 0, stdout[-6000:]
    summary = stdout[stdout.index("GRPO demo summary") :]
    assert (
        "reward model: pristine 1.16.0 a full replica on every rank (100%); fork: sharded, each rank holds 50%"
        in summary
    ), summary
    assert (
        "reference model: pristine 1.16.0 sharded, each rank holds 50%; fork: sharded, each rank holds 50%" in summary
    ), summary
    assert summary.rstrip().splitlines()[-2].startswith("DEMO PASSED in "), summary
    for variant in run_demo.VARIANTS:
        reports = [json.loads(p.read_text()) for p in sorted((workdir / "reports" / variant).glob("rank*.json"))]
        assert [r["rank"] for r in reports] == [0, 1]
        for report in reports:
            assert report["backend"] == "FSDP" and report["stage"] == "trained", report
            reward = report["models"]["reward model"]
            if variant == "pristine":
                assert not report["trl"]["fork_info"] and "/build/trees/base/" in report["trl"]["file"], report
                assert reward["local_numel"] == reward["full_numel"], reward
            else:
                assert report["trl"]["fork_info"] and report["trl"]["file"] == TRL_FILE, report
                assert reward["local_numel"] * 2 <= reward["full_numel"] + 64, reward


@on_line("1.16.0")
@pytest.mark.dist
def test_printed_command_shards_by_hand_1160(workdir, capsys):
    """The fork's command as the 1.16.0 demo prints it, run by hand in a shell: each rank holds half of the reference
    model and half of the reward model."""
    with mock.patch.object(run_demo, "run_command", side_effect=_fake_launch):
        run_demo.main(["--workdir", str(workdir), "--steps", "1"])
    reports = _run_printed_command(capsys.readouterr().out, workdir / "by-hand-errors")
    assert [r["rank"] for r in reports] == [0, 1]
    for report in reports:
        assert report["backend"] == "FSDP" and report["stage"] == "trained", report
        assert report["trl"]["fork_info"] and report["trl"]["file"] == TRL_FILE, report
        for name in ("reference model", "reward model"):
            held = report["models"][name]
            assert held["local_numel"] * 2 <= held["full_numel"] + 64, (name, held)  # half of it (padding aside)
