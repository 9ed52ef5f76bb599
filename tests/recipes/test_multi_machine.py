"""``examples/recipes/multi_machine.sh``: one job over several machines, on CPU as 2 "machines" on 127.0.0.1.

The launch test runs the recipe twice at once, as two machines would (``NUM_MACHINES=2``, ``MACHINE_RANK=0`` and
``1``, ``MAIN_PROCESS_IP=127.0.0.1``, one process each, DDP over gloo), with the tiny fixtures and a 2-step GRPO
run, and checks from inside the training processes (``multi_machine_hook.py``) that the two launches formed one
process group of 2 ranks, rank ``r`` started by machine ``r``, that they trained on different prompts with finite
losses, and that only machine 0 wrote the model. It uses the interpreter running pytest, so the lead runs it once
per line::

    lines/0.16.1/.venv/bin/python -m pytest tests/recipes/test_multi_machine.py     # TRL 0.16.1+fork
    lines/1.16.0/.venv/bin/python -m pytest tests/recipes/test_multi_machine.py     # TRL 1.16.0+fork

What it does not show: a real network (both "machines" are this host, over loopback), GPUs / NCCL, more than one
process per machine, other backends than DDP. The other tests here check the recipe's input validation and its
dry-run command (no launch).
"""

import json
import math
import os
import shlex
import subprocess
import sys
import time
import warnings
from pathlib import Path
from unittest import mock

import pytest
from harness.launcher import (
    REPO_ROOT,
    _descendants,
    _kill_leftovers,
    _terminate_tree,
    derive_config,
    free_port,
    harness_env,
)


RECIPE = REPO_ROOT / "examples" / "recipes" / "multi_machine.sh"
HOOK = Path(__file__).with_name("multi_machine_hook.py")
MACHINES = 2
STEPS = 2
TIMEOUT = int(os.environ.get("TRL_HARNESS_TIMEOUT", "240"))  # seconds for both launches together (~40-60 s idle)
FAILURE_GRACE = 20  # seconds a machine may run on once the other failed (it would wait for it in a collective)
CPU_ARGS = ["--per_device_train_batch_size", "2", "--num_generations", "2", "--max_completion_length", "8",
            "--bf16", "false", "--gradient_checkpointing", "false", "--max_steps", str(STEPS), "--logging_steps", "1",
            "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--seed", "42",
            "--ddp_timeout", "90"]  # fmt: skip
# The recipe's variables: the tests set them, never inherit them
VARIABLES = ("NUM_MACHINES", "MACHINE_RANK", "MAIN_PROCESS_IP", "MAIN_PROCESS_PORT", "NUM_GPUS", "GPUS_PER_MACHINE",
             "BACKEND", "ACCELERATE_CONFIG", "ACCELERATE", "CUDA_VISIBLE_DEVICES", "RECIPE_DRY_RUN")  # fmt: skip


def _trl_version():
    import trl

    return trl.__version__


# ------------------------------------------------------------------------------------------------ the launch


def _machine_env(fixtures, work, config, rank, port):
    env = harness_env("ddp", device="cpu", error_dir=work / "errors", preload=[HOOK])
    for name in VARIABLES:
        env.pop(name, None)
    env.update(
        # accelerate >= 1.10 gives a GPU-less launched process no process group (DistributedType.NO) unless told to
        # use the CPU; accelerate 1.6 picks MULTI_CPU either way. `--cpu` is no way: it skips torchrun.
        ACCELERATE_USE_CPU="true",
        CUDA_VISIBLE_DEVICES="",
        NUM_MACHINES=str(MACHINES),
        MACHINE_RANK=str(rank),
        MAIN_PROCESS_IP="127.0.0.1",
        MAIN_PROCESS_PORT=str(port),
        NUM_GPUS="1",
        BACKEND="ddp",
        ACCELERATE_CONFIG=str(config),
        ACCELERATE=str(Path(sys.executable).with_name("accelerate")),
        MODEL=fixtures["policy"],
        REWARD_MODEL=fixtures["reward"],
        DATASET=fixtures["prompt_only"],
        OUTPUT_DIR=str(work / f"machine{rank}" / "output"),  # machines share no disk
        HF_HOME=str(work / f"machine{rank}" / "hf_home"),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        MULTI_MACHINE_RECORD_DIR=str(work / "records"),
    )
    return env


def _run_machines(envs, work):
    """Starts one recipe per machine, at once; returns ``[(returncode, output)]`` when both succeed, else fails the
    test with each rank's traceback or stacks and each machine's output tail.

    Each launch runs in its own session. Once one machine fails the other gets ``FAILURE_GRACE`` seconds (alone it
    would wait for its peer until a collective times out); past the deadline both are stopped. Stopping sends
    SIGUSR1 first (faulthandler writes each rank's stacks into ``errors/``), then SIGTERM / SIGKILL to every process
    of the launch, including torchrun's workers, which live in sessions of their own.
    """
    machines = []
    try:
        for rank, env in enumerate(envs):
            log = work / f"machine{rank}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(["bash", str(RECIPE), *CPU_ARGS], env=env, cwd=str(work), stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
            machines.append({"proc": proc, "log": log, "seen": {}})
        deadline, failed_at, stopped = time.monotonic() + TIMEOUT, None, None
        while any(m["proc"].poll() is None for m in machines):
            for m in machines:
                for p in _descendants(m["proc"].pid):
                    m["seen"].setdefault(p.pid, p)
            now = time.monotonic()
            if failed_at is None and any(m["proc"].poll() not in (None, 0) for m in machines):
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + FAILURE_GRACE):
                stopped = "timed out" if now > deadline else "stopped after the other machine failed"
                for m in machines:
                    if m["proc"].poll() is None:
                        _terminate_tree(m["proc"])
                break
            time.sleep(0.5)
    finally:
        for m in machines:
            if m["proc"].poll() is None:
                _terminate_tree(m["proc"], dump_stacks=False, grace=3.0)
            _kill_leftovers(list(m["seen"].values()))
    results = [(m["proc"].returncode, m["log"].read_text(errors="replace")) for m in machines]
    if stopped == "timed out" or any(code != 0 for code, _ in results):
        if stopped != "timed out" and any(GLOO_ABORT in output for _, output in results):
            raise GlooAbort(_failure_text(results, work, stopped))
        pytest.fail(_failure_text(results, work, stopped), pytrace=False)
    return results


GLOO_ABORT = "(SIGABRT)"  # in torchrun's report of a worker that gloo aborted ("exitcode: -6 ... (SIGABRT)")


class GlooAbort(Exception):
    """A worker was aborted from inside gloo (SIGABRT, no Python error), as seen rarely on a loaded CPU."""


def _failure_text(results, work, stopped):
    lines = [f"the 2-machine launch failed ({stopped or 'a machine exited with an error'})"]
    for name in sorted(p.name for p in (work / "errors").glob("*.txt")):
        text = (work / "errors" / name).read_text(errors="replace").strip()
        if text:
            lines += [f"----- {name}", "\n".join(text.splitlines()[-40:])]
    for rank, (code, output) in enumerate(results):
        lines += [f"----- machine {rank}: exit code {code}, output tail", "\n".join(output.splitlines()[-40:])]
    return "\n".join(lines)


def _printed_command(output):
    (line,) = [line for line in output.splitlines() if line.startswith("+ ")]
    return shlex.split(line[2:])


@pytest.mark.dist
def test_two_machines_train_one_job(tiny_fixtures, tmp_path):
    for attempt in (1, 2):  # a run that gloo aborts (SIGABRT, no Python error) is started once more, with a warning
        work = tmp_path / f"attempt{attempt}"
        port = free_port()
        config = derive_config("ddp", work / "config", device="cpu", num_processes=MACHINES)
        envs = [_machine_env(tiny_fixtures, work, config, rank, port) for rank in range(MACHINES)]
        started = time.perf_counter()
        try:
            results = _run_machines(envs, work)
            break
        except GlooAbort as abort:
            if attempt == 2:
                pytest.fail(f"aborted inside gloo twice:\n{abort}", pytrace=False)
            warnings.warn(
                f"a worker was aborted inside gloo; starting the 2 machines once more:\n{abort}", stacklevel=1
            )
    print(f"trl {_trl_version()}: 2 machines x 1 process, {STEPS} steps in {time.perf_counter() - started:.0f} s")

    # Each machine ran the accelerate command of the recipe, with its own machine rank and nothing else different
    commands = [_printed_command(output) for _, output in results]
    for rank, command in enumerate(commands):
        assert command[0].endswith("accelerate") and command[1] == "launch", command
        flags = {flag: command[command.index(flag) + 1] for flag in ("--num_machines", "--machine_rank",
                 "--main_process_ip", "--main_process_port", "--num_processes")}  # fmt: skip
        assert flags == {"--num_machines": "2", "--machine_rank": str(rank), "--main_process_ip": "127.0.0.1",
                         "--main_process_port": str(port), "--num_processes": "2"}, command  # fmt: skip
    assert _without(commands[0], "--machine_rank", "--output_dir") == _without(
        commands[1], "--machine_rank", "--output_dir"
    ), commands

    records = {p.name: json.loads(p.read_text()) for p in (work / "records").glob("rank*.json")}
    assert sorted(records) == ["rank0.json", "rank1.json"], f"ranks that trained: {sorted(records)}"
    prompts = []
    for rank in range(MACHINES):
        record = records[f"rank{rank}.json"]
        env, group = record["env"], record["group"]
        assert record["trl"] == _trl_version(), f"rank {rank} imported another trl: {record['trl_file']}"
        # one process group of 2 ranks over the 2 launches: rank r runs on machine r, alone there
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "1" and env["LOCAL_RANK"] == "0", env
        assert env["RANK"] == env["GROUP_RANK"] == env["MACHINE_RANK"] == str(rank), env
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(port), env
        assert group is not None, f"rank {rank} trained without a process group"
        assert group["world_size"] == 2 and group["rank"] == rank and group["backend"] == "gloo", group
        assert group["distributed_type"].endswith("MULTI_CPU"), group
        assert record["steps"] == STEPS, record["steps"]
        losses = [log["loss"] for log in record["logs"] if "loss" in log]
        assert len(losses) == STEPS and all(isinstance(x, float) and math.isfinite(x) for x in losses), record["logs"]
        assert record["prompts"], f"rank {rank} generated nothing"
        prompts.append({tuple(p) for p in record["prompts"]})
    assert not prompts[0] & prompts[1], "the two machines generated from the same prompts"

    # The final model is written by the main process only: on machine 0, in its OUTPUT_DIR
    assert (work / "machine0" / "output" / "model.safetensors").is_file(), results[0][1][-3000:]
    assert not list((work / "machine1").glob("output/*.safetensors")), "machine 1 wrote a model"


# -------------------------------------------------------------------------------------- inputs and dry run


def _dry_run(**variables):
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update(RECIPE_DRY_RUN="1", REWARD_MODEL="reward", **variables)
    return subprocess.run(["bash", str(RECIPE)], env=env, capture_output=True, text=True, timeout=60)


def _command(**variables):
    ran = _dry_run(**variables)
    assert ran.returncode == 0, ran
    (command,) = [shlex.split(line[2:]) for line in ran.stderr.splitlines() if line.startswith("+ ")]
    return command


def _flag(command, flag):
    return command[command.index(flag) + 1] if flag in command else None


def _without(command, *flags):
    """The command with the values of ``flags`` left out."""
    values = {command.index(flag) + 1 for flag in flags}
    return [word for i, word in enumerate(command) if i not in values]


@pytest.mark.parametrize(
    "variables, error",
    [
        ({"NUM_MACHINES": "2", "MAIN_PROCESS_IP": "10.0.0.1"}, "MACHINE_RANK is required with NUM_MACHINES=2"),
        ({"NUM_MACHINES": "2", "MACHINE_RANK": "1"}, "MAIN_PROCESS_IP is required with NUM_MACHINES=2"),
        ({"NUM_MACHINES": "2", "MACHINE_RANK": "2", "MAIN_PROCESS_IP": "h"}, "MACHINE_RANK=2: an integer in [0, 2)"),
        ({"NUM_MACHINES": "2", "MACHINE_RANK": "-1", "MAIN_PROCESS_IP": "h"}, "MACHINE_RANK=-1: an integer in [0, 2)"),
        ({"NUM_MACHINES": "2", "MACHINE_RANK": "one", "MAIN_PROCESS_IP": "h"}, "MACHINE_RANK=one: an integer in"),
        ({"MACHINE_RANK": "1"}, "MACHINE_RANK=1: an integer in [0, 1)"),
        ({"NUM_MACHINES": "0"}, "NUM_MACHINES=0: a positive integer is required"),
        ({"NUM_MACHINES": "1.5"}, "NUM_MACHINES=1.5: a positive integer is required"),
        ({"NUM_MACHINES": "-2"}, "NUM_MACHINES=-2: a positive integer is required"),
        ({"MAIN_PROCESS_PORT": "0"}, "MAIN_PROCESS_PORT=0: a TCP port in [1, 65535]"),
        ({"MAIN_PROCESS_PORT": "65536"}, "MAIN_PROCESS_PORT=65536: a TCP port in [1, 65535]"),
        ({"MAIN_PROCESS_PORT": "http"}, "MAIN_PROCESS_PORT=http: a TCP port in [1, 65535]"),
        ({"GPUS_PER_MACHINE": "0"}, "GPUS_PER_MACHINE=0: a positive integer is required"),
        ({"GPUS_PER_MACHINE": "2", "NUM_GPUS": "4"}, "GPUS_PER_MACHINE=2 and NUM_GPUS=4 disagree"),
        ({"BACKEND": "dataparallel"}, "backend 'dataparallel': expected one of: ddp zero2 zero3 fsdp1 fsdp2"),
    ],
)
def test_refuses_bad_input_with_one_line(variables, error):
    ran = _dry_run(**{"NUM_GPUS": "2", **variables})
    assert ran.returncode == 2, ran
    assert ran.stderr.startswith(f"error: {error}") and len(ran.stderr.splitlines()) == 1, ran.stderr


@pytest.mark.parametrize(
    "variables, machines, rank, processes, config",
    [
        ({"NUM_GPUS": "4"}, "1", "0", "4", "multi_gpu.yaml"),
        ({"NUM_MACHINES": "2", "MACHINE_RANK": "1", "MAIN_PROCESS_IP": "10.0.0.1", "NUM_GPUS": "8"},
         "2", "1", "16", "multi_gpu.yaml"),
        ({"NUM_MACHINES": "3", "MACHINE_RANK": "0", "MAIN_PROCESS_IP": "10.0.0.1", "GPUS_PER_MACHINE": "4",
          "BACKEND": "zero3"}, "3", "0", "12", "deepspeed_zero3.yaml"),
        ({"NUM_MACHINES": "02", "MACHINE_RANK": "01", "MAIN_PROCESS_IP": "10.0.0.1", "NUM_GPUS": "2",
          "BACKEND": "fsdp2"}, "2", "1", "4", "fsdp2.yaml"),
        ({"NUM_MACHINES": "4", "MACHINE_RANK": "3", "MAIN_PROCESS_IP": "10.0.0.1", "CUDA_VISIBLE_DEVICES": "0,1,2"},
         "4", "3", "12", "multi_gpu.yaml"),
    ],
    ids=["one-machine", "two-machines", "gpus-per-machine-zero3", "leading-zeros-fsdp2", "gpus-from-visible"],
)  # fmt: skip
def test_dry_run_prints_the_launch(variables, machines, rank, processes, config):
    """--num_processes counts the processes of every machine; the training options parse with this line's
    ``trl grpo`` parser and its batch fits any number of processes."""
    from trl.scripts.grpo import make_parser

    command = _command(**variables)
    assert command[:2] == ["accelerate", "launch"], command
    assert _flag(command, "--num_machines") == machines and _flag(command, "--machine_rank") == rank
    assert _flag(command, "--num_processes") == processes
    assert _flag(command, "--main_process_ip") == variables.get("MAIN_PROCESS_IP")
    assert _flag(command, "--main_process_port") == "29500"
    assert _flag(command, "--config_file") == str(REPO_ROOT / "examples" / "accelerate_configs" / config)
    module = command.index("-m")
    assert command[module + 1] == "trl.scripts.grpo"
    import torch

    # transformers 5 refuses bf16 without a GPU unless use_cpu is set (4.x accepts it)
    on_cpu = [] if torch.cuda.is_available() else ["--use_cpu", "true"]
    with mock.patch.dict(os.environ):  # TrainingArguments(bf16=True) sets ACCELERATE_MIXED_PRECISION for the process
        parsed = make_parser().parse_args_and_config(command[module + 2 :] + on_cpu)
    script_args, args = parsed[0], parsed[1]
    assert script_args.reward_model_name_or_path == "reward" and args.bf16
    assert int(processes) * args.per_device_train_batch_size % args.num_generations == 0


def test_every_machine_runs_the_same_command():
    """Only --machine_rank differs between the machines of a job."""
    shared = {"NUM_MACHINES": "3", "MAIN_PROCESS_IP": "10.0.0.1", "MAIN_PROCESS_PORT": "6000", "NUM_GPUS": "8"}
    commands = [_command(MACHINE_RANK=str(rank), **shared) for rank in range(3)]
    for rank, command in enumerate(commands):
        assert _flag(command, "--machine_rank") == str(rank) and _flag(command, "--main_process_port") == "6000"
        assert _without(command, "--machine_rank") == _without(commands[0], "--machine_rank"), command
