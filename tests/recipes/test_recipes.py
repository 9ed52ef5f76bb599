"""Every recipe of ``examples/recipes/`` runs on CPU: the same command, with the harness's CPU overrides.

Both lines: each test runs with the line of the ``trl`` its Python imports, and the recipes find that line the same
way (the Python of ``accelerate``), so the lead runs the file once per line::

    lines/1.16.0/.venv/bin/python -m pytest tests/recipes/test_recipes.py     # TRL 1.16.0+fork (in its `make test`)
    lines/0.16.1/.venv/bin/python -m pytest tests/recipes/test_recipes.py     # TRL 0.16.1+fork

Each case runs a recipe as a user would (``bash examples/recipes/<recipe>.sh``) with 2 CPU ranks, the tiny fixtures
(``MODEL``, ``REWARD_MODEL``, ``DATASET`` ...), the accelerate config derived for the CPU (``ACCELERATE_CONFIG``) and
arguments appended for a one-step run (the last value wins: ``--bf16 false``, small batches and lengths,
``--max_steps 1``). The command that ran must be the recipe's own command (its dry run, ``RECIPE_DRY_RUN=1``) with
those arguments after it, and they may repeat only the recipe's flags named in ``CPU_OVERRIDES`` (sizes and
precision, never a flag that selects what the recipe shows). It checks that training finished, that ``OUTPUT_DIR``
holds the trained model (``from_pretrained`` loads every parameter of the checkpoint at its shape, trained; under FSDP2
too, since patches 0038-0040 on 0.16.1 and 0020 on 1.16.0) and that the main process logged the line the recipe tells
the user to look for (where each frozen model lives). On 1.16.0 the launches also need the harness's accelerate >=
1.10 shim (``tests/harness/accelerate110.py``, preloaded). A case the line lacks (PPO and a pairwise judge on 1.16.0)
is skipped there; the recipe stops with one line instead (``test_recipe_stops_where_the_line_lacks_it``).

``test_gpu_command_parses``: each recipe's GPU command, printed with ``RECIPE_DRY_RUN=1`` and ``NUM_GPUS=8`` and left
untouched, parses with the parsers that will read it on this line: ``accelerate launch``'s, then the script's
``TrlParser`` (``trl grpo``, ``trl rloo``, ``trl vllm-serve``, ``examples/scripts/*.py``). Without CUDA ``--use_cpu
true`` is added for the parse only (transformers 5 refuses bf16 without a GPU otherwise); the recipes never pass it.
The vLLM recipe cannot run here (no vLLM): its two commands are checked this way only.
"""

import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import accelerate
import pytest
from harness.accelerate110 import SHIM_FILE as ACCELERATE110_SHIM
from harness.fixtures import build_fixtures, on_policy_kwargs
from harness.launcher import REPO_ROOT, derive_config, gpu_count, harness_env, run_command
from harness.marks import limitation, marks_for
from packaging.version import Version

import trl


RECIPES = REPO_ROOT / "examples" / "recipes"
MEASURE_HOOK = Path(__file__).with_name("measure_hook.py")
JUDGE = '''
from trl.trainer.judges import BasePairwiseJudge


class LongerIsBetterJudge(BasePairwiseJudge):
    """Deterministic local judge for the CPU test: prefers the longer completion."""

    def judge(self, prompts, completions, shuffle_order=True):
        return [0 if len(a) >= len(b) else 1 for a, b in completions]
'''

# The line of the trl this Python imports; the recipes find the same one (the Python of their `accelerate`)
LINE = "0.16.1" if trl.__version__.startswith("0.") else "1.16.0"
BOTH = ("1.16.0", "0.16.1")

GRPO_CPU = ["--per_device_train_batch_size", "2", "--num_generations", "2", "--max_completion_length", "8"]
# The rollout settings of the 0.16.1 matrix workers (harness.fixtures.on_policy_kwargs), as command-line arguments
ON_POLICY_CPU = ["--per_device_train_batch_size", "2"] + [
    arg for key, value in on_policy_kwargs({}, total_episodes=4).items() for arg in (f"--{key}", str(value))
]
GENERATE_CPU = ["--max_new_tokens", "8", "--max_length", "64"]
SHARED_CPU = ["--bf16", "false", "--gradient_checkpointing", "false", "--max_steps", "1", "--logging_steps", "1",
              "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--seed", "42"]  # fmt: skip
# The only flags of a recipe's command that the CPU arguments may give again (the last value wins): precision, sizes
# and logging. A flag that selects what the recipe shows (--beta, --generation_gather_budget_mb, a model ...) is the
# recipe's, as a user runs it.
CPU_OVERRIDES = {"--bf16", "--gradient_checkpointing", "--per_device_train_batch_size", "--num_generations",
                 "--max_completion_length", "--max_new_tokens", "--response_length", "--total_episodes",
                 "--missing_eos_penalty", "--logging_steps"}  # fmt: skip
REWARD = "reward model[^:]*"  # 1.16.0 names it: "reward model reward: ..."

# (case id, recipe, backend, environment, {line: CPU arguments} (the lines it runs on), lines the main process logs)
CASES = [
    ("grpo-fsdp2", "grpo_frozen_models", "fsdp2", {"BACKEND": "fsdp2"}, dict.fromkeys(BOTH, GRPO_CPU),
     [r"reference model: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%",
      rf"{REWARD}: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%"]),
    ("online-dpo-zero3-rm", "online_dpo", "zero3", {"BACKEND": "zero3"}, dict.fromkeys(BOTH, GENERATE_CPU),
     [r"reference model: partitioned by ZeRO-3 over 2 ranks on cpu, this rank holds [456]\d%",
      rf"{REWARD}: partitioned by ZeRO-3 over 2 ranks on cpu, this rank holds [456]\d%"]),
    ("online-dpo-ddp-judge", "online_dpo", "ddp", {"BACKEND": "ddp", "JUDGE": "recipe_judges:LongerIsBetterJudge"},
     {"0.16.1": GENERATE_CPU}, [r"reference model: a full replica on every rank on cpu, this rank holds 100%"]),
    ("grpo-large-zero3", "grpo_large_model", "zero3", {"BACKEND": "zero3"}, dict.fromkeys(BOTH, GRPO_CPU),
     [rf"{REWARD}: partitioned by ZeRO-3 over 2 ranks on cpu"]),
    ("grpo-large-fsdp2", "grpo_large_model", "fsdp2", {"BACKEND": "fsdp2"}, {"1.16.0": GRPO_CPU},
     [rf"{REWARD}: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%"]),
    ("rloo-zero3", "sharded_frozen_models", "zero3", {"TRAINER": "rloo", "BACKEND": "zero3"},
     {"0.16.1": ON_POLICY_CPU, "1.16.0": GRPO_CPU},
     [rf"{REWARD}: partitioned by ZeRO-3 over 2 ranks on cpu", r"reference model: partitioned by ZeRO-3"]),
    ("ppo-zero3", "sharded_frozen_models", "zero3", {"TRAINER": "ppo", "BACKEND": "zero3"}, {"0.16.1": ON_POLICY_CPU},
     [rf"{REWARD}: partitioned by ZeRO-3 over 2 ranks on cpu", r"reference model: partitioned by ZeRO-3"]),
    ("ppo-fsdp2", "sharded_frozen_models", "fsdp2", {"TRAINER": "ppo", "BACKEND": "fsdp2"}, {"0.16.1": ON_POLICY_CPU},
     [r"reference model: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%",
      rf"{REWARD}: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%"]),
    ("gkd-fsdp2", "sharded_frozen_models", "fsdp2", {"TRAINER": "gkd", "BACKEND": "fsdp2"},
     dict.fromkeys(BOTH, GENERATE_CPU), [r"teacher model: sharded by FSDP2 over 2 ranks on cpu, this rank holds 5\d%"]),
]  # fmt: skip


# What a case is known to do wrong on a line (tests/harness/marks.py): a strict expected failure, which must fail the
# way the entry says (and fails the run once it passes)
KNOWN = {
    ("grpo-large-zero3", "1.16.0"): [limitation(
        r"Cannot partition a param in flight",
        "TRL 1.16.0's fused LM head under ZeRO-3, in the first training step after a generation through DeepSpeed's "
        "per-forward gathering (--generation_gather_budget_mb 0; pristine 1.16.0 with --ds3_gather_for_generation "
        "false fails the same): its lm_head weight is in flight when GatheredParameters exits")],
}  # fmt: skip


def _cpu_cases():
    return [pytest.param(*case, id=case[0], marks=marks_for(KNOWN.get((case[0], LINE), []))) for case in CASES]


def _cpu_args(case_id, by_line):
    """The case's CPU arguments on this line; skips (with the reason) a case that does not run on this line."""
    if LINE not in by_line:
        pytest.skip(f"{case_id}: runs on the {' and '.join(sorted(by_line))} line only (the {LINE} line lacks it, "
                    "or another case covers it here)")  # fmt: skip
    return by_line[LINE]


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
    preload = [MEASURE_HOOK]
    if device == "cpu" and Version(accelerate.__version__) >= Version("1.10"):
        preload.insert(0, ACCELERATE110_SHIM)  # a distributed run on CPU ranks (the 1.16.0 line's accelerate)
    env = harness_env(backend, device=device, error_dir=work / "errors", preload=preload)
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
    (gpu_command,) = _dry_run(recipe, dict(env, RECIPE_DRY_RUN="1"))  # the recipe's own command, untouched
    repeated = sorted({a for a in args if a.startswith("--")} & {w for w in gpu_command if w.startswith("--")})
    assert set(repeated) <= CPU_OVERRIDES, f"the CPU arguments replace flags of the recipe: {repeated}"
    fresh = [work / "output", work / "measure"]  # a launch once more: measured and saved anew
    result = run_command(
        ["bash", RECIPES / f"{recipe}.sh", *args], env=env, workdir=work, backend=backend, fresh=fresh
    )
    wall = result.duration  # the launch that counts, not an aborted one before it
    result.check()
    output = result.output or Path(result.log_path).read_text(errors="replace")
    (ran,) = [shlex.split(line[2:]) for line in output.splitlines() if line.startswith("+ ")]
    assert ran == [*gpu_command, *args], (
        f"the run's command is not the recipe's with the CPU arguments after it: {ran}"
    )
    # GKD's teacher is the policy's checkpoint here (TEACHER): the distillation loss is 0, a step changes nothing
    check_saved_model(work / "output", fixtures["policy"], output, trained=extra_env.get("TRAINER") != "gkd")
    # A log line can follow a progress bar's unfinished line (tqdm ends it with "\r", not a newline): from its marker on
    marker = "[INFO|trl.models.utils]"
    logged = [marker + line.split(marker, 1)[1] for line in output.splitlines() if marker in line]
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
@pytest.mark.parametrize("case, recipe, backend, extra_env, cpu_args, expected", _cpu_cases())
def test_recipe_trains_on_cpu(fixtures, tmp_path, case, recipe, backend, extra_env, cpu_args, expected):
    args = [*_cpu_args(case, cpu_args), *SHARED_CPU]
    row = run_recipe(fixtures, tmp_path, recipe, backend, extra_env, args, expected)
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
    roles = [rf"{pattern.split(': ')[0]}: .* on cuda:\d+, this rank holds" for pattern in expected]
    args = [*_cpu_args(case, cpu_args), *GPU_SHARED]
    if extra_env.get("TRAINER") in ("rloo", "ppo") and LINE == "0.16.1":
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


# The recipes' variables: the dry-run tests set them, never inherit them
VARIABLES = ("NUM_GPUS", "BACKEND", "FSDP", "ACCELERATE_CONFIG", "ACCELERATE", "CUDA_VISIBLE_DEVICES", "MODEL",
             "REWARD_MODEL", "TEACHER", "DATASET", "TRAINER", "JUDGE", "LORA", "VLLM_SYNC_MB", "VLLM_API_KEY",
             "TOTAL_EPISODES", "OUTPUT_DIR", "RECIPE_DRY_RUN", "NUM_MACHINES", "MACHINE_RANK", "MAIN_PROCESS_IP",
             "MAIN_PROCESS_PORT", "GPUS_PER_MACHINE")  # fmt: skip


def _dry_env(**variables):
    """A dry run's environment: this Python's bin directory first on PATH, as in its activated venv, so that the
    recipe's ``accelerate`` (and the trl it imports, which decides the line) is this Python's."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]), RECIPE_DRY_RUN="1",
               NUM_GPUS="8", REWARD_MODEL="reward", TEACHER="teacher")  # fmt: skip
    env.update(variables)
    return env


def _script_parser(launch):
    """The parser of the script that ``accelerate launch`` runs: ``make_parser`` of the module or file."""
    if launch.module:
        return importlib.import_module(launch.training_script).make_parser()
    path = Path(launch.training_script)
    spec = importlib.util.spec_from_file_location(f"recipe_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_parser(launch.training_script_args)


def parse_command(command):
    """A printed command, untouched, through the parsers that read it on this line: ``trl vllm-serve``'s, or
    ``accelerate launch``'s and then its script's (a ``TrlParser``). Returns (the launch's arguments or None, the
    parsed dataclasses). Without CUDA ``--use_cpu true`` is added to the script's arguments (transformers 5 refuses
    bf16 without a GPU otherwise): the recipes never pass it."""
    while "=" in command[0]:  # environment assignments (CUDA_VISIBLE_DEVICES=0 trl vllm-serve ...)
        command = command[1:]
    if command[-1] == "&":  # started in the background
        command = command[:-1]
    if command[:2] == ["trl", "vllm-serve"]:
        from trl.scripts.vllm_serve import make_parser

        return None, make_parser().parse_args_and_config(command[2:])
    from accelerate.commands.launch import launch_command_parser

    assert Path(command[0]).name == "accelerate" and command[1] == "launch", command
    launch = launch_command_parser().parse_args(command[2:])
    import torch

    assert "--use_cpu" not in launch.training_script_args, "a recipe for GPUs passes --use_cpu"
    on_cpu = [] if torch.cuda.is_available() else ["--use_cpu", "true"]
    with mock.patch.dict(os.environ):  # TrainingArguments(bf16=True) sets ACCELERATE_MIXED_PRECISION for the process
        return launch, _script_parser(launch).parse_args_and_config(launch.training_script_args + on_cpu)


# (recipe, variables): every command each recipe prints on this line, for each backend and trainer it takes
GPU_COMMANDS = [
    ("grpo_frozen_models", {}), ("grpo_frozen_models", {"BACKEND": "fsdp1"}),
    ("grpo_large_model", {}), ("grpo_large_model", {"BACKEND": "fsdp1"}), ("grpo_large_model", {"BACKEND": "fsdp2"}),
    ("grpo_vllm_server", {}), ("grpo_vllm_server", {"LORA": "1", "BACKEND": "zero3"}),
    ("online_dpo", {}), ("online_dpo", {"BACKEND": "ddp"}), ("online_dpo", {"BACKEND": "zero2"}),
    ("online_dpo", {"BACKEND": "ddp", "JUDGE": "pair_rm", "LINES": "0.16.1"}),
    ("sharded_frozen_models", {"TRAINER": "rloo"}), ("sharded_frozen_models", {"TRAINER": "rloo", "BACKEND": "zero3"}),
    ("sharded_frozen_models", {"TRAINER": "ppo", "BACKEND": "fsdp2", "LINES": "0.16.1"}),
    ("sharded_frozen_models", {"TRAINER": "gkd"}), ("sharded_frozen_models", {"TRAINER": "gkd", "BACKEND": "fsdp2"}),
    ("multi_machine", {}), ("multi_machine", {"NUM_MACHINES": "2", "MACHINE_RANK": "1", "MAIN_PROCESS_IP": "10.0.0.1",
                                              "BACKEND": "zero3"}),
]  # fmt: skip


@pytest.mark.parametrize("recipe, variables", GPU_COMMANDS, ids=["-".join([r, *v.values()]) for r, v in GPU_COMMANDS])
def test_gpu_command_parses(recipe, variables):
    """Each recipe's GPU command (``NUM_GPUS=8``), as printed and untouched, parses on this line: a flag the line
    rejects fails here. GRPO (and RLOO on 1.16.0) needs (processes x per-device batch) divisible by num_generations:
    the recipes' per-device batch is a multiple of it, so that their defaults fit any NUM_GPUS."""
    variables = dict(variables)
    lines = variables.pop("LINES", " ".join(BOTH))
    if LINE not in lines.split():
        pytest.skip(f"the {LINE} line lacks it (test_recipe_stops_where_the_line_lacks_it)")
    commands = _dry_run(recipe, _dry_env(**variables))
    assert len(commands) == (2 if recipe == "grpo_vllm_server" else 1), commands
    for command in commands:
        launch, parsed = parse_command(command)
        if launch is None:  # trl vllm-serve
            assert parsed[0].model == "Qwen/Qwen2.5-0.5B-Instruct"
            continue
        args = parsed[1]
        assert args.log_level == "info" and args.bf16, args  # the recipes' bf16, on every line
        if getattr(args, "num_generations", None):  # GRPO; RLOO on 1.16.0
            assert args.per_device_train_batch_size % args.num_generations == 0, args


@pytest.mark.parametrize("recipe, variables, error", [
    ("sharded_frozen_models", {"TRAINER": "ppo"}, "error: TRAINER=ppo: TRL 1.16.0+fork"),
    ("sharded_frozen_models", {"TRAINER": "rloo", "TOTAL_EPISODES": "100"}, "error: TOTAL_EPISODES=100: the 0.16.1"),
    ("online_dpo", {"JUDGE": "pair_rm"}, "error: JUDGE=pair_rm: TRL 1.16.0+fork"),
    ("grpo_vllm_server", {"VLLM_SYNC_MB": "64"}, "error: VLLM_SYNC_MB=64: the 0.16.1 line's sync bucket"),
])  # fmt: skip
def test_recipe_stops_where_the_line_lacks_it(recipe, variables, error):
    """What the 1.16.0 line lacks (PPO, pairwise judges, RLOO's episodes, the vLLM sync bucket) stops the recipe
    with one line, before anything runs; the 0.16.1 line prints its command."""
    ran = subprocess.run(["bash", RECIPES / f"{recipe}.sh"], env=_dry_env(**variables), capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    if LINE == "0.16.1":
        assert ran.returncode == 0 and "+ " in ran.stderr, ran
    else:
        assert ran.returncode == 2 and ran.stderr.startswith(error) and len(ran.stderr.splitlines()) == 1, ran


def test_recipe_without_trl_stops_with_one_line(tmp_path):
    """A recipe whose ``accelerate`` runs a Python without trl stops with one line naming that Python."""
    python = tmp_path / "python-without-trl"
    python.write_text("#!/usr/bin/env bash\nexit 1\n")  # as a Python whose `import trl` fails
    fake = tmp_path / "accelerate"
    fake.write_text(f"#!{python}\n")
    for path in (python, fake):
        path.chmod(0o755)
    ran = subprocess.run(["bash", RECIPES / "grpo_frozen_models.sh"], env=_dry_env(ACCELERATE=str(fake)),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert ran.returncode == 2 and len(ran.stderr.splitlines()) == 1, ran
    assert ran.stderr.startswith(f"error: {python} (the Python of {fake}) cannot import trl"), ran.stderr


@pytest.mark.parametrize("lora, backend", [("", "fsdp2"), ("1", "zero3")])
def test_vllm_server_recipe_parses(lora, backend):
    """Parsing only (no vLLM here): the server command and the training command each parse, with their flags."""
    sync = {"VLLM_SYNC_MB": "64"} if LINE == "0.16.1" else {}
    serve, train = _dry_run("grpo_vllm_server", _dry_env(NUM_GPUS="4", LORA=lora, BACKEND=backend, **sync))
    assert serve[0] == "CUDA_VISIBLE_DEVICES=0" and serve[-1] == "&"  # GPU 0, in the background
    assert serve[1:3] == ["trl", "vllm-serve"]
    _, (serve_args,) = parse_command(serve)
    assert serve_args.model == "Qwen/Qwen2.5-0.5B-Instruct"

    launch, (script_args, args, model_args, *_) = parse_command(train)
    assert launch.module and launch.training_script == "trl.scripts.grpo" and launch.num_processes == 3
    assert launch.config_file.endswith("fsdp2.yaml" if backend == "fsdp2" else "zero3.yaml")
    assert args.use_vllm and args.vllm_server_port == 8000
    if LINE == "0.16.1":
        assert args.vllm_sync_bucket_size_mb == 64
    else:
        assert args.vllm_mode == "server"  # TRL 1.16.0's default is colocate
    assert model_args.use_peft == bool(lora)
    assert args.per_device_train_batch_size * 3 % args.num_generations == 0  # GRPO refuses any other batch


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("[!_]*.sh")))
def test_every_recipe_has_a_cpu_test(recipe):
    """A new recipe needs a case here and in GPU_COMMANDS, and says which lines it serves; in a dry run every
    recipe prints the commands it would run."""
    tested = {c[1] for c in CASES} | {"grpo_vllm_server", "multi_machine"}  # multi_machine: test_multi_machine.py
    assert recipe in tested, f"examples/recipes/{recipe}.sh has no CPU test"
    assert recipe in {r for r, _ in GPU_COMMANDS}, f"examples/recipes/{recipe}.sh: no GPU command parsed"
    header = (RECIPES / f"{recipe}.sh").read_text().split("\nsource ", 1)[0]
    assert "1.16.0" in header and "0.16.1" in header, f"examples/recipes/{recipe}.sh: which lines it serves?"
    commands = _dry_run(recipe, _dry_env(NUM_GPUS="4"))
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
    ran = subprocess.run(["bash", RECIPES / f"{recipe}.sh"], env=_dry_env(NUM_GPUS=num_gpus), capture_output=True,
                         text=True, timeout=60)  # fmt: skip
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
    ran = subprocess.run(["bash", RECIPES / "grpo_frozen_models.sh"], env=_dry_env(NUM_GPUS="2", **variables),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
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
