"""Start-up hook (``TRL_HARNESS_PRELOAD``) of ``test_multi_machine.py``: what each training process of a
multi-machine launch saw.

In every process it records the prompts passed to ``generate`` (token ids, padding removed), the logs of the trainer
(``CallbackHandler.on_log``) and, at the end of each optimizer step, the process group as ``torch.distributed`` and
accelerate see it. At exit it writes ``$MULTI_MACHINE_RECORD_DIR/rank<RANK>.json`` with those, the environment
torchrun gave the process (``RANK``, ``WORLD_SIZE``, ``GROUP_RANK``: its machine, ...) and the ``trl`` it imported.
Processes that ran no step (the ``accelerate`` launchers) write nothing.
"""

import atexit
import json
import math
import os

from transformers import trainer_callback
from transformers.generation.utils import GenerationMixin


ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "MACHINE_RANK")  # fmt: skip
RECORD = {"prompts": [], "logs": [], "steps": 0, "group": None}

_generate = GenerationMixin.generate
_on_step_end = trainer_callback.CallbackHandler.on_step_end
_on_log = trainer_callback.CallbackHandler.on_log


def _record_generate(self, *args, **kwargs):
    input_ids = kwargs.get("input_ids", args[0] if args else None)
    mask = kwargs.get("attention_mask")
    if input_ids is not None:
        for i, row in enumerate(input_ids.tolist()):
            keep = mask[i].tolist() if mask is not None else [1] * len(row)
            RECORD["prompts"].append([t for t, m in zip(row, keep) if m])
    return _generate(self, *args, **kwargs)


def _record_step_end(self, args, state, control):
    import torch.distributed as dist
    from accelerate.state import PartialState

    RECORD["steps"] += 1
    if dist.is_available() and dist.is_initialized():
        state_ = PartialState()
        RECORD["group"] = {
            "world_size": dist.get_world_size(),
            "rank": dist.get_rank(),
            "backend": str(dist.get_backend()),
            "distributed_type": str(state_.distributed_type),
            "device": str(state_.device),
        }
    return _on_step_end(self, args, state, control)


def _record_log(self, args, state, control, logs, *rest, **kwargs):
    numbers = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
    RECORD["logs"].append({k: v if math.isfinite(v) else str(v) for k, v in numbers.items()})  # JSON: no nan/inf
    return _on_log(self, args, state, control, logs, *rest, **kwargs)


def _write():
    if not RECORD["steps"]:
        return
    import trl

    record = dict(RECORD, env={k: os.environ.get(k) for k in ENV_KEYS}, trl=trl.__version__, trl_file=trl.__file__)
    directory = os.environ["MULTI_MACHINE_RECORD_DIR"]
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank{os.environ.get('RANK', '0')}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


GenerationMixin.generate = _record_generate
trainer_callback.CallbackHandler.on_step_end = _record_step_end
trainer_callback.CallbackHandler.on_log = _record_log
atexit.register(_write)
