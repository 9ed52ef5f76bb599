"""``make demo`` (``examples/demo/run_demo.py``): the "equivalent command" it prints reproduces the demo by hand.

On CPU the demo's FSDP (and ZeRO-3) run needs the test harness's start-up shim (``tests/harness/_site`` on
``PYTHONPATH`` and ``TRL_HARNESS_CPU_FSDP=1``); without it accelerate drops FSDP and every rank trains a full
replica. The printed command must carry that environment and name files that still exist once the demo is over.
"""

import importlib.util
import json
import os
import shlex
import subprocess
from pathlib import Path
from unittest import mock

import pytest
import yaml
from harness.cpu_shims import DS_NO_SHM_FLAG, FSDP_FLAG
from harness.launcher import REPO_ROOT, SITE_DIR, LaunchResult


DEMO = REPO_ROOT / "examples" / "demo" / "run_demo.py"


def _load_demo():
    spec = importlib.util.spec_from_file_location("run_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_demo = _load_demo()


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


def test_default_workdir_is_kept():
    """The default work directory is not a temporary one that the demo deletes (the command names files in it)."""
    default = run_demo.parse_args([]).workdir
    # In the clone (wherever the clone itself is, /tmp included), not in a temporary directory of the demo's own
    assert default == REPO_ROOT / "build" / "demo"
    assert "TemporaryDirectory" not in Path(run_demo.__file__).read_text()


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


@pytest.mark.dist
def test_printed_command_shards_by_hand(workdir, capsys):
    """The fsdp2 command, run by hand in a shell as printed: each rank holds half of the reference model."""
    with mock.patch.object(run_demo, "run_command", side_effect=_fake_launch):
        run_demo.main(["--backend", "fsdp2", "--workdir", str(workdir), "--steps", "1"])
    env, argv = printed_command(capsys.readouterr().out)
    command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(argv)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HOME")}
    ran = subprocess.run(["bash", "-c", command], env=clean, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-4000:]
    reports = [json.loads(p.read_text()) for p in sorted(Path(env["TRL_DEMO_REPORT_DIR"]).glob("rank*.json"))]
    assert [r["rank"] for r in reports] == [0, 1]
    for report in reports:
        assert report["backend"] == "FSDP" and report["stage"] == "trained", report
        ref = report["models"]["reference model"]
        assert ref["local_numel"] * 2 <= ref["full_numel"] + 64, ref  # half of it (padding aside)
