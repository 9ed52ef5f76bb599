"""Every recipe of ``examples/recipes/`` runs on CPU: the same command, with the harness's CPU overrides.

Each case runs a recipe as a user would (``bash examples/recipes/<recipe>.sh``) with 2 CPU ranks, the tiny fixtures
(``MODEL``, ``REWARD_MODEL``, ``DATASET`` ...), the accelerate config derived for the CPU (``ACCELERATE_CONFIG``) and
arguments appended for a one-step run (they override the recipe's, the last value wins: ``--bf16 false``, small
lengths, ``--max_steps 1``). It checks that training finished, that ``OUTPUT_DIR`` holds the trained model
(``from_pretrained`` loads every parameter of the checkpoint at its shape, trained; under FSDP2 too, since patches
0038-0040) and that the main process logged the line the recipe tells the user to look for (where each frozen model
lives). The vLLM recipe cannot run here (no vLLM): its two commands are printed (``RECIPE_DRY_RUN=1``) and parsed by
the parsers of ``trl vllm-serve`` and ``trl grpo``.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from harness.fixtures import build_fixtures, on_policy_kwargs
from harness.launcher import REPO_ROOT, derive_config, gpu_count, harness_env, run_command


RECIPES = REPO_ROOT / "examples" / "recipes"
MEASURE_HOOK = Path(__file__).with_name("measure_hook.py")
JUDGE = '''
from trl.trainer.judges import BasePairwiseJudge


class LongerIsBetterJudge(BasePairwiseJudge):
    """Deterministic local judge for the CPU test: prefers the longer completion."""

    def judge(self, prompts, completions, shuffle_order=True):
        return [0 if len(a) >= len(b) else 1 for a, b in completions]
'''

GRPO_CPU = ["--per_device_train_batch_size", "2", "--num_generations", "2", "--max_prompt_length", "32",
            "--max_completion_length", "8"]  # fmt: skip
# The rollout settings of the matrix workers (harness.fixtures.on_policy_kwargs), as command-line arguments
ON_POLICY_CPU = ["--per_device_train_batch_size", "2"] + [
    arg for key, value in on_policy_kwargs({}, total_episodes=4).items() for arg in (f"--{key}", str(value))
]
SHARED_CPU = ["--bf16", "false", "--gradient_checkpointing", "false", "--max_steps", "1", "--logging_steps", "1",
              "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--seed", "42"]  # fmt: skip

# (case id, recipe, backend, environment, CPU arguments, lines the main process must log)
CASES = [
    ("grpo-fsdp2", "grpo_frozen_models", "fsdp2", {"BACKEND": "fsdp2"}, GRPO_CPU,
     [r"reference model: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%",
      r"reward model: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%"]),
    ("online-dpo-zero3-rm", "online_dpo", "zero3", {"BACKEND": "zero3"}, ["--max_new_tokens", "8", "--max_length", "64"],
     [r"reference model: partitioned by ZeRO-3 over 2 ranks on cpu, this rank holds [456]\d%",
      r"reward model: partitioned by ZeRO-3 over 2 ranks on cpu, this rank holds [456]\d%"]),
    ("online-dpo-ddp-judge", "online_dpo", "ddp", {"BACKEND": "ddp", "JUDGE": "recipe_judges:LongerIsBetterJudge"},
     ["--max_new_tokens", "8", "--max_length", "64"],
     [r"reference model: a full replica on every rank on cpu, this rank holds 100%"]),
    ("grpo-large-zero3", "grpo_large_model", "zero3", {"BACKEND": "zero3"}, GRPO_CPU,
     [r"reward model: partitioned by ZeRO-3 over 2 ranks on cpu"]),
    ("rloo-zero3", "sharded_frozen_models", "zero3", {"TRAINER": "rloo", "BACKEND": "zero3"}, ON_POLICY_CPU,
     [r"reward model: partitioned by ZeRO-3 over 2 ranks on cpu", r"reference model: partitioned by ZeRO-3"]),
    ("ppo-zero3", "sharded_frozen_models", "zero3", {"TRAINER": "ppo", "BACKEND": "zero3"}, ON_POLICY_CPU,
     [r"reward model: partitioned by ZeRO-3 over 2 ranks on cpu", r"reference model: partitioned by ZeRO-3"]),
    ("ppo-fsdp2", "sharded_frozen_models", "fsdp2", {"TRAINER": "ppo", "BACKEND": "fsdp2"}, ON_POLICY_CPU,
     [r"reference model: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%",
      r"reward model: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%"]),
    ("gkd-fsdp2", "sharded_frozen_models", "fsdp2", {"TRAINER": "gkd", "BACKEND": "fsdp2"},
     ["--max_new_tokens", "8", "--max_length", "64"],
     [r"teacher model: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe-fixtures")
    manifest = build_fixtures(root / "fixtures")
    from datasets import load_dataset

    preference = load_dataset(manifest["preference"], split="train")
    messages = [
        [{"role": "user", "content": p}, {"role": "assistant", "content": c.strip()}]
        for p, c in zip(preference["prompt"], preference["chosen"])
    ]
    from datasets import Dataset

    (root / "messages").mkdir()
    Dataset.from_dict({"messages": messages}).to_parquet(str(root / "messages" / "train.parquet"))
    (root / "judges").mkdir()
    (root / "judges" / "recipe_judges.py").write_text(JUDGE)
    return dict(manifest, messages=str(root / "messages"), judges=str(root / "judges"))


def _recipe_env(fixtures, backend, config, work, extra, device="cpu", num_processes=2):
    env = harness_env(backend, device=device, error_dir=work / "errors", preload=[MEASURE_HOOK])
    env.update(
        NUM_GPUS=str(num_processes),
        ACCELERATE_CONFIG=str(config),
        ACCELERATE=str(Path(sys.executable).with_name("accelerate")),
        MODEL=fixtures["policy"],
        REWARD_MODEL=fixtures["reward"],
        TEACHER=fixtures["policy"],
        DATASET=fixtures["messages"] if extra.get("TRAINER") == "gkd" else fixtures["prompt_only"],
        OUTPUT_DIR=str(work / "output"),
        HF_HOME=str(work / "hf_home"),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join([fixtures["judges"], env["PYTHONPATH"]]),
        RECIPE_MEASURE_DIR=str(work / "measure"),
    )
    env.update(extra)
    return env


def run_recipe(fixtures, work, recipe, backend, extra_env, args, expected, *, device="cpu", num_processes=2):
    """Runs a recipe as a user would, checks that it trained and logged ``expected``, returns its measurements."""
    config = derive_config(backend, work / "config", device=device, num_processes=num_processes)
    env = _recipe_env(fixtures, backend, config, work, extra_env, device, num_processes)
    fresh = [work / "output", work / "measure"]  # a launch once more: measured and saved anew
    result = run_command(
        ["bash", RECIPES / f"{recipe}.sh", *args], env=env, workdir=work, backend=backend, fresh=fresh
    )
    wall = result.duration  # the launch that counts, not an aborted one before it
    result.check()
    output = result.output or Path(result.log_path).read_text(errors="replace")
    # GKD's teacher is the policy's checkpoint here (TEACHER): the distillation loss is 0, a step changes nothing
    check_saved_model(work / "output", fixtures["policy"], output, trained=extra_env.get("TRAINER") != "gkd")
    logged = [line for line in output.splitlines() if line.startswith("[INFO|trl.models.utils]")]
    for pattern in expected:
        matches = [line for line in logged if re.search(pattern, line)]
        assert len(matches) == 1, f"{pattern!r}: main process should log it once, got {logged}"
    records = [json.loads(p.read_text()) for p in sorted((work / "measure").glob("rank*.json"))]
    assert sorted(r["rank"] for r in records) == list(range(num_processes)), "a rank wrote no measurement"
    return summarize(records, wall)


def check_saved_model(output_dir, checkpoint, output="", trained=True):
    """``OUTPUT_DIR`` holds what ``from_pretrained`` loads: every parameter of the checkpoint the recipe trained, at
    its shape, none missing, not all of them still the initial ones (``trained``) (#40: under FSDP2 the final ``save_model`` wrote
    nothing before the fork's patches 0038-0040)."""
    import torch
    from transformers import AutoModelForCausalLM

    files = sorted(p.name for p in Path(output_dir).iterdir()) if Path(output_dir).is_dir() else []
    assert any(name.endswith(".safetensors") for name in files), (
        f"the recipe saved no model in OUTPUT_DIR ({files}):\n{output[-3000:]}"
    )
    saved, info = AutoModelForCausalLM.from_pretrained(output_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    initial = dict(AutoModelForCausalLM.from_pretrained(checkpoint).named_parameters())
    shapes = {name: tuple(p.shape) for name, p in saved.named_parameters()}
    expected = {name: tuple(p.shape) for name, p in initial.items()}
    assert shapes == expected, sorted(set(shapes.items()) ^ set(expected.items()))[:6]
    if trained:
        weights = dict(saved.named_parameters())
        assert any(not torch.equal(weights[n], initial[n]) for n in initial), "OUTPUT_DIR holds the initial model"


def summarize(records, wall):
    """One row of the report: seconds per step (median over the steps after the first) and peak memory per rank."""
    steps = min(len(r["step_ends"]) for r in records)
    gaps = sorted(b - a for r in records for a, b in zip(r["step_ends"][:steps], r["step_ends"][1:steps]))
    cuda = [r["cuda_max_allocated_mib"] for r in records if r["cuda_max_allocated_mib"] is not None]
    return {
        "steps": steps,
        "s_per_step": gaps[len(gaps) // 2] if gaps else None,
        "wall_s": wall,
        "max_rss_mib": max(r["max_rss_mib"] for r in records),
        "cuda_max_allocated_mib": max(cuda) if cuda else None,
        "cuda_max_reserved_mib": max(r["cuda_max_reserved_mib"] for r in records) if cuda else None,
    }


@pytest.mark.dist
@pytest.mark.parametrize(
    "recipe, backend, extra_env, cpu_args, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_recipe_trains_on_cpu(fixtures, tmp_path, recipe, backend, extra_env, cpu_args, expected):
    row = run_recipe(fixtures, tmp_path, recipe, backend, extra_env, [*cpu_args, *SHARED_CPU], expected)
    assert row["steps"] == 1 and row["max_rss_mib"] > 0 and row["cuda_max_allocated_mib"] is None, row


@pytest.fixture(scope="module")
def gpu_report():
    """Rows of the GPU runs; written as a markdown table to ``$RECIPES_REPORT`` (``make recipes-gpu``) at the end."""
    rows = []
    yield rows
    destination = os.environ.get("RECIPES_REPORT")
    if destination and rows:
        Path(destination).write_text(render_report(rows))


def render_report(rows):
    import torch

    def number(value, fmt):
        return "n/a" if value is None else format(value, fmt)

    gpus = {torch.cuda.get_device_name(i) for i in range(gpu_count())} or {"no GPU"}
    lines = [
        "# Recipes on GPUs: time per step and peak memory",
        "",
        "Written by `make recipes-gpu` (`tests/recipes/test_recipes.py::test_recipe_trains_on_gpu`): every recipe of",
        "`examples/recipes/` as a user runs it (bf16 and the recipe's own settings), with the test fixtures' models",
        "unless `RECIPES_GPU_MODEL` / `RECIPES_GPU_REWARD_MODEL` name others, the small batch and lengths of the CPU",
        f"test and {GPU_STEPS} steps. Seconds per step: median over the steps after the first, all ranks, logging",
        "included (for PPO and RLOO a step is one rollout batch and its updates). Peak GPU memory: the largest",
        "`torch.cuda.max_memory_allocated()` (reserved in brackets) of any rank, PyTorch's allocator only (the CUDA",
        "context and NCCL buffers come on top). Peak RSS: the largest resident memory of any rank.",
        "",
        f"Torch {torch.__version__}, {', '.join(sorted(gpus))}.",
        "",
        "| case | processes | model | s/step | peak GPU MiB allocated (reserved) | peak RSS MiB | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        if row.get("failed"):
            lines.append(f"| {row['case']} | {row['processes']} | {row['model']} | FAILED (see pytest) | | | |")
            continue
        peak = f"{number(row['cuda_max_allocated_mib'], '.0f')} ({number(row['cuda_max_reserved_mib'], '.0f')})"
        lines.append(
            f"| {row['case']} | {row['processes']} | {row['model']} | {number(row['s_per_step'], '.3f')} | {peak} "
            f"| {row['max_rss_mib']:.0f} | {row['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


GPU_STEPS = 5
GPU_SHARED = ["--max_steps", str(GPU_STEPS), "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
              "--disable_tqdm", "true", "--seed", "42"]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.dist
@pytest.mark.parametrize("case, recipe, backend, extra_env, cpu_args, expected", CASES, ids=[c[0] for c in CASES])
def test_recipe_trains_on_gpu(fixtures, tmp_path, gpu_report, case, recipe, backend, extra_env, cpu_args, expected):
    """The CPU case on the GPUs (one process each, the recipe's bf16), measured for docs/ (``make recipes-gpu``)."""
    num_processes = gpu_count()
    fixtures = dict(fixtures)
    fixtures["policy"] = os.environ.get("RECIPES_GPU_MODEL", fixtures["policy"])
    fixtures["reward"] = os.environ.get("RECIPES_GPU_REWARD_MODEL", fixtures["reward"])
    # Where each frozen model lives (on cuda:N); the share it holds depends on the number of GPUs
    roles = [rf"{pattern.split(':')[0]}: .* on cuda:\d+, this rank holds" for pattern in expected]
    args = [*cpu_args, *GPU_SHARED]
    if extra_env.get("TRAINER") in ("rloo", "ppo"):
        # Their loops run total_episodes / (processes x per-device batch) batches and ignore --max_steps
        args += ["--total_episodes", str(GPU_STEPS * 2 * num_processes)]
    label = dict(case=case, processes=num_processes, model=Path(fixtures["policy"]).name)
    try:
        row = run_recipe(fixtures, tmp_path, recipe, backend, extra_env, args, roles, device="cuda",
                         num_processes=num_processes)  # fmt: skip
        assert row["steps"] == GPU_STEPS and row["cuda_max_allocated_mib"] > 0, row
    except BaseException:
        gpu_report.append(dict(label, failed=True))
        raise
    gpu_report.append(dict(row, **label))


def _dry_run(recipe, env):
    out = subprocess.run(
        ["bash", RECIPES / f"{recipe}.sh"], env=env, capture_output=True, text=True, check=True, timeout=60
    ).stderr
    return [shlex.split(line[2:]) for line in out.splitlines() if line.startswith("+ ")]


@pytest.mark.parametrize("lora, backend", [("", "fsdp2"), ("1", "zero3")])
def test_vllm_server_recipe_parses(lora, backend):
    """Parsing only (no vLLM here): the server command and the training command each parse, with their flags."""
    from trl.scripts.grpo import make_parser as grpo_parser
    from trl.scripts.vllm_serve import make_parser as vllm_serve_parser

    env = dict(os.environ, RECIPE_DRY_RUN="1", NUM_GPUS="4", REWARD_MODEL="reward", LORA=lora, BACKEND=backend,
               VLLM_SYNC_MB="64")  # fmt: skip
    serve, train = _dry_run("grpo_vllm_server", env)
    assert serve[0] == "CUDA_VISIBLE_DEVICES=0" and serve[-1] == "&"  # GPU 0, in the background
    serve = serve[1:-1]
    assert serve[:2] == ["trl", "vllm-serve"]
    (serve_args,) = vllm_serve_parser().parse_args_and_config(serve[2:])
    assert serve_args.model == "Qwen/Qwen2.5-0.5B-Instruct"

    module = train.index("-m")
    assert train[module + 1] == "trl.scripts.grpo" and train[train.index("--num_processes") + 1] == "3"
    assert train[train.index("--config_file") + 1].endswith("fsdp2.yaml" if backend == "fsdp2" else "zero3.yaml")
    with mock.patch.dict(os.environ):  # TrainingArguments(bf16=True) sets ACCELERATE_MIXED_PRECISION for the process
        script_args, args, model_args = grpo_parser().parse_args_and_config(train[module + 2 :])
    assert args.use_vllm and args.vllm_sync_bucket_size_mb == 64 and args.vllm_server_port == 8000
    assert model_args.use_peft == bool(lora)
    assert args.per_device_train_batch_size * 3 % args.num_generations == 0  # GRPO refuses any other batch


@pytest.mark.parametrize("recipe", ["grpo_frozen_models", "grpo_large_model", "grpo_vllm_server"])
@pytest.mark.parametrize("num_gpus", [2, 3, 4, 8])
def test_grpo_recipe_batch_fits_any_gpu_count(recipe, num_gpus):
    """GRPO needs (processes x per-device batch) divisible by num_generations: the recipes' defaults must fit any
    NUM_GPUS (the CPU runs override the batch size, so this checks the defaults themselves)."""
    from trl.scripts.grpo import make_parser as grpo_parser

    env = dict(os.environ, RECIPE_DRY_RUN="1", NUM_GPUS=str(num_gpus), REWARD_MODEL="reward")
    (train,) = [cmd for cmd in _dry_run(recipe, env) if "-m" in cmd]
    processes = int(train[train.index("--num_processes") + 1])
    with mock.patch.dict(os.environ):  # TrainingArguments(bf16=True) sets ACCELERATE_MIXED_PRECISION for the process
        _, args, _ = grpo_parser().parse_args_and_config(train[train.index("-m") + 2 :])
    assert processes * args.per_device_train_batch_size % args.num_generations == 0, (processes, args)


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("[!_]*.sh")))
def test_every_recipe_has_a_cpu_test(recipe):
    """A new recipe needs a case here; in a dry run every recipe prints the commands it would run."""
    tested = {c[1] for c in CASES} | {"grpo_vllm_server", "multi_machine"}  # multi_machine: test_multi_machine.py
    assert recipe in tested, f"examples/recipes/{recipe}.sh has no CPU test"
    env = dict(os.environ, RECIPE_DRY_RUN="1", NUM_GPUS="4", REWARD_MODEL="reward", TEACHER="teacher")
    commands = _dry_run(recipe, env)
    assert commands
    for command in commands:
        while "=" in command[0]:  # environment assignments (CUDA_VISIBLE_DEVICES=0 trl vllm-serve ...)
            command = command[1:]
        assert command[0].endswith("accelerate") or command[0] == "trl", command


def _recipe_names():
    return sorted(p.stem for p in RECIPES.glob("[!_]*.sh"))


@pytest.mark.parametrize("recipe", _recipe_names())
@pytest.mark.parametrize("num_gpus", ["0", "abc", "-1", "1.5", "2x", " 2"])
def test_num_gpus_must_be_a_positive_integer(recipe, num_gpus):
    """NUM_GPUS=0 / abc / ... is refused with one line, before anything is printed or run."""
    env = dict(os.environ, RECIPE_DRY_RUN="1", NUM_GPUS=num_gpus, REWARD_MODEL="reward", TEACHER="teacher")
    ran = subprocess.run(["bash", RECIPES / f"{recipe}.sh"], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2, ran
    assert (
        ran.stderr
        == f"error: NUM_GPUS={num_gpus}: a positive integer is required (the number of GPUs, one process each)\n"
    )


@pytest.mark.parametrize(
    "variables, expected",
    [
        ({}, "fsdp2.yaml"),
        ({"BACKEND": "fsdp1"}, "fsdp1.yaml"),
        ({"FSDP": "fsdp1"}, "fsdp1.yaml"),  # the recipe's old name, kept as an alias
        ({"FSDP": "fsdp1", "BACKEND": "fsdp1"}, "fsdp1.yaml"),
        ({"FSDP": "fsdp1", "BACKEND": "fsdp2"}, "error: BACKEND=fsdp2 and FSDP=fsdp1 disagree"),
        ({"BACKEND": "zero3"}, "error: backend 'zero3': expected one of: fsdp1 fsdp2"),
    ],
    ids=["default", "backend", "fsdp-alias", "both-agree", "conflict", "not-fsdp"],
)
def test_grpo_frozen_models_reads_backend(variables, expected):
    """grpo_frozen_models.sh takes BACKEND= like the other recipes (it used to read FSDP= only, ignoring BACKEND)."""
    env = {k: v for k, v in os.environ.items() if k not in ("BACKEND", "FSDP", "ACCELERATE_CONFIG")}
    env.update(RECIPE_DRY_RUN="1", NUM_GPUS="2", REWARD_MODEL="reward", **variables)
    ran = subprocess.run(
        ["bash", RECIPES / "grpo_frozen_models.sh"], env=env, capture_output=True, text=True, timeout=60
    )
    if expected.startswith("error"):
        assert ran.returncode == 2 and ran.stderr.startswith(expected) and len(ran.stderr.splitlines()) == 1, ran
    else:
        assert ran.returncode == 0, ran
        (train,) = [shlex.split(line[2:]) for line in ran.stderr.splitlines() if line.startswith("+ ")]
        assert train[train.index("--config_file") + 1] == str(REPO_ROOT / "examples" / "accelerate_configs" / expected)


RECORDER = """#!{python}
import json, os, sys, time
name = os.path.basename(sys.argv[0])
record = {{"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "VLLM_API_KEY": os.environ.get("VLLM_API_KEY"),
          "argv": sys.argv}}
path = os.path.join(os.environ["RECORD_DIR"], name + ".json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
if name == "trl":
    time.sleep(60)  # the vLLM server: the recipe stops it when it exits
"""
FAKE_CURL = """#!/usr/bin/env bash
for _ in $(seq 200); do [ -f "$RECORD_DIR/trl.json" ] && exit 0; sleep 0.05; done
exit 1
"""


@pytest.mark.parametrize("visible, num_gpus, vllm_gpu, train_gpus", [
    (None, "4", "0", "1,2,3"),
    ("4,5,6,7", None, "4", "5,6,7"),  # NUM_GPUS from CUDA_VISIBLE_DEVICES: its GPUs, not 0..3
    ("4,5,6,7", "3", "4", "5,6"),
])  # fmt: skip
def test_vllm_server_dry_run_prints_what_the_real_run_does(tmp_path, visible, num_gpus, vllm_gpu, train_gpus):
    """RECIPE_DRY_RUN=1 prints each command with the CUDA_VISIBLE_DEVICES the real run gives it (the training
    command used to be printed without one: copied, it trained on the vLLM GPU too). The real run here starts
    stand-ins for `trl`, `curl` and `accelerate` that record their environment and arguments."""
    bin_dir, records = tmp_path / "bin", tmp_path / "records"
    bin_dir.mkdir()
    records.mkdir()
    for name, text in (("trl", RECORDER.format(python=sys.executable)), ("accelerate", RECORDER.format(
            python=sys.executable)), ("curl", FAKE_CURL)):  # fmt: skip
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "NUM_GPUS", "ACCELERATE",
                                                            "VLLM_API_KEY")}  # fmt: skip
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", RECORD_DIR=str(records), REWARD_MODEL="reward",
               ACCELERATE=str(bin_dir / "accelerate"))  # fmt: skip
    env.update({k: v for k, v in (("CUDA_VISIBLE_DEVICES", visible), ("NUM_GPUS", num_gpus)) if v is not None})

    serve, train = _dry_run("grpo_vllm_server", dict(env, RECIPE_DRY_RUN="1"))
    assert serve[0] == f"CUDA_VISIBLE_DEVICES={vllm_gpu}" and serve[-1] == "&"
    assert train[0] == f"CUDA_VISIBLE_DEVICES={train_gpus}"

    real = subprocess.run(["bash", RECIPES / "grpo_vllm_server.sh"], env=env, check=True, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    served = json.loads((records / "trl.json").read_text())
    trained = json.loads((records / "accelerate.json").read_text())
    assert [f"CUDA_VISIBLE_DEVICES={served['CUDA_VISIBLE_DEVICES']}", "trl", *served["argv"][1:], "&"] == serve
    assert [f"CUDA_VISIBLE_DEVICES={trained['CUDA_VISIBLE_DEVICES']}", *trained["argv"]] == train
    assert trained["argv"][trained["argv"].index("--num_processes") + 1] == str(len(train_gpus.split(",")))
    # The server and the trainer share a token (#41): made by the recipe when the user set none, never printed
    token = served["VLLM_API_KEY"]
    assert token and token == trained["VLLM_API_KEY"] and len(token) >= 32
    assert token not in real.stdout + real.stderr
    mine = subprocess.run(["bash", RECIPES / "grpo_vllm_server.sh"], env=dict(env, VLLM_API_KEY="my-token-4d1f"),
                          check=True, capture_output=True, text=True, timeout=120)  # fmt: skip
    served = json.loads((records / "trl.json").read_text())
    trained = json.loads((records / "accelerate.json").read_text())
    assert served["VLLM_API_KEY"] == trained["VLLM_API_KEY"] == "my-token-4d1f"
    assert "my-token-4d1f" not in mine.stdout + mine.stderr


def test_report_from_measurements(tmp_path):
    """The GPU report's arithmetic and table, on made-up measurements of two ranks (runs without a GPU)."""
    records = [
        {"rank": 0, "step_ends": [10.0, 10.5, 11.2, 11.6], "max_rss_mib": 900.0,
         "cuda_max_allocated_mib": 1200.0, "cuda_max_reserved_mib": 1500.0},
        {"rank": 1, "step_ends": [10.1, 10.4, 11.0, 11.5], "max_rss_mib": 950.0,
         "cuda_max_allocated_mib": 1100.0, "cuda_max_reserved_mib": 1600.0},
    ]  # fmt: skip
    row = summarize(records, wall=42.0)
    # gaps after the first step: 0.5 0.7 0.4 (rank 0), 0.3 0.6 0.5 (rank 1) -> median of six = the 4th smallest
    assert row["steps"] == 4 and row["s_per_step"] == pytest.approx(0.5)
    assert row["cuda_max_allocated_mib"] == 1200.0 and row["cuda_max_reserved_mib"] == 1600.0
    assert row["max_rss_mib"] == 950.0
    table = render_report([dict(row, case="grpo-fsdp2", processes=2, model="policy")])
    assert "| grpo-fsdp2 | 2 | policy | 0.500 | 1200 (1600) | 950 | 42 |" in table
    assert "| ppo-fsdp2 | 2 | policy | FAILED (see pytest) |" in render_report(
        [dict(case="ppo-fsdp2", processes=2, model="policy", failed=True)]
    )
    one_step = summarize([dict(records[0], step_ends=[3.0], cuda_max_allocated_mib=None)], wall=5.0)
    assert one_step["s_per_step"] is None and one_step["cuda_max_allocated_mib"] is None
