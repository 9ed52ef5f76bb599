"""Test-only CPU shims, installed in launched processes by ``_site/sitecustomize.py``.

1. The CPU FSDP shim (``TRL_HARNESS_CPU_FSDP=1``): real torch FSDP (1 and 2) through accelerate on CPU
   ranks (gloo).

accelerate 1.6 routes a process group without GPUs to ``MULTI_CPU`` and silently drops the FSDP plugin,
and the shared device it picks, ``cpu:0``, is one FSDP rejects.  After ``AcceleratorState.__init__`` the
shim turns a ``MULTI_CPU`` state launched with ``ACCELERATE_USE_FSDP=true`` into an ``FSDP`` state that
keeps the plugin and uses ``torch.device("cpu")``.  accelerate, transformers' ``Trainer`` and TRL then take
their real FSDP code paths (wrapping, sharding, summoning, state dicts) on CPU.

2. No DeepSpeed shared-memory comm op on CPU (``TRL_HARNESS_DS_NO_SHM=1``): DeepSpeed's CPU accelerator
   JIT-compiles a C++ op (``deepspeed_shm_comm``, minutes on 2 cores on a fresh machine) that only speeds up
   CPU all-reduce; without it DeepSpeed uses plain torch.distributed (gloo).  Nothing GPU-related changes.

3. DeepSpeed's asynchronous collectives complete before they return, on CPU (same flag).  ZeRO-3 gathers
   several parameters at once (``Init._allgather_params_coalesced``: one ``all_gather_into_tensor(...,
   async_op=True)`` per parameter) and then waits for the *last* handle only, which on a GPU orders every
   earlier gather on the same stream.  gloo runs async work on several threads with no such order: the
   earlier gathers may still be writing into parameters that are already in use.  On CPU this corrupted
   whole parameters, or one rank's half of them, in about one ZeRO-3 launch of three: weights loaded under
   ``zero.Init`` were overwritten with stale buffers (garbage up to 1e38), and ``generate()`` inside a
   gathered block failed with ``probability tensor contains either inf, nan``.  The shim waits for each
   async collective of DeepSpeed's torch backend before returning its (completed) work handle; callers
   that wait again get the same result.  A CPU/gloo issue of DeepSpeed 0.16; GPU runs never see the shim.

Never imported by users and never part of a patch: the launcher enables them in worker processes only.
They patch lazily, right after the target module is first imported, so processes that never import it
pay nothing.
"""

import os


FSDP_FLAG = "TRL_HARNESS_CPU_FSDP"
DS_NO_SHM_FLAG = "TRL_HARNESS_DS_NO_SHM"


def _patch_state_module(module):
    import torch

    AcceleratorState = module.AcceleratorState
    PartialState = module.PartialState
    DistributedType = module.DistributedType
    if getattr(AcceleratorState.__init__, "_trl_harness_shim", False):
        return
    original_init = AcceleratorState.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
            return
        if self.distributed_type != DistributedType.MULTI_CPU:
            return
        fsdp_plugin = kwargs.get("fsdp_plugin")
        if fsdp_plugin is None:
            from accelerate.utils import FullyShardedDataParallelPlugin

            fsdp_plugin = FullyShardedDataParallelPlugin()  # reads the FSDP_* variables set by the launcher
        cpu = torch.device("cpu")  # not "cpu:0": FSDP rejects a CPU device with an index
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = fsdp_plugin
        self.device = cpu
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        PartialState._shared_state["device"] = cpu

    __init__._trl_harness_shim = True
    __init__.__wrapped__ = original_init
    AcceleratorState.__init__ = __init__


_DS_ASYNC_COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_base",
    "all_gather_coalesced",
    "reduce_scatter_tensor",
    "all_to_all",
    "gather",
    "scatter",
)


def _completed_on_return(method):
    import functools
    import inspect

    signature = inspect.signature(method)

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        work = method(*args, **kwargs)
        if work is not None and hasattr(work, "wait"):
            bound = signature.bind_partial(*args, **kwargs)
            if bound.arguments.get("async_op"):  # passed by keyword or by position
                work.wait()
        return work

    wrapper._trl_harness_shim = True
    return wrapper


def _patch_deepspeed_comm(module):
    module.build_shm_op = lambda: None
    backend = module.TorchBackend
    for name in _DS_ASYNC_COLLECTIVES:
        method = getattr(backend, name, None)
        if method is not None and not getattr(method, "_trl_harness_shim", False):
            setattr(backend, name, _completed_on_return(method))


def deepspeed_on_cpu():
    """Both DeepSpeed shims (2 and 3) right now, for scripts that run DeepSpeed on CPU without the launcher."""
    import importlib

    _patch_deepspeed_comm(importlib.import_module("deepspeed.comm.torch"))


def install_from_env():
    from trl_harness_hooks import after_import  # tests/harness/_site, on PYTHONPATH in launched processes

    if os.environ.get(FSDP_FLAG) == "1":
        after_import("accelerate.state", _patch_state_module)
    if os.environ.get(DS_NO_SHM_FLAG) == "1":
        after_import("deepspeed.comm.torch", _patch_deepspeed_comm)
