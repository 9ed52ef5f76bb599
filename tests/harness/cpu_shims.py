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


def _patch_deepspeed_comm(module):
    module.build_shm_op = lambda: None


def install_from_env():
    from trl_harness_hooks import after_import  # tests/harness/_site, on PYTHONPATH in launched processes

    if os.environ.get(FSDP_FLAG) == "1":
        after_import("accelerate.state", _patch_state_module)
    if os.environ.get(DS_NO_SHM_FLAG) == "1":
        after_import("deepspeed.comm.torch", _patch_deepspeed_comm)
