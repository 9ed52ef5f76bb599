#!/usr/bin/env python
"""Demo: GRPO under FSDP2 on 2 CPU processes, generating with a real vLLM, the fork's sync check on (1.16.0 line).

    make demo-vllm                    # builds lines/1.16.0/.venv-vllm (vLLM's CPU build) once, then runs this
    PYTHONPATH=lines/1.16.0/trl-src lines/1.16.0/.venv-vllm/bin/python examples/demo/run_vllm_demo.py

It runs the plain ``trl grpo`` CLI of the fork's 1.16.0 line with ``--use_vllm --vllm_mode colocate`` (one vLLM engine
in each training process, vLLM's CPU build) and ``--vllm_sync_check_tolerance``: after every weight sync, vLLM scores
a fixed probe text and the policy does too; the gap between the two is logged (``vllm/sync_logprob_gap``) and the run
stops on every process when it exceeds the tolerance. The demo prints, per process and sync, that gap next to how far
vLLM's scores have moved from the checkpoint's (a start-up hook, ``vllm_demo_hook.py``, asks each process's engine
once more). A sync that landed leaves vLLM next to the policy and, once the policy trained, away from the checkpoint.

What it does, offline and without a GPU:
1. builds a tiny policy, reward model and prompt dataset (``tools/tiny_model.py``: head_dim 32, which vLLM's CPU
   attention needs);
2. writes the accelerate config for FSDP2 on 2 CPU processes as the default config of a private ``HF_HOME``;
3. runs ``trl grpo ...`` (this Python's ``trl``: the fork's 1.16.0 line) for a few steps at a learning rate that
   moves the tiny policy visibly each step;
4. runs it once more with the weight sync replaced by nothing (the hook, ``TRL_DEMO_STALE_SYNC=1``): what a sync that
   silently moves nothing does; the check must stop that run at the first sync after the policy moved, on both
   processes;
5. prints a summary; exits non-zero if the first run failed, a check is missing, vLLM did not follow the policy, or
   the second run was not stopped by the check on every process. About 1 to 1.5 minutes on 2 cores.

On CPU the launch needs the test harness's start-up shims (accelerate >= 1.10 starts no distributed run without GPUs;
FSDP is kept on CPU processes), loaded through ``PYTHONPATH``; on GPUs none of them is involved. Pristine TRL 1.16.0
has no sync check, and its colocate sync stops on vLLM's CPU platform (patch 0022 is what makes it land there).

Options run the same demo on other launches (``lines/1.16.0/tests/test_vllm_demo.py`` runs them): ``--backend
zero3|ddp``, ``--num-processes 4``, ``--lora`` (a LoRA adapter on ``q_proj`` and ``v_proj``, merged into what vLLM
receives), ``--synced-only`` (the first run only). Not FSDP1: ``trl grpo`` saves the model at the end, and FSDP1's full
state dict stops a CPU process with a segmentation fault (with or without vLLM; not seen on GPUs here).
"""

import argparse
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))

from harness.accelerate110 import SHIM_FILE as ACCELERATE110_SHIM  # noqa: E402
from harness.launcher import derive_config, harness_env, run_command  # noqa: E402


HOOK = Path(__file__).resolve().parent / "vllm_demo_hook.py"
DEMO = Path(__file__).resolve().parent / "run_demo.py"
DEFAULT_WORKDIR = REPO / "lines" / "1.16.0" / "build" / "demo-vllm"
# After a correct sync the tiny model's gap was 5e-4 to 8e-4 here (vLLM's CPU engine against the float32 policy); one
# step at lr 1e-2 moved vLLM's scores 0.09 to 0.13 from the checkpoint's
TOLERANCE = 0.02
BACKENDS = ("fsdp2", "zero3", "ddp")  # the harness's accelerate configs (tests/harness/launcher.py); not FSDP1 (above)
# LoRA: the adapter's B starts at zero, so a step at the full run's rate moves the merged weights far less
LORA_ARGS = ["--use_peft", "true", "--lora_r", "8", "--lora_alpha", "32", "--lora_target_modules", "q_proj", "v_proj"]
LORA_LEARNING_RATE = "5e-2"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="run_vllm_demo.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=3, help="optimizer steps, a sync and a check each (default: %(default)s)"
    )
    parser.add_argument(
        "--tolerance", type=float, default=TOLERANCE, help="--vllm_sync_check_tolerance (default: %(default)s)"
    )
    parser.add_argument(
        "--workdir", type=Path, default=DEFAULT_WORKDIR, help="fixtures, logs, reports (default: %(default)s)"
    )
    parser.add_argument(
        "--timeout", type=int, default=900, help="seconds before the run is killed (default: %(default)s)"
    )
    parser.add_argument(
        "--backend", choices=BACKENDS, default=BACKENDS[0], help="how the policy is sharded (default: %(default)s)"
    )
    parser.add_argument(
        "--num-processes", type=int, choices=(2, 4), default=2, help="training processes (default: %(default)s)"
    )
    parser.add_argument(
        "--lora", action="store_true", help=f"train a LoRA adapter ({' '.join(LORA_ARGS)}) instead of the policy"
    )
    parser.add_argument(
        "--synced-only", action="store_true", help="skip the second run (the sync replaced by nothing)"
    )
    parser.add_argument("--verbose", action="store_true", help="echo the whole training output")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps: at least 2 (the policy moves at the first step; the second step's sync shows it)")
    if not args.tolerance > 0:
        parser.error("--tolerance: above 0")
    return args


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_demo = _load(DEMO, "run_demo")  # the 1.16.0 demo's helpers: which trl this Python imports, the launch's command


def check_environment():
    """The fork's 1.16.0 ``trl`` and a real vLLM in this Python: ``(trl version, trl's folder)``, else a one-line
    ``SystemExit`` that says what to run."""
    how = "run `make demo-vllm` (it builds lines/1.16.0/.venv-vllm, vLLM's CPU build, once)"
    version, path, line = run_demo.installed_trl()
    if version is None:
        raise SystemExit(f"run_vllm_demo.py: this Python ({sys.executable}) cannot import trl; {how}")
    if line != "1.16.0" or importlib.util.find_spec("trl._fork_info") is None:
        raise SystemExit(f"run_vllm_demo.py: trl {version} ({path}) is not the fork's 1.16.0 line; {how}")
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(f"run_vllm_demo.py: no vLLM in this Python ({sys.executable}); {how}")
    return version, Path(path).resolve().parents[1]


def grpo_cli_args(fixtures, output_dir, steps, tolerance, lora=False):
    return [
        "grpo",
        "--model_name_or_path", fixtures["policy"],
        "--reward_model_name_or_path", fixtures["reward"],
        "--dataset_name", fixtures["prompts"],
        "--output_dir", str(output_dir),
        "--max_steps", str(steps),
        "--per_device_train_batch_size", "2",
        "--num_generations", "2",
        "--max_completion_length", "8",
        "--learning_rate", LORA_LEARNING_RATE if lora else "1e-2",
        "--bf16", "false",
        "--logging_steps", "1",
        "--save_strategy", "no",
        "--report_to", "none",
        "--disable_tqdm", "true",
        "--seed", "42",
        "--use_vllm", "true",
        "--vllm_mode", "colocate",
        "--vllm_gpu_memory_utilization", "0.5",
        "--vllm_max_model_length", "128",
        "--vllm_sync_check_tolerance", str(tolerance),
        *(LORA_ARGS if lora else []),
    ]  # fmt: skip


RUNS = ("synced", "stale")  # the fork's sync; the same run with the sync replaced by nothing


def runs(args):
    return RUNS[:1] if args.synced_only else RUNS


def prepare(args, trl_root):
    """Fixtures, config and the launches: (work dir, fixtures, {run: (argv, env)})."""
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"[1/4] building a tiny policy, reward model and prompts in {work / 'fixtures'} (tools/tiny_model.py)")
    fixtures = _load(REPO / "tools" / "tiny_model.py", "tiny_model").build(work / "fixtures")
    print(f"[2/4] accelerate config for {args.backend} on {args.num_processes} CPU processes", flush=True)
    hf_home = work / "hf_home"
    config = derive_config(args.backend, hf_home / "accelerate", device="cpu", num_processes=args.num_processes)
    config.replace(hf_home / "accelerate" / "default_config.yaml")  # what `accelerate config` would write
    launches = {}
    for run in runs(args):
        reports, errors = work / "reports" / run, work / "errors" / run
        for directory, pattern in ((reports, "rank*.json"), (errors, "*.txt")):
            directory.mkdir(parents=True, exist_ok=True)
            for stale in directory.glob(pattern):
                stale.unlink()
        extra = {
            "HF_HOME": hf_home,
            "TRL_DEMO_REPORT_DIR": reports,
            "TRL_DEMO_CHECKPOINT": fixtures["policy"],
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        }
        if run == "stale":
            extra["TRL_DEMO_STALE_SYNC"] = "1"
        env = harness_env(
            args.backend, device="cpu", error_dir=errors, preload=[ACCELERATE110_SHIM, HOOK], extra=extra
        )
        paths = env["PYTHONPATH"].split(os.pathsep)
        if str(trl_root) not in paths:  # the fork's trl, after the shims
            env["PYTHONPATH"] = os.pathsep.join([*paths, str(trl_root)])
        cli_args = grpo_cli_args(fixtures, work / "output" / run, args.steps, args.tolerance, args.lora)
        launches[run] = ([*run_demo.trl_executable(), *cli_args], env)
    return work, fixtures, launches


def _share(report, fixtures):
    policy = report.get("policy") or {}
    if not policy:
        return ""
    full = fixtures["policy_parameters"]
    return (
        f", holds {policy['local_numel']:,} of the policy's {full:,} parameters ({policy['local_numel'] / full:.0%},"
        f" {'/'.join(policy.get('wrappers', []))})"
    )


def _range(values, fmt):
    low, high = format(min(values), fmt), format(max(values), fmt)
    return low if low == high else f"{low}-{high}"


def summarize_synced(reports, result, args, fixtures):
    """The first run: the checks of every process; returns its problems."""
    problems = []
    if len(reports) != args.num_processes:
        problems.append(f"{len(reports)} process(es) reported, expected {args.num_processes}")
    for r in reports:
        print(f"rank {r['rank']} ({r.get('backend', '?')}, vLLM {r.get('vllm_mode', '?')}{_share(r, fixtures)}):")
        print(f"  {'step':>4}  {'vLLM vs policy':>14}  {'vLLM vs checkpoint':>18}")
        for c in r["checks"]:
            if "error" in c:
                print(f"  {c['step']!s:>4}  {c['error']}")
                continue
            moved = f"{c['from_checkpoint']:.2e}" if "from_checkpoint" in c else "-"
            print(f"  {c['step']!s:>4}  {c['gap']:>14.2e}  {moved:>18}")
        if r.get("stage") != "trained":
            problems.append(f"rank {r['rank']} did not finish training (stage {r.get('stage')!r})")
            continue
        if r.get("global_step") != args.steps:
            problems.append(f"rank {r['rank']} did {r.get('global_step')} steps, expected {args.steps}")
        checks = [c for c in r["checks"] if "gap" in c]
        problems += [f"rank {r['rank']}: vLLM's scores not compared with the checkpoint's at step {c['step']}: "
                     f"{c['from_checkpoint_error']}" for c in checks if "from_checkpoint_error" in c]  # fmt: skip
        if len(checks) < args.steps:
            problems.append(f"rank {r['rank']}: {len(checks)} sync check(s) for {args.steps} steps")
        if len(r.get("logged_gaps", [])) < args.steps:
            problems.append(f"rank {r['rank']}: vllm/sync_logprob_gap logged {len(r.get('logged_gaps', []))} time(s)")
        if any(not c["gap"] <= args.tolerance for c in checks):
            problems.append(f"rank {r['rank']}: a gap above the tolerance {args.tolerance:g} did not stop the run")
        last = checks[-1] if checks else {}
        if args.steps > 1 and not last.get("from_checkpoint", 0) > args.tolerance:
            problems.append(
                f"rank {r['rank']}: vLLM's last scores are within the tolerance of the checkpoint's "
                f"({last.get('from_checkpoint')}): the policy did not move enough for the check to tell a stale sync"
            )
    if not result.ok:
        problems.append(result.failure_text(tail_lines=25))
    if not problems:
        checks = [[c for c in r["checks"] if "gap" in c] for r in reports]
        gaps = [c["gap"] for rank in checks for c in rank]
        moved = [rank[-1]["from_checkpoint"] for rank in checks]
        print(
            f"=> after every sync vLLM scored the probe as the policy does (gap at most {max(gaps):.1e}, tolerance "
            f"{args.tolerance:g}),\n   and at the last step {_range(moved, '.2f')} away from the checkpoint: vLLM "
            "generates with the trained weights."
        )
    return problems


def summarize_stale(reports, result, args):
    """The second run: every process must have stopped at the first check after the policy moved (step 1)."""
    problems = []
    if len(reports) != args.num_processes:
        problems.append(f"{len(reports)} process(es) reported, expected {args.num_processes}")
    stops = []
    for r in reports:
        failed = [c for c in r["checks"] if "error" in c]
        passed = [c for c in r["checks"] if "gap" in c]
        if failed:
            stops.append(failed[0])
            found = re.search(r"differ from the policy's by (\S+) on average", failed[0]["error"])
            why = f"gap {found.group(1)}, above the tolerance {args.tolerance:g}" if found else failed[0]["error"]
            steps = ", ".join(str(c["step"]) for c in passed) or "none"
            print(f"rank {r['rank']}: checks passed at step(s) {steps}, stopped at step {failed[0]['step']} ({why})")
            if [c["step"] for c in passed] != [0] or failed[0]["step"] != 1:
                problems.append(
                    f"rank {r['rank']}: checks passed at step(s) {steps}, the first failed at step "
                    f"{failed[0]['step']}: expected a pass at step 0 (vLLM and the policy both at the checkpoint) and "
                    "a stop at step 1"
                )
        else:
            problems.append(f"rank {r['rank']}: no check stopped the run (stage {r.get('stage')!r})")
        if r.get("stage") == "trained":
            problems.append(f"rank {r['rank']} trained to the end on a vLLM that kept the checkpoint")
    if result.ok:
        problems.append("the run with the sync replaced by nothing ended successfully")
    if any("vLLM does not generate with the policy's weights" not in c["error"] for c in stops):
        problems.append("a process stopped, but not at the sync check:\n" + result.failure_text(tail_lines=25))
    if not problems:
        print(
            f"=> both processes stopped at step {_range([c['step'] for c in stops], 'd')}, the first sync after the "
            "policy moved, with the check's error:\n   no step trained on completions from stale weights."
        )
    return problems


def main(argv=None):
    args = parse_args(argv)
    start = time.monotonic()
    version, trl_root = check_environment()
    work, fixtures, launches = prepare(args, trl_root)
    argv, env = launches["synced"]
    print(
        f"[3/4] trl grpo ... with vLLM in colocate mode (trl {version} from {trl_root}); engines start in about 30 s"
    )
    print("      On CPU the launch loads the test harness's shims (accelerate >= 1.10 starts no distributed run")
    print("      without GPUs; FSDP is kept on CPU processes) through PYTHONPATH; on GPUs none is involved.")
    print(f"      Equivalent command (files kept in {work}):")
    print("        " + run_demo.equivalent_command(env, argv, indent=" " * 8), flush=True)
    results, reports = {}, {}
    for run in runs(args):
        if run == "stale":
            print(
                "[4/4] the same run with the weight sync replaced by nothing (TRL_DEMO_STALE_SYNC=1): what a sync",
                flush=True,
            )
            print("      that silently moves nothing does; the check must stop it on every process", flush=True)
        argv, env = launches[run]
        results[run] = run_command(
            argv,
            env=env,
            workdir=work / "launch" / run,
            backend=args.backend,
            timeout=args.timeout,
            cwd=work,
            echo=lambda line: args.verbose or line.startswith("[demo]"),
            fresh=[work / "reports" / run / f"rank{rank}.json" for rank in range(args.num_processes)],
        )
        found = [json.loads(p.read_text()) for p in (work / "reports" / run).glob("rank*.json")]
        reports[run] = sorted(found, key=lambda r: r["rank"])
    print("\n" + "=" * 78)
    policy = "a LoRA adapter" if args.lora else "the policy"
    print(
        f"GRPO ({policy}) with a real vLLM (colocate), {args.backend}, {args.num_processes} CPU processes, "
        f"{args.steps} steps, tolerance {args.tolerance:g}"
    )
    print("=" * 78)
    print("the fork's weight sync:")
    problems = summarize_synced(reports["synced"], results["synced"], args, fixtures)
    if "stale" in results:
        print("-" * 78)
        print("the weight sync replaced by nothing:")
        problems += summarize_stale(reports["stale"], results["stale"], args)
    print("-" * 78)
    if problems:
        print("DEMO FAILED:")
        for problem in problems:
            print(problem)
    else:
        durations = ", ".join(f"{results[run].duration:.0f}s" for run in results)
        print(f"DEMO PASSED in {time.monotonic() - start:.0f}s (training runs: {durations})")
    logs = ", ".join(str(results[run].log_path) for run in results)
    print(f"(work directory kept: {work}; training logs: {logs})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
