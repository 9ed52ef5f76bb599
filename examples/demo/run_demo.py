#!/usr/bin/env python
"""Demo: GRPO with a reference model through the real ``trl grpo`` CLI, 2 CPU ranks, a few minutes at most.

    python examples/demo/run_demo.py                    # FSDP2 (default)
    python examples/demo/run_demo.py --backend zero3    # or fsdp1, ddp

What it does, offline and without a GPU:
1. builds the tiny fixtures (policy, reward model, tokenizer, prompt dataset) into a work directory;
2. writes the accelerate config for the backend (``examples/accelerate_configs/`` plus the CPU specifics of
   ``tests/harness``) as the default config of a private ``HF_HOME``, so that the plain CLI picks it up;
3. runs ``python -m trl.cli grpo ...`` (what the ``trl`` console script runs) with ``beta > 0``, hence a
   reference model, for a few optimizer steps;
4. prints, from inside the CLI's processes, where the reference and reward models live and how much of
   each every rank holds, then a summary.  Exits non-zero if anything failed.
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from harness.fixtures import build_fixtures  # noqa: E402
from harness.launcher import derive_config, harness_env, run_command  # noqa: E402


HOOK = Path(__file__).resolve().parent / "demo_hook.py"
BACKENDS = ("fsdp2", "zero3", "fsdp1", "ddp")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, default="fsdp2", help="default: %(default)s")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default: %(default)s)")
    parser.add_argument("--workdir", help="keep everything here (default: a temporary directory)")
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
        print(f"DEMO PASSED in {elapsed:.0f}s")
    return not problems


def main(argv=None):
    args = parse_args(argv)
    start = time.monotonic()
    tmp = None if args.workdir else tempfile.mkdtemp(prefix="trl-demo-")
    work = Path(args.workdir or tmp).resolve()
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
    print(f"[3/3] trl {' '.join(cli_args[:1])} ... (accelerate default config: {args.backend})", flush=True)
    print("      equivalent command: HF_HOME=" + str(hf_home) + " trl " + " ".join(cli_args), flush=True)
    result = run_command(
        [sys.executable, "-m", "trl.cli", *cli_args],
        env=env,
        workdir=work / "launch",
        backend=args.backend,
        timeout=args.timeout,
        cwd=work,
        echo=_echo(args.verbose),
    )
    reports = [json.loads(p.read_text()) for p in sorted(reports_dir.glob("rank*.json"))]
    reports.sort(key=lambda r: r["rank"])
    ok = summarize(reports, args, result, time.monotonic() - start)
    if tmp is not None and ok:
        shutil.rmtree(tmp, ignore_errors=True)
    elif tmp is not None:
        print(f"(work directory kept for inspection: {work}; training log: {result.log_path})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
