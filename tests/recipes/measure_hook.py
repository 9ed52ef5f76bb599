"""Start-up hook (``TRL_HARNESS_PRELOAD``) that measures a recipe run in each training process.

It records the time at which every optimizer step ends (``CallbackHandler.on_step_end``, which ``Trainer`` and TRL's
PPO/RLOO loops both call) and, at exit, writes ``$RECIPE_MEASURE_DIR/rank<RANK>.json`` with those times, the peak
resident memory of the process and, on CUDA, the peak memory PyTorch allocated and reserved on its device. Processes
that ran no step (the ``accelerate`` launcher) write nothing.
"""

import atexit
import json
import os
import resource
import time

from transformers import trainer_callback


_STEP_ENDS = []
_on_step_end = trainer_callback.CallbackHandler.on_step_end


def _record_step_end(self, args, state, control):
    _STEP_ENDS.append(time.perf_counter())
    return _on_step_end(self, args, state, control)


def _write():
    if not _STEP_ENDS:
        return
    import torch

    record = {
        "rank": int(os.environ.get("RANK", "0")),
        "step_ends": _STEP_ENDS,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cuda_max_allocated_mib": None,
        "cuda_max_reserved_mib": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        record["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        record["cuda_max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    directory = os.environ["RECIPE_MEASURE_DIR"]
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"rank{record['rank']}.json"), "w") as f:
        json.dump(record, f)


trainer_callback.CallbackHandler.on_step_end = _record_step_end
atexit.register(_write)
