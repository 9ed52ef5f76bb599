"""The vLLM API that TRL 0.16.1's vLLM paths call, checked against real vLLM wheels without importing vLLM.

`trl vllm-serve` (trl/scripts/vllm_serve.py), `VLLMClient` (trl/extras/vllm_client.py) and Online DPO's colocated
`vllm.LLM` (trl/trainer/online_dpo_trainer.py) use the names, parameters and attributes listed in CONTRACT; the fork
changes none of them. Each entry is checked on the sources of a vLLM wheel with `ast`: pip picks the wheel from the
user's configured index, only the files the checks read are fetched (HTTP range requests, or pip downloads the whole
wheel: see fetch_sources) into the cache (TRL_FORK_CACHE, else ~/.cache/trl-fork), and nothing of vLLM is imported
or run (it needs CUDA).

The `vllm` extra is bounded by setup.py's TESTED_UPPER_BOUNDS. The tests check the newest release below that bound
(it must keep the whole contract) and the bound itself (it must break it: the bound sits where the contract breaks).
lines/0.16.1/docs/vllm_version.md has the table for every release from 0.7.2 on; reproduce it with

    python lines/0.16.1/tests/build/test_vllm_contract.py 0.7.2 0.7.3 0.8.0 ...
"""

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest


ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "tools"))
import wheel_sources  # noqa: E402
from wheel_sources import (  # noqa: E402
    Sources,
    assigns_self,
    fields,
    mentions,
    method,
    parameters,
    top_level,
    top_level_names,
)


# What the tests unpack from a wheel: everything the checks below read (later releases split some modules into
# packages, e.g. vllm/config/, so whole folders are taken where that happened).
UNPACKED = re.compile(
    r"^vllm/(__init__|envs|outputs|sampling_params|config)\.py$"
    r"|^vllm/(config|engine|distributed|worker|executor)/[^/]+\.py$"
    r"|^vllm/entrypoints/llm\.py$"
    r"|^vllm/distributed/device_communicators/pynccl\.py$"
)


# ---------------------------------------------------------------------------------------------- the contract


@dataclass(frozen=True)
class Check:
    name: str  # what TRL calls, as it calls it
    users: str  # where: serve (trl vllm-serve), client (VLLMClient), odpo (Online DPO with use_vllm=True)
    check: Callable[[Sources], Optional[str]]  # None when the release keeps it, else what is missing


def _call_accepts(src: Sources, dotted: str, cls_name: str, meth: str, names: list[str]) -> Optional[str]:
    func = method(src.cls(dotted, cls_name), meth)
    if func is None:
        return f"no {dotted}.{cls_name}.{meth}"
    accepted, _ = parameters(func)
    missing = [n for n in names if n not in accepted]
    return f"{cls_name}.{meth} has no parameter {', '.join(missing)}" if missing else None


def _defined(dotted: str, *names: str) -> Callable[[Sources], Optional[str]]:
    def check(src: Sources) -> Optional[str]:
        module = src.module(dotted)
        if module is None:
            return f"no module {dotted}"
        missing = [n for n in names if n not in top_level_names(module)]
        return f"{dotted} has no {', '.join(missing)}" if missing else None

    return check


def _stateless_process_group(src: Sources) -> Optional[str]:
    cls = src.cls("vllm.distributed.utils", "StatelessProcessGroup")
    create = method(cls, "create")
    if create is None:
        return "no StatelessProcessGroup.create"
    if not any(getattr(d, "id", None) in ("staticmethod", "classmethod") for d in create.decorator_list):
        return "StatelessProcessGroup.create is not a static/class method"
    return _call_accepts(
        src, "vllm.distributed.utils", "StatelessProcessGroup", "create", ["host", "port", "rank", "world_size"]
    )


def _barrier(src: Sources) -> Optional[str]:
    barrier = method(src.cls("vllm.distributed.utils", "StatelessProcessGroup"), "barrier")
    if barrier is None:
        return "no StatelessProcessGroup.barrier"
    accepted, _ = parameters(barrier)
    required = len(barrier.args.posonlyargs + barrier.args.args) - len(barrier.args.defaults)
    return None if required <= 1 else f"StatelessProcessGroup.barrier requires {accepted[1:required]}"


PYNCCL = "vllm.distributed.device_communicators.pynccl"


def _pynccl_init(src: Sources) -> Optional[str]:
    func = method(src.cls(PYNCCL, "PyNcclCommunicator"), "__init__")
    if func is None:
        return "no PyNcclCommunicator.__init__"
    accepted, _ = parameters(func)
    if accepted[:3] != ["self", "group", "device"]:
        return f"PyNcclCommunicator(...) takes {accepted[1:3]} first, not (group, device)"
    return None if assigns_self(src.cls(PYNCCL, "PyNcclCommunicator"), "group") else "no PyNcclCommunicator.group"


def _pynccl_broadcast(src: Sources) -> Optional[str]:
    return _call_accepts(src, PYNCCL, "PyNcclCommunicator", "broadcast", ["tensor", "src", "stream"])


def _world_group_rank(src: Sources) -> Optional[str]:
    cls = src.cls("vllm.distributed.parallel_state", "GroupCoordinator")
    return None if assigns_self(cls, "rank") else "GroupCoordinator sets no .rank"


def _v0_worker(src: Sources) -> Optional[str]:
    cls = src.cls("vllm.worker.worker", "Worker")
    if cls is None:
        return "no vllm.worker.worker.Worker (the V0 worker WeightSyncWorker subclasses)"
    missing = [a for a in ("device", "model_runner") if not assigns_self(cls, a)]
    return f"Worker sets no {', '.join(missing)}" if missing else None


def _llm_kwargs(names: list[str]) -> Callable[[Sources], Optional[str]]:
    """`LLM(name=...)`: a parameter of LLM.__init__, or an EngineArgs field that its **kwargs are passed to."""

    def check(src: Sources) -> Optional[str]:
        init = method(src.cls("vllm.entrypoints.llm", "LLM"), "__init__")
        if init is None:
            return "no LLM.__init__"
        accepted, has_kwargs = parameters(init)
        engine_fields = fields(src.cls("vllm.engine.arg_utils", "EngineArgs")) if has_kwargs else set()
        missing = [n for n in names if n not in accepted and n not in engine_fields]
        return f"LLM(...) accepts no {', '.join(missing)}" if missing else None

    return check


def _llm_method(meth: str, names: list[str]) -> Callable[[Sources], Optional[str]]:
    return lambda src: _call_accepts(src, "vllm.entrypoints.llm", "LLM", meth, names)


def _sampling_fields(names: list[str]) -> Callable[[Sources], Optional[str]]:
    def check(src: Sources) -> Optional[str]:
        missing = [n for n in names if n not in fields(src.cls("vllm.sampling_params", "SamplingParams"))]
        return f"SamplingParams has no {', '.join(missing)}" if missing else None

    return check


def _guided_fields(src: Sources) -> Optional[str]:
    missing = [
        n for n in ("backend", "regex") if n not in fields(src.cls("vllm.sampling_params", "GuidedDecodingParams"))
    ]
    return f"GuidedDecodingParams has no {', '.join(missing)}" if missing else None


def _v1_default(src: Sources) -> bool:
    """Whether VLLM_USE_V1 defaults to on (vllm/envs.py: os.getenv("VLLM_USE_V1", "<default>"))."""
    for node in ast.walk(src.module("vllm.envs") or ast.Module(body=[], type_ignores=[])):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "getenv"
            and len(node.args) == 2
            and getattr(node.args[0], "value", None) == "VLLM_USE_V1"
        ):
            return getattr(node.args[1], "value", "0") != "0"
    return True  # no switch at all: V1 only


def _oracle(src: Sources) -> Optional[ast.FunctionDef]:
    return method(src.cls("vllm.engine.arg_utils", "EngineArgs"), "_is_v1_supported_oracle")


def _serve_engine_is_v0(src: Sources) -> Optional[str]:
    # WeightSyncWorker subclasses the V0 worker; on the V1 engine it lacks determine_available_memory /
    # get_kv_cache_spec and the LLM(...) of `trl vllm-serve` fails. With VLLM_USE_V1 unset (what users run) the
    # release must pick V0 for a custom worker_cls: V1 off by default, or the engine oracle falling back to V0 on it.
    if not _v1_default(src) or mentions(_oracle(src), "worker_cls"):
        return None
    return "VLLM_USE_V1 defaults to 1 and a custom worker_cls no longer falls back to V0"


def _odpo_engine_is_v0(src: Sources) -> Optional[str]:
    # llm.llm_engine.model_executor.driver_worker is the V0 engine's (V1 has a model_executor only with
    # VLLM_ENABLE_V1_MULTIPROCESSING=0). Online DPO passes dtype=float32, which the V1 oracle refused up to vLLM 0.9.1
    # (V1_SUPPORTED_DTYPES = bfloat16, float16), falling back to V0.
    oracle = _oracle(src)
    if not _v1_default(src):
        return None
    if oracle is None or not mentions(oracle, "V1_SUPPORTED_DTYPES") or mentions(oracle, "float32"):
        return "VLLM_USE_V1 defaults to 1 and dtype=float32 no longer falls back to V0"
    return None


def _v0_engine_attributes(src: Sources) -> Optional[str]:
    engine = src.cls("vllm.engine.llm_engine", "LLMEngine")
    missing = [a for a in ("parallel_config", "model_executor") if not assigns_self(engine, a)]
    reset = method(engine, "reset_prefix_cache")
    if reset is None or len(reset.args.args) - len(reset.args.defaults) > 1:
        missing.append("reset_prefix_cache()")
    return f"V0 LLMEngine has no {', '.join(missing)}" if missing else None


def _tensor_parallel_size(src: Sources) -> Optional[str]:
    modules = src.package_modules("vllm.config")
    configs = [n for m in modules for n in top_level(m) if isinstance(n, ast.ClassDef) and n.name == "ParallelConfig"]
    return None if any("tensor_parallel_size" in fields(c) for c in configs) else "ParallelConfig.tensor_parallel_size"


def _driver_worker(src: Sources) -> Optional[str]:
    executor = src.cls("vllm.executor.uniproc_executor", "UniProcExecutor")
    if not assigns_self(executor, "driver_worker"):
        return "UniProcExecutor sets no driver_worker"
    wrapper = src.cls("vllm.worker.worker_base", "WorkerWrapperBase")
    return None if method(wrapper, "__getattr__") else "WorkerWrapperBase does not forward .model_runner"


def _request_output(src: Sources) -> Optional[str]:
    request = src.cls("vllm.outputs", "RequestOutput")
    missing = [a for a in ("prompt_token_ids", "outputs") if not assigns_self(request, a)]
    if "token_ids" not in fields(src.cls("vllm.outputs", "CompletionOutput")):
        missing.append("CompletionOutput.token_ids")
    return f"RequestOutput has no {', '.join(missing)}" if missing else None


SERVE_LLM_KWARGS = [
    "model",
    "revision",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "dtype",
    "enable_prefix_caching",
    "max_model_len",
    "worker_cls",
]

CONTRACT = [
    Check("from vllm import LLM, SamplingParams", "serve, odpo", _defined("vllm", "LLM", "SamplingParams")),
    Check("vllm.distributed.device_communicators.pynccl.PyNcclCommunicator", "serve, client", _defined(PYNCCL, "PyNcclCommunicator")),
    Check("vllm.distributed.parallel_state.get_world_group", "serve", _defined("vllm.distributed.parallel_state", "get_world_group")),
    Check("vllm.distributed.utils.StatelessProcessGroup", "serve, client", _defined("vllm.distributed.utils", "StatelessProcessGroup")),
    Check("vllm.sampling_params.GuidedDecodingParams", "serve", _defined("vllm.sampling_params", "GuidedDecodingParams")),
    Check("vllm.worker.worker.Worker (V0 worker, base of WeightSyncWorker)", "serve", _v0_worker),
    Check("StatelessProcessGroup.create(host=, port=, rank=, world_size=)", "serve, client", _stateless_process_group),
    Check("PyNcclCommunicator(group, device=) and its .group", "serve, client", _pynccl_init),
    Check("PyNcclCommunicator.broadcast(tensor, src=, stream=)", "serve, client", _pynccl_broadcast),
    Check("pynccl_comm.group.barrier()", "serve, client", _barrier),
    Check("get_world_group().rank", "serve", _world_group_rank),
    Check(f"LLM({'=, '.join(SERVE_LLM_KWARGS)}=)", "serve", _llm_kwargs(SERVE_LLM_KWARGS)),
    Check("LLM(model=, gpu_memory_utilization=, dtype=torch.float32)", "odpo", _llm_kwargs(["model", "gpu_memory_utilization", "dtype"])),
    Check("LLM.generate(prompts, sampling_params=, use_tqdm=)", "serve, odpo", _llm_method("generate", ["sampling_params", "use_tqdm"])),
    Check("LLM.chat(messages, sampling_params, use_tqdm=)", "odpo", _llm_method("chat", ["messages", "sampling_params", "use_tqdm"])),
    Check("LLM.collective_rpc(method, args=)", "serve", _llm_method("collective_rpc", ["method", "args"])),
    Check("SamplingParams(n, repetition_penalty, temperature, top_p, top_k, min_p, max_tokens, guided_decoding)", "serve",
          _sampling_fields(["n", "repetition_penalty", "temperature", "top_p", "top_k", "min_p", "max_tokens", "guided_decoding"])),
    Check("SamplingParams(n, max_tokens, temperature, top_k, top_p, detokenize)", "odpo",
          _sampling_fields(["n", "max_tokens", "temperature", "top_k", "top_p", "detokenize"])),
    Check("GuidedDecodingParams(backend=, regex=)", "serve", _guided_fields),
    Check("llm.llm_engine.parallel_config / .reset_prefix_cache() (V0 LLMEngine)", "serve", _v0_engine_attributes),
    Check("parallel_config.tensor_parallel_size", "serve", _tensor_parallel_size),
    Check("llm.llm_engine.model_executor.driver_worker.model_runner (V0)", "odpo", _driver_worker),
    Check("RequestOutput.outputs[i].token_ids, .prompt_token_ids", "serve, odpo", _request_output),
    Check("engine: LLM(worker_cls=WeightSyncWorker) runs on V0 with VLLM_USE_V1 unset", "serve", _serve_engine_is_v0),
    Check("engine: LLM(dtype=torch.float32) runs on V0 with VLLM_USE_V1 unset", "odpo", _odpo_engine_is_v0),
]  # fmt: skip


def broken(root: Path) -> dict[str, str]:
    """{contract entry: what this release lacks} for every entry the sources at `root` (holding vllm/) break."""
    src = Sources(root)
    if src.module("vllm") is None:
        raise FileNotFoundError(f"no vllm/__init__.py under {root}")
    return {c.name: reason for c in CONTRACT if (reason := c.check(src))}


# ------------------------------------------------------------------------------------------ fetching wheels


def fetch_sources(requirement: str) -> tuple[str, Path]:
    """(version, folder holding its vllm/ sources) of the wheel pip picks for `requirement`; cached.

    The index is pip's (its configuration applies). Only the members the checks read are fetched, with HTTP range
    requests; where the server does not serve ranges, or with TRL_FORK_VLLM_FETCH=pip, pip downloads the whole
    wheel (265-380 MB for these releases) and its sha256 is checked against the index's (tools/wheel_sources.py)."""
    return wheel_sources.fetch_sources(requirement, UNPACKED, "vllm-contract")


def upper_bound_in_setup() -> str:
    """TESTED_UPPER_BOUNDS["vllm"] from setup.py (read, not imported: importing setup.py builds the fork)."""
    tree = ast.parse((ROOT / "lines" / "0.16.1" / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "TESTED_UPPER_BOUNDS":
            return ast.literal_eval(node.value)["vllm"]
    raise AssertionError("setup.py has no TESTED_UPPER_BOUNDS")


# ----------------------------------------------------------------------------------------------------- tests


@pytest.mark.slow
@pytest.mark.build
def test_newest_release_in_the_tested_range_keeps_the_contract():
    bound = upper_bound_in_setup()
    version, root = fetch_sources(f"vllm{bound}")
    assert broken(root) == {}, f"vLLM {version} (the newest release allowed by vllm{bound})"


@pytest.mark.slow
@pytest.mark.build
def test_the_upper_bound_is_the_first_release_that_breaks_the_contract():
    bound = upper_bound_in_setup()
    assert bound.startswith("<")
    version, root = fetch_sources(f"vllm=={bound[1:]}")
    assert set(broken(root)) == {"engine: LLM(worker_cls=WeightSyncWorker) runs on V0 with VLLM_USE_V1 unset"}, version


if __name__ == "__main__":
    # python lines/0.16.1/tests/build/test_vllm_contract.py VERSION...: the evidence table of lines/0.16.1/docs/vllm_version.md
    for wanted in sys.argv[1:]:
        version, root = fetch_sources(f"vllm=={wanted}")
        failures = broken(root)
        print(f"{version}: {'keeps the contract' if not failures else ''}")
        for name, reason in failures.items():
            print(f"  - {name}: {reason}")
