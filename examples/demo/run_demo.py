#!/usr/bin/env python
"""Demo: GRPO with a reference model through the real ``trl grpo`` CLI, 2 CPU ranks, a few minutes at most.

    lines/1.16.0/.venv/bin/python examples/demo/run_demo.py                  # TRL 1.16.0: pristine vs the fork
    lines/0.16.1/.venv/bin/python examples/demo/run_demo.py                  # TRL 0.16.1+fork, FSDP2 (default)
    lines/0.16.1/.venv/bin/python examples/demo/run_demo.py --backend zero3  # or fsdp1, ddp (0.16.1 line)

``--line`` (``make demo`` passes ``--line $(LINE)``) defaults to the line of the ``trl`` this Python imports; the
demo runs that installed ``trl`` (the fork), so a line whose ``trl`` is not importable here is refused.

The 1.16.0 line (FSDP2): the same ``trl grpo`` launch, with a reward model (``--reward_model_name_or_path``) and
``beta > 0``, runs twice: first on pristine TRL 1.16.0 (the unpatched tree ``tools/prove.py`` materializes in
``lines/1.16.0/build/trees/base``, first on ``PYTHONPATH``; the ranks' reports must show they imported it), then on
the fork installed in this Python.  The summary compares what each rank holds of the reference and reward models:
pristine 1.16.0 keeps the reward model a full replica on every rank under FSDP2, the fork (patches 0004-0005) shards
it.  It exits non-zero if a run failed, a rank imported the wrong ``trl``, or the fork did not shard both models.
On CPU, accelerate >= 1.10 also needs ``tests/harness/accelerate110.py`` (preloaded): it answers ``MULTI_CPU``
where accelerate would not start a distributed run on a machine without GPUs.

What it does, offline and without a GPU (the 0.16.1 line; 1.16.0 does the same, twice):
1. builds the tiny fixtures (policy, reward model, tokenizer, prompt dataset) into a work directory;
2. writes the accelerate config for the backend (``examples/accelerate_configs/`` plus the CPU specifics of
   ``tests/harness``) as the default config of a private ``HF_HOME``, so that the plain CLI picks it up;
3. runs ``trl grpo ...`` (the ``trl`` console script of this Python; its module without one) with
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
import importlib.util
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from harness.accelerate110 import SHIM_FILE as ACCELERATE110_SHIM  # noqa: E402
from harness.fixtures import build_fixtures  # noqa: E402
from harness.launcher import BACKENDS as LAUNCH_BACKENDS  # noqa: E402
from harness.launcher import derive_config, harness_env, run_command  # noqa: E402


HOOK = Path(__file__).resolve().parent / "demo_hook.py"
BACKENDS = ("fsdp2", "zero3", "fsdp1", "ddp")
LINES = ("1.16.0", "0.16.1")  # the fork's lines (lines/<version>/)
BACKENDS_1160 = ("fsdp2",)  # the pristine-vs-fork comparison of the 1.16.0 line
VARIANTS = ("pristine", "fork")  # the 1.16.0 line's two runs, in this order
BETA = "0.04"
DEFAULT_WORKDIR = REPO / "build" / "demo"
# per line: a line's fixtures are saved by its own transformers, its reports laid out by its own demo
DEFAULT_WORKDIRS = {"0.16.1": DEFAULT_WORKDIR, "1.16.0": REPO / "lines" / "1.16.0" / "build" / "demo"}
# Set by harness_env whatever the caller's environment holds: always printed, so that the command does not depend
# on what `make` exported. TRL_HARNESS_ERROR_DIR (traceback capture) is left out: it changes nothing in the run.
ALWAYS_SHOWN = ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "ACCELERATE_USE_CPU", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS")  # fmt: skip
NOT_SHOWN = ("TRL_HARNESS_ERROR_DIR",)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--line",
        choices=LINES,
        default=None,
        help="the fork's line to demonstrate (default: the line of the trl this Python imports, which must match)",
    )
    parser.add_argument(
        "--backend", choices=BACKENDS, default="fsdp2", help="default: %(default)s; the 1.16.0 line: fsdp2 only"
    )
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default: %(default)s)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="fixtures, config, reports and logs go here, and stay for the printed command (default: the line's, "
        + ", ".join(f"{line}: {path.relative_to(REPO)}" for line, path in DEFAULT_WORKDIRS.items())
        + ")",
    )
    parser.add_argument("--timeout", type=int, default=600, help="seconds before the run is killed")
    parser.add_argument("--verbose", action="store_true", help="echo the whole training output")
    args = parser.parse_args(argv)
    if args.workdir is None:  # the line's (the installed trl's line without --line; main() checks that it is one)
        args.workdir = DEFAULT_WORKDIRS.get(args.line or installed_trl()[2], DEFAULT_WORKDIR)
    return args


def _echo(verbose):
    def echo(line):
        return verbose or line.startswith("[demo]") or line.startswith("{'loss'") or "Error" in line

    return echo


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024


def _print_rank(r, steps, prefix="", losses=None):
    """Print what rank report ``r`` says (each frozen model's share, the steps and ``losses(r)``); return its
    problems."""
    print(
        f"{prefix}rank {r['rank']} ({r.get('backend', '?')}, accelerator device {r.get('accelerator_device', '?')}):"
    )
    for name, f in r.get("models", {}).items():
        share = f["local_numel"] / f["full_numel"] if f["full_numel"] else float("nan")
        print(
            f"{prefix}  {name:<16} on {', '.join(f['devices']):<6} holds {f['local_numel']:>7,} / {f['full_numel']:,}"
            f" params ({share:4.0%}), {_fmt_bytes(f['local_bytes'])}  [{'/'.join(f['wrappers'])}]"
        )
    if r.get("stage") != "trained":
        return [f"rank {r['rank']} did not finish training (stage {r.get('stage')!r})"]
    if r.get("global_step") != steps:
        return [f"rank {r['rank']} did {r.get('global_step')} steps, expected {steps}"]
    print(f"{prefix}  trained {r['global_step']} steps, losses {(losses or _losses)(r)}")
    return []


def _losses(r):
    return [round(x, 4) for x in r.get("losses", [])]


def _losses_4g(r):
    """Four significant digits: GRPO's first losses are tiny (1e-8 to 1e-5 here), and rounded to 4 decimals all 0."""
    return [float(f"{x:.4g}") for x in r.get("losses", [])]


def summarize(reports, args, result, elapsed):
    print("\n" + "=" * 78)
    print(f"GRPO demo summary: backend {args.backend}, 2 CPU ranks, {args.steps} steps, beta=0.04")
    print("=" * 78)
    problems = []
    if not reports:
        problems.append("no rank reported (the trainer was never built)")
    for r in reports:
        problems += _print_rank(r, args.steps)
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


def installed_trl():
    """``(version, path, line)`` of the ``trl`` this Python imports (``line``: None when it is no line of the fork;
    ``version``: None when there is no ``trl`` to import)."""
    try:
        import trl
    except ImportError:
        return None, None, None
    version = str(trl.__version__)
    line = next((name for name in LINES if re.match(rf"{re.escape(name)}(?![0-9])", version)), None)
    return version, trl.__file__, line


def resolve_line(requested=None):
    """The line to demonstrate: ``requested`` (``--line``), else the installed ``trl``'s; a one-line ``SystemExit``
    when this Python's ``trl`` is not that line's (the demo runs the installed ``trl``) or no line of the fork."""
    version, path, line = installed_trl()
    venv = f"lines/{requested or '<line>'}/.venv/bin/python"
    if version is None:
        raise SystemExit(f"run_demo.py: this Python ({sys.executable}) cannot import trl; run the demo with {venv}")
    if line is None:
        raise SystemExit(
            f"run_demo.py: trl {version} ({path}) is no line of the fork (the lines: {', '.join(LINES)}); "
            f"run the demo with {venv}"
        )
    if requested is not None and requested != line:
        raise SystemExit(
            f"run_demo.py: --line {requested} needs TRL {requested}, this Python imports trl {version}; "
            f"run {venv} examples/demo/run_demo.py --line {requested}"
        )
    return line


def grpo_cli_args(line, manifest, output_dir, steps):
    """``trl grpo ...`` for ``line`` (``manifest``: the tiny fixtures): a reward model and ``beta > 0`` (a reference
    model), a few optimizer steps.  TRL 1.x has no ``--max_prompt_length`` and defaults to ``bf16=True``, which CPU
    ranks do not run: ``--bf16 false``."""
    cli_args = [
        "grpo",
        "--model_name_or_path", manifest["policy"],
        "--reward_model_name_or_path", manifest["reward"],
        "--dataset_name", manifest["prompt_only"],
        "--output_dir", str(output_dir),
        "--max_steps", str(steps),
        "--beta", BETA,
        "--per_device_train_batch_size", "2",
        "--num_generations", "2",
        *(["--max_prompt_length", "32"] if line == "0.16.1" else ["--bf16", "false"]),
        "--max_completion_length", "8",
        "--learning_rate", "1e-3",
        "--logging_steps", "1",
        "--save_strategy", "no",
        "--report_to", "none",
        "--disable_tqdm", "true",
        "--seed", "42",
    ]  # fmt: skip
    return cli_args


def trl_executable():
    """The ``trl`` console script of this Python (what ``trl grpo`` runs), else its module: ``python -m trl.cli.main``
    (TRL 1.x, a package) or ``python -m trl.cli`` (0.16.1, a module)."""
    script = Path(sys.executable).with_name("trl")
    if script.is_file():
        return [str(script)]
    import importlib.util

    try:
        module = "trl.cli.main" if importlib.util.find_spec("trl.cli.main") is not None else "trl.cli"
    except ModuleNotFoundError:  # trl.cli is a module, not a package
        module = "trl.cli"
    return [sys.executable, "-m", module]


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

    cli_args = grpo_cli_args("0.16.1", manifest, work / "output", args.steps)
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


# ---------------------------------------------------------------------------------- the 1.16.0 line


def pristine_tree():
    """The pristine TRL 1.16.0 tree (no patch, no ``trl/_fork_info.py``) that ``tools/prove.py`` keeps in
    ``lines/1.16.0/build/trees/base``: reused when it matches the pinned sdist, else materialized from it."""
    tools = str(REPO / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import forkbuild
    import prove

    try:
        return Path(prove.tree_for("base", forkbuild.get_line("1.16.0"))).resolve()
    except forkbuild.BuildError as exc:
        raise SystemExit(f"run_demo.py: no pristine TRL 1.16.0 tree: {exc}") from exc


def shim_note_1160(backend):
    """What makes ``backend`` run on CPU ranks with accelerate >= 1.10 (lines for the demo's output)."""
    spec = LAUNCH_BACKENDS[backend]
    return [
        "On CPU this demo enables FSDP through the test harness's shims: accelerate >= 1.10 starts no distributed",
        "run without GPUs (tests/harness/accelerate110.py, preloaded through TRL_HARNESS_PRELOAD, answers",
        "MULTI_CPU) and drops FSDP on CPU ranks (tests/harness/cpu_shims.py keeps it: TRL_HARNESS_CPU_FSDP=1);",
        "both load at start-up from tests/harness/_site/sitecustomize.py, first on PYTHONPATH.",
        f"On GPUs no shim is involved: `trl grpo` with examples/accelerate_configs/{spec.config} as it is.",
    ]


def _clear(directory, pattern):
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(pattern):
        stale.unlink()


def prepare_1160(args):
    """Fixtures, config, the pristine tree and both launches: (work dir, pristine tree, {variant: (argv, env)})."""
    if args.backend not in BACKENDS_1160:
        raise SystemExit(
            f"run_demo.py: the 1.16.0 demo compares pristine TRL and the fork under {', '.join(BACKENDS_1160)}; "
            f"--backend {args.backend} is the 0.16.1 line's (--line 0.16.1)"
        )
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)

    print(f"[1/4] building tiny fixtures in {work / 'fixtures'}", flush=True)
    manifest = build_fixtures(work / "fixtures")

    print(f"[2/4] accelerate config for {args.backend} on 2 CPU ranks", flush=True)
    hf_home = work / "hf_home"
    config = derive_config(args.backend, hf_home / "accelerate", device="cpu", num_processes=2)
    config.replace(hf_home / "accelerate" / "default_config.yaml")  # what `accelerate config` would write
    tree = pristine_tree()

    launches = {}
    for variant in VARIANTS:
        reports_dir = work / "reports" / variant
        _clear(reports_dir, "rank*.json")
        _clear(work / "errors" / variant, "*.txt")  # the launch reads every traceback file there as its own
        env = harness_env(
            args.backend,
            device="cpu",
            error_dir=work / "errors" / variant,
            preload=[ACCELERATE110_SHIM, HOOK],
            extra={
                "HF_HOME": hf_home,
                "TRL_DEMO_REPORT_DIR": reports_dir,
                "TRL_DEMO_FULL_NUMEL": json.dumps(
                    {"reference model": manifest["policy_numel"], "reward model": manifest["reward_numel"]}
                ),
            },
        )
        if variant == "pristine":  # first on sys.path: before the editable install of the fork (a .pth entry)
            env["PYTHONPATH"] = os.pathsep.join([str(tree), env["PYTHONPATH"]])
        cli_args = grpo_cli_args("1.16.0", manifest, work / "output" / variant, args.steps)
        launches[variant] = ([*trl_executable(), *cli_args], env)
    return work, tree, launches


def _is_within(path, directory):
    try:
        Path(path).resolve().relative_to(Path(directory).resolve())
    except (TypeError, ValueError):
        return False
    return True


def import_problems(variant, reports, tree, fork_file):
    """Why the ranks of ``variant`` did not run the ``trl`` they should: pristine, the tree ``tree`` (no fork
    info); fork, ``fork_file`` (the ``trl`` this Python imports)."""
    problems = []
    for r in reports:
        info = r.get("trl") or {}
        where = f"trl {info.get('version')} from {info.get('file')}"
        if variant == "pristine" and (not _is_within(info.get("file"), tree) or info.get("fork_info")):
            problems.append(f"pristine run: rank {r['rank']} imported {where}, not the pristine tree {tree}")
        elif variant == "fork" and (
            _is_within(info.get("file"), tree)
            or not info.get("fork_info")
            or Path(info.get("file") or "/").resolve() != Path(fork_file).resolve()
        ):
            problems.append(f"fork run: rank {r['rank']} imported {where}, not the fork's {fork_file}")
    return problems


def _shares(reports, name):
    return [
        r["models"][name]["local_numel"] / r["models"][name]["full_numel"]
        for r in reports
        if name in r.get("models", {}) and r["models"][name]["full_numel"]
    ]


def holding(shares):
    """What ranks with these shares of a model hold, in words."""
    if min(shares) >= 0.999:
        return "a full replica on every rank (100%)"
    if max(shares) >= 0.999:
        return "a full replica on some ranks (" + ", ".join(f"{x:.0%}" for x in shares) + ")"
    low, high = f"{min(shares):.0%}", f"{max(shares):.0%}"
    return f"sharded, each rank holds {low}" if low == high else f"sharded, each rank holds {low}-{high}"


def summarize_1160(reports, results, args, tree, fork_version, fork_file, elapsed):
    """The 1.16.0 demo's summary: each run's ranks, then pristine vs fork per model; True when it passed."""
    label = {"pristine": "pristine 1.16.0", "fork": f"fork {fork_version}"}
    print("\n" + "=" * 78)
    print(
        f"GRPO demo summary: pristine TRL 1.16.0 vs the fork, backend {args.backend}, 2 CPU ranks, {args.steps} steps,"
        f" beta={BETA}"
    )
    print("=" * 78)
    problems = []
    for variant in VARIANTS:
        imported = sorted(
            {f"trl {(r.get('trl') or {}).get('version')} from {Path((r.get('trl') or {}).get('file') or '?').parent}"
             for r in reports[variant]}
        )  # fmt: skip
        print(f"{label[variant]} (the ranks imported {', '.join(imported) or 'nothing reported'}):")
        if not reports[variant]:
            problems.append(f"{variant} run: no rank reported (the trainer was never built)")
        for r in reports[variant]:
            problems += [f"{variant} run: {p}" for p in _print_rank(r, args.steps, "  ", _losses_4g)]
        problems += import_problems(variant, reports[variant], tree, fork_file)
        if not results[variant].ok:
            problems.append(f"{variant} run: " + results[variant].failure_text(tail_lines=25))
    print("-" * 78)
    rows, verdicts = [("", *(label[v] for v in VARIANTS))], {}
    for name in ("reference model", "reward model"):
        cells = []
        for variant in VARIANTS:
            held = [r for r in reports[variant] if name in r.get("models", {})]
            shares = _shares(held, name)
            verdicts[name, variant] = holding(shares) if shares else None
            cells.append(", ".join(f"rank {r['rank']} {x:.0%}" for r, x in zip(held, shares)) or "not reported")
        rows.append((name, *cells))
        if verdicts[name, "fork"] is None:
            problems.append(f"fork run: no rank reported its {name}")
        elif not verdicts[name, "fork"].startswith("sharded"):
            problems.append(f"the fork did not shard the {name}: {verdicts[name, 'fork']}")
    firsts = {v: reports[v][0] if reports[v] else {} for v in VARIANTS}
    rows.append(("steps", *(str(firsts[v].get("global_step", "-")) for v in VARIANTS)))
    rows.append(("losses (rank 0)", *(str(_losses_4g(firsts[v])) for v in VARIANTS)))
    rows.append(("training run", *(f"{results[v].duration:.0f}s" for v in VARIANTS)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print("what each rank holds of each model (share of its parameters), and the training:")
    for row in rows:
        print("  " + "   ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print("-" * 78)
    for name in ("reference model", "reward model"):
        pristine, fork = verdicts[name, "pristine"], verdicts[name, "fork"]
        print(f"{name}: pristine 1.16.0 {pristine or 'not reported'}; fork: {fork or 'not reported'}")
    if problems:
        print("DEMO FAILED:")
        for p in problems:
            print(p)
    else:
        print(
            f"DEMO PASSED in {elapsed:.0f}s (training runs: pristine {results['pristine'].duration:.0f}s,"
            f" fork {results['fork'].duration:.0f}s)"
        )
    return not problems


def main_1160(args):
    start = time.monotonic()
    fork_version, fork_file, _ = installed_trl()
    if importlib.util.find_spec("trl._fork_info") is None:
        raise SystemExit(
            f"run_demo.py: trl {fork_version} ({fork_file}) is pristine TRL, not the fork: the 1.16.0 demo compares it "
            "with the fork installed in this Python (make dev LINE=1.16.0)"
        )
    work, tree, launches = prepare_1160(args)
    fork_argv, fork_env = launches["fork"]
    pristine_env = launches["pristine"][1]
    print(f"[3/4] pristine TRL 1.16.0 ({tree}, no patch, first on PYTHONPATH): trl grpo ...", flush=True)
    print(
        f"      The command of [4/4] with PYTHONPATH={pristine_env['PYTHONPATH']},\n"
        f"      TRL_DEMO_REPORT_DIR={pristine_env['TRL_DEMO_REPORT_DIR']}, --output_dir {work / 'output' / 'pristine'}",
        flush=True,
    )
    results = {}
    results["pristine"] = _launch_1160(launches["pristine"], work, "pristine", args)
    print(f"[4/4] the fork (trl {fork_version}, {Path(fork_file).parent}): trl grpo ...", flush=True)
    for line in shim_note_1160(args.backend):
        print(f"      {line}", flush=True)
    print(f"      Equivalent command (this environment, files kept in {work}):", flush=True)
    print("        " + equivalent_command(fork_env, fork_argv, indent=" " * 8), flush=True)
    results["fork"] = _launch_1160(launches["fork"], work, "fork", args)
    reports = {}
    for variant in VARIANTS:
        found = [json.loads(p.read_text()) for p in sorted((work / "reports" / variant).glob("rank*.json"))]
        reports[variant] = sorted(found, key=lambda r: r["rank"])
    ok = summarize_1160(reports, results, args, tree, fork_version, fork_file, time.monotonic() - start)
    print(
        f"(work directory kept: {work}, for the equivalent command above; training logs: "
        f"{results['pristine'].log_path}, {results['fork'].log_path})"
    )
    return 0 if ok else 1


def _launch_1160(launch, work, variant, args):
    argv, env = launch
    return run_command(
        argv,
        env=env,
        workdir=work / "launch" / variant,
        backend=args.backend,
        timeout=args.timeout,
        cwd=work,
        echo=_echo(args.verbose),
    )


def main(argv=None):
    args = parse_args(argv)
    if resolve_line(args.line) == "1.16.0":
        return main_1160(args)
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
