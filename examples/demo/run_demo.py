#!/usr/bin/env python
"""Demo: GRPO with a reference model through the real ``trl grpo`` CLI, 2 CPU ranks, a few minutes at most.

    python examples/demo/run_demo.py                    # FSDP2 (default)
    python examples/demo/run_demo.py --backend zero3    # or fsdp1, ddp

What it does, offline and without a GPU:
1. builds the tiny fixtures (policy, reward model, tokenizer, prompt dataset) into a work directory;
2. writes the accelerate config for the backend (``examples/accelerate_configs/`` plus the CPU specifics of
   ``tests/harness``) as the default config of a private ``HF_HOME``, so that the plain CLI picks it up;
3. runs ``trl grpo ...`` (the ``trl`` console script of this Python; ``python -m trl.cli`` without one) with
   ``beta > 0``, hence a reference model, for a few optimizer steps;
4. prints, from inside the CLI's processes, where the reference and reward models live and how much of
   each every rank holds, then a summary.  Exits non-zero if anything failed.

On CPU, FSDP needs the test harness's shim: accelerate 1.6 turns a process group without GPUs into MULTI_CPU and
drops the FSDP plugin, so every rank would train (and hold) a full replica.  ``tests/harness/cpu_shims.py``,
loaded at start-up by ``tests/harness/_site/sitecustomize.py`` (on ``PYTHONPATH``) when
``TRL_HARNESS_CPU_FSDP=1``, keeps it (ZeRO-3 on CPU: ``DS_ACCELERATOR=cpu`` and ``TRL_HARNESS_DS_NO_SHM=1``).
The demo prints the equivalent command with that environment; its files stay in the work directory
(default ``build/demo``).  On GPUs no shim is involved: ``trl grpo`` with the config of
``examples/accelerate_configs/`` as it is.
"""

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from harness.fixtures import build_fixtures  # noqa: E402
from harness.launcher import BACKENDS as LAUNCH_BACKENDS  # noqa: E402
from harness.launcher import derive_config, harness_env, run_command  # noqa: E402


HOOK = Path(__file__).resolve().parent / "demo_hook.py"
BACKENDS = ("fsdp2", "zero3", "fsdp1", "ddp")
DEFAULT_WORKDIR = REPO / "build" / "demo"
# Set by harness_env whatever the caller's environment holds: always printed, so that the command does not depend
# on what `make` exported. TRL_HARNESS_ERROR_DIR (traceback capture) is left out: it changes nothing in the run.
ALWAYS_SHOWN = ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "ACCELERATE_USE_CPU", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS")  # fmt: skip
NOT_SHOWN = ("TRL_HARNESS_ERROR_DIR",)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, default="fsdp2", help="default: %(default)s")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default: %(default)s)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=DEFAULT_WORKDIR,
        help="fixtures, config, reports and logs go here, and stay for the printed command (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=int, default=600, help="seconds before the run is killed")
    parser.add_argument("--verbose", action="store_true", help="echo the whole training output")
    return parser.parse_args(argv)


def _echo(verbose):
    def echo(line):
        return verbose or line.startswith("[demo]") or line.startswith("{'loss'") or "Error" in line

    return echo


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024


def summarize(reports, args, result, elapsed):
    print("\n" + "=" * 78)
    print(f"GRPO demo summary: backend {args.backend}, 2 CPU ranks, {args.steps} steps, beta=0.04")
    print("=" * 78)
    problems = []
    if not reports:
        problems.append("no rank reported (the trainer was never built)")
    for r in reports:
        print(f"rank {r['rank']} ({r.get('backend', '?')}, accelerator device {r.get('accelerator_device', '?')}):")
        for name, f in r.get("models", {}).items():
            share = f["local_numel"] / f["full_numel"] if f["full_numel"] else float("nan")
            print(
                f"  {name:<16} on {', '.join(f['devices']):<6} holds {f['local_numel']:>7,} / {f['full_numel']:,}"
                f" params ({share:4.0%}), {_fmt_bytes(f['local_bytes'])}  [{'/'.join(f['wrappers'])}]"
            )
        if r.get("stage") != "trained":
            problems.append(f"rank {r['rank']} did not finish training (stage {r.get('stage')!r})")
        elif r.get("global_step") != args.steps:
            problems.append(f"rank {r['rank']} did {r.get('global_step')} steps, expected {args.steps}")
        else:
            print(f"  trained {r['global_step']} steps, losses {[round(x, 4) for x in r.get('losses', [])]}")
    for name in sorted({n for r in reports for n in r.get("models", {})}):
        shares = [
            r["models"][name]["local_numel"] / r["models"][name]["full_numel"]
            for r in reports
            if name in r.get("models", {})
        ]
        if shares and max(shares) >= 0.999:
            verdict = "a full replica on every rank"
        elif shares:
            verdict = f"sharded: each rank holds {min(shares):.0%}-{max(shares):.0%} of it"
        print(f"=> {name}: {verdict}")
    if not result.ok:
        problems.append(result.failure_text(tail_lines=25))
    print("-" * 78)
    if problems:
        print("DEMO FAILED:")
        for p in problems:
            print(p)
    else:
        print(f"DEMO PASSED in {elapsed:.0f}s (the training run itself: {result.duration:.0f}s)")
    return not problems


def shim_note(backend):
    """What makes ``backend`` run on CPU ranks here, and that GPUs need none of it (lines for the demo's output)."""
    spec = LAUNCH_BACKENDS[backend]
    gpus = f"On GPUs no shim is involved: `trl grpo` with examples/accelerate_configs/{spec.config} as it is."
    if spec.family == "fsdp":
        return [
            "On CPU this demo enables FSDP through the test harness's shim: accelerate 1.6 drops FSDP on CPU ranks",
            "(every rank would train a full replica); tests/harness/cpu_shims.py keeps it, loaded at start-up by",
            "tests/harness/_site/sitecustomize.py through PYTHONPATH and TRL_HARNESS_CPU_FSDP=1.",
            gpus,
        ]
    if spec.family == "deepspeed":
        return [
            "On CPU this demo runs DeepSpeed with DS_ACCELERATOR=cpu and the test harness's shim",
            "(tests/harness/cpu_shims.py, loaded through PYTHONPATH and TRL_HARNESS_DS_NO_SHM=1): no JIT-compiled",
            "shared-memory op, asynchronous gloo collectives completed before they return.",
            gpus,
        ]
    return ["DDP needs no shim on CPU; PYTHONPATH loads the demo's reporting hook only.", gpus]


def equivalent_command(env, argv, base_env=None, indent=""):
    """The shell command that reproduces the launch: the environment the demo sets, then ``argv``, quoted; one
    variable per line (``\\`` continuations), each line after the first indented by ``indent``."""
    base_env = os.environ if base_env is None else base_env
    shown = [k for k in ALWAYS_SHOWN if k in env]
    shown += [k for k in env if k not in shown and k not in NOT_SHOWN and base_env.get(k) != env[k]]
    lines = [f"{k}={shlex.quote(str(env[k]))}" for k in shown]
    lines.append(" ".join(shlex.quote(str(a)) for a in argv))
    return f" \\\n{indent}".join(lines)


def trl_executable():
    """The ``trl`` console script of this Python (what ``trl grpo`` runs), else ``python -m trl.cli``."""
    script = Path(sys.executable).with_name("trl")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "trl.cli"]


def prepare(args):
    """Fixtures, config and environment of the launch; returns (work dir, launch argv, env, equivalent command)."""
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)

    print(f"[1/3] building tiny fixtures in {work / 'fixtures'}", flush=True)
    manifest = build_fixtures(work / "fixtures")

    print(f"[2/3] accelerate config for {args.backend} on 2 CPU ranks", flush=True)
    hf_home = work / "hf_home"
    config = derive_config(args.backend, hf_home / "accelerate", device="cpu", num_processes=2)
    config.replace(hf_home / "accelerate" / "default_config.yaml")  # what `accelerate config` would write
    reports_dir = work / "reports"
    reports_dir.mkdir(exist_ok=True)
    for stale in reports_dir.glob("rank*.json"):
        stale.unlink()

    cli_args = [
        "grpo",
        "--model_name_or_path", manifest["policy"],
        "--reward_model_name_or_path", manifest["reward"],
        "--dataset_name", manifest["prompt_only"],
        "--output_dir", str(work / "output"),
        "--max_steps", str(args.steps),
        "--beta", "0.04",
        "--per_device_train_batch_size", "2",
        "--num_generations", "2",
        "--max_prompt_length", "32",
        "--max_completion_length", "8",
        "--learning_rate", "1e-3",
        "--logging_steps", "1",
        "--save_strategy", "no",
        "--report_to", "none",
        "--disable_tqdm", "true",
        "--seed", "42",
    ]  # fmt: skip
    env = harness_env(
        args.backend,
        device="cpu",
        error_dir=work / "errors",
        preload=[HOOK],
        extra={
            "HF_HOME": hf_home,
            "TRL_DEMO_REPORT_DIR": reports_dir,
            "TRL_DEMO_FULL_NUMEL": json.dumps(
                {"reference model": manifest["policy_numel"], "reward model": manifest["reward_numel"]}
            ),
        },
    )
    argv = [*trl_executable(), *cli_args]
    return work, argv, env, equivalent_command(env, argv, indent=" " * 8)


def main(argv=None):
    args = parse_args(argv)
    start = time.monotonic()
    work, command, env, equivalent = prepare(args)
    print(f"[3/3] trl grpo ... (accelerate default config: {args.backend})", flush=True)
    for line in shim_note(args.backend):
        print(f"      {line}", flush=True)
    print(f"      Equivalent command (this environment, files kept in {work}):", flush=True)
    print("        " + equivalent, flush=True)
    result = run_command(
        command,
        env=env,
        workdir=work / "launch",
        backend=args.backend,
        timeout=args.timeout,
        cwd=work,
        echo=_echo(args.verbose),
    )
    reports = [json.loads(p.read_text()) for p in sorted((work / "reports").glob("rank*.json"))]
    reports.sort(key=lambda r: r["rank"])
    ok = summarize(reports, args, result, time.monotonic() - start)
    print(f"(work directory kept: {work}, for the equivalent command above; training log: {result.log_path})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
