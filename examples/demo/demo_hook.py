"""Demo-only start-up hook: report where GRPO's reference model lives and how much of it each rank holds.

Loaded into the ``trl grpo`` processes by the harness start-up hook (``TRL_HARNESS_PRELOAD``, see
``tests/harness/_site/sitecustomize.py``); it wraps ``GRPOTrainer.__init__`` and ``GRPOTrainer.train`` the
moment ``trl.trainer.grpo_trainer`` is imported, prints one line per rank and frozen model, and writes
``$TRL_DEMO_REPORT_DIR/rank<R>.json`` for ``run_demo.py``'s summary.  Never used outside the demo.

Each report also says which ``trl`` the rank imported (``trl.__file__``, ``trl.__version__`` and whether the fork's
generated ``trl._fork_info`` exists): the 1.16.0 demo runs pristine TRL through ``PYTHONPATH`` and checks that the
ranks really imported it.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

from trl_harness_hooks import after_import  # tests/harness/_site, on PYTHONPATH in demo processes


_TESTS = Path(__file__).resolve().parents[2] / "tests"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))


def _report(record):
    directory = os.environ.get("TRL_DEMO_REPORT_DIR")
    if directory:
        path = Path(directory) / f"rank{record['rank']}.json"
        path.write_text(json.dumps(record, indent=1, default=str))


def _which_trl():
    import trl

    return {
        "file": trl.__file__,
        "version": trl.__version__,
        "fork_info": importlib.util.find_spec("trl._fork_info") is not None,
    }


def _patch(module):
    from harness.facts import describe_for_humans, describe_model

    cls = module.GRPOTrainer
    original_init, original_train = cls.__init__, cls.train
    full = json.loads(os.environ.get("TRL_DEMO_FULL_NUMEL", "{}"))
    record = {"rank": int(os.environ.get("RANK", "0")), "world_size": int(os.environ.get("WORLD_SIZE", "1"))}
    record["trl"] = _which_trl()

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        acc = self.accelerator
        record["backend"] = str(acc.distributed_type).split(".")[-1]
        record["accelerator_device"] = str(acc.device)
        models = {"reference model": self.ref_model}
        reward_models = [f for f in self.reward_funcs if isinstance(f, module.PreTrainedModel)]
        if reward_models:
            models["reward model"] = reward_models[0]
        record["models"] = {}
        for name, model in models.items():
            if model is None:
                continue
            facts = describe_model(model, acc.device)
            n = full.get(name, facts["local_numel"])
            facts["full_numel"] = n
            record["models"][name] = facts
            print("[demo] " + describe_for_humans(name, facts, n, rank=record["rank"]), flush=True)
        _report(record)

    def train(self, *args, **kwargs):
        record["stage"] = "training"
        _report(record)
        result = original_train(self, *args, **kwargs)
        record["stage"] = "trained"
        record["global_step"] = self.state.global_step
        record["losses"] = [e["loss"] for e in self.state.log_history if "loss" in e]
        _report(record)
        return result

    cls.__init__, cls.train = __init__, train


after_import("trl.trainer.grpo_trainer", _patch)
