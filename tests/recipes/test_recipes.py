"""Every recipe of ``examples/recipes/`` runs on CPU: the same command, with the harness's CPU overrides.

Each case runs a recipe as a user would (``bash examples/recipes/<recipe>.sh``) with 2 CPU ranks, the tiny fixtures
(``MODEL``, ``REWARD_MODEL``, ``DATASET`` ...), the accelerate config derived for the CPU (``ACCELERATE_CONFIG``) and
arguments appended for a one-step run (they override the recipe's, the last value wins: ``--bf16 false``, small
lengths, ``--max_steps 1``). It checks that training finished (the model is saved in ``OUTPUT_DIR``; under FSDP2, where ``save_model``
writes nothing with accelerate 1.6, the final metrics are logged) and that the main process logged the line the recipe
tells the user to look for (where each frozen model lives). The vLLM recipe cannot run here (no vLLM): its two
commands are printed (``RECIPE_DRY_RUN=1``) and parsed by the parsers of ``trl vllm-serve`` and ``trl grpo``.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from harness.fixtures import build_fixtures, on_policy_kwargs
from harness.launcher import REPO_ROOT, derive_config, harness_env, run_command


RECIPES = REPO_ROOT / "examples" / "recipes"
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
    ("grpo-fsdp2", "grpo_frozen_models", "fsdp2", {"FSDP": "fsdp2"}, GRPO_CPU,
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


def _recipe_env(fixtures, backend, config, work, extra):
    env = harness_env(backend, device="cpu", error_dir=work / "errors")
    env.update(
        NUM_GPUS="2",
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
    )
    env.update(extra)
    return env


@pytest.mark.dist
@pytest.mark.parametrize(
    "recipe, backend, extra_env, cpu_args, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_recipe_trains_on_cpu(fixtures, tmp_path, recipe, backend, extra_env, cpu_args, expected):
    config = derive_config(backend, tmp_path / "config", device="cpu", num_processes=2)
    env = _recipe_env(fixtures, backend, config, tmp_path, extra_env)
    result = run_command(
        ["bash", RECIPES / f"{recipe}.sh", *cpu_args, *SHARED_CPU], env=env, workdir=tmp_path, backend=backend
    )
    result.check()
    output = result.output or Path(result.log_path).read_text(errors="replace")
    saved = sorted(p.name for p in (tmp_path / "output").glob("*.safetensors"))
    if backend == "fsdp2":  # accelerate 1.6 saves FSDP2 models as sharded checkpoints only: save_model writes nothing
        assert "'train_loss'" in output or "'objective/kl'" in output, output[-3000:]
    else:
        assert saved, f"the recipe saved no model in OUTPUT_DIR:\n{output[-3000:]}"
    logged = [line for line in output.splitlines() if line.startswith("[INFO|trl.models.utils]")]
    for pattern in expected:
        matches = [line for line in logged if re.search(pattern, line)]
        assert len(matches) == 1, f"{pattern!r}: main process should log it once, got {logged}"


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
    tested = {c[1] for c in CASES} | {"grpo_vllm_server"}
    assert recipe in tested, f"examples/recipes/{recipe}.sh has no CPU test"
    env = dict(os.environ, RECIPE_DRY_RUN="1", NUM_GPUS="4", REWARD_MODEL="reward", TEACHER="teacher")
    commands = _dry_run(recipe, env)
    assert commands
    for command in commands:
        while "=" in command[0]:  # environment assignments (CUDA_VISIBLE_DEVICES=0 trl vllm-serve ...)
            command = command[1:]
        assert command[0].endswith("accelerate") or command[0] == "trl", command
