"""A 2-process ``accelerate launch`` on this GPU-less machine, as a user runs it (no harness shim, no CPU flag).

Accelerate (1.10 and later) sets up a run of one process in each launched process when it finds no accelerator:
pristine TRL 1.16.0 then trains each process alone and exits 0. The fork's trainers stop at setup on every process
with the cause and the fix (``_check_processes_train_together``), and the fix it names (``ACCELERATE_USE_CPU=true``)
trains the two processes together. With the FSDP2 example config, that fix makes Accelerate drop FSDP (it uses FSDP
and DeepSpeed only on accelerators) and pristine 1.16.0 trains with DDP, each process holding the whole model; the
fork stops at setup on every process (``_check_launch_backend_is_used``). About 40 s.
"""

import os
import sys
from pathlib import Path

import pytest
from harness.launcher import free_port, run_command


SCRIPT = Path(__file__).resolve().parent / "launched_alone_script.py"
CONFIGS = Path(__file__).resolve().parents[4] / "examples" / "accelerate_configs"


def _launch(tmp_path, config_file=None, **env):
    import trl

    environ = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "TRL_HARNESS"))}
    trl_root = str(Path(trl.__file__).resolve().parents[1])  # the tree under test reaches the launched processes
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [trl_root, environ.get("PYTHONPATH")]))
    environ.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **env)  # as on this machine
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2"]
    # the example config as a user passes it (FSDP2 in it); without one, the flags of a plain multi-process launch
    cmd += ["--config_file", str(config_file)] if config_file else ["--multi_gpu"]
    cmd += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["--main_process_port", str(free_port()), str(SCRIPT), str(tmp_path / "out")]
    # the harness's runner: the whole process tree ends at the timeout, and a launch that hit gloo's rare C++ abort
    # after its work is run once more
    return run_command(cmd, env=environ, workdir=tmp_path, backend="launched-alone", timeout=300)


@pytest.mark.dist
def test_a_launch_whose_processes_would_train_alone_stops_at_setup(tmp_path):
    result = _launch(tmp_path)
    output = result.output
    assert result.returncode != 0, f"the launch exited 0:\n{output[-3000:]}"
    assert "[script]" not in output, output[-3000:]  # no process trained
    # torch prefixes each rank's traceback (the launched processes do form a process group; Accelerate ignores it)
    for rank in (0, 1):
        assert f"[rank{rank}]: RuntimeError: This process is one of 2 launched processes" in output, output[-3000:]


@pytest.mark.dist
def test_the_named_fix_trains_the_processes_together(tmp_path):
    result = _launch(tmp_path, ACCELERATE_USE_CPU="true")
    output = result.output
    assert result.returncode == 0, output[-3000:]
    for rank in (0, 1):
        assert f"[script] rank {rank} of 2 trained" in output, output[-3000:]


@pytest.mark.dist
def test_the_named_fix_with_an_fsdp_config_stops_at_setup(tmp_path):
    # `ACCELERATE_USE_CPU=true` makes Accelerate drop FSDP (and DeepSpeed): pristine 1.16.0 then trains both processes
    # with DDP, each holding the whole model, and exits 0; the fork stops at setup on every process
    result = _launch(tmp_path, config_file=CONFIGS / "fsdp2.yaml", ACCELERATE_USE_CPU="true")
    output = result.output
    assert result.returncode != 0, f"the launch exited 0:\n{output[-3000:]}"
    assert "[script]" not in output, output[-3000:]
    for rank in (0, 1):
        assert f"[rank{rank}]: RuntimeError: This process was launched to run under FSDP" in output, output[-3000:]
