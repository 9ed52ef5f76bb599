"""What a golden-equivalence run records, for every line: each line's worker (``lines/<version>/tests/golden``)
builds its trainers and calls :func:`main`, which trains a few steps and records what the trainer did.

The worker runs once per (trainer, mode, tree) (``harness.golden``): ``mode`` ``single`` is one plain ``python``
process, ``ddp`` is 2 gloo ranks through the line's launcher. The tree (the line's pristine TRL release or the fork)
is chosen by ``PYTHONPATH``; nothing here knows which one it runs on, and no fork option is set.

Rank 0 writes ``<out>/result.json``:

- ``trl``: the file, version and ``FIXED_ISSUES`` of the imported ``trl`` (the test checks it ran the right tree);
- ``logs``: every ``log_history`` entry (Python floats round-trip exactly through JSON);
- ``weights``: ``sha256`` over every tensor of the trained model's state dict (name, dtype, shape, bytes) and
  the same per tensor; the tensors themselves go to ``<out>/weights.pt`` so a difference can be measured;
- ``saved``: each weight file of the final ``save_model``, its sha256 and its tensors (``save_error`` if it failed).

A failure writes ``result.json`` with ``error`` (the traceback) and exits non-zero.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import traceback
from pathlib import Path


def weight_checksums(model):
    """sha256 of the whole state dict and of each tensor (name, dtype, shape and bytes), plus the tensors."""
    import torch

    total = hashlib.sha256()
    per_tensor, tensors = {}, {}
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        raw = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header = f"{name}|{t.dtype}|{tuple(t.shape)}|".encode()
        per_tensor[name] = hashlib.sha256(header + raw).hexdigest()
        total.update(header + raw)
        tensors[name] = t.clone()
    return {"sha256": total.hexdigest(), "tensors": per_tensor}, tensors


def saved_files(folder):
    """{file: {"sha256": ..., "tensors": {name: "dtype shape"}}} of every ``*.safetensors`` in ``folder``."""
    from safetensors import safe_open

    files = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            tensors = {name: f"{f.get_slice(name).get_dtype()} {f.get_slice(name).get_shape()}" for name in f.keys()}
        files[path.name] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "tensors": tensors}
    return files


def _jsonable(log_history):
    return [
        {k: v if not isinstance(v, float) or math.isfinite(v) else repr(v) for k, v in e.items()} for e in log_history
    ]


def _trl_info():
    import trl

    try:
        from trl import _fork_info

        fixed = sorted(_fork_info.FIXED_ISSUES)
    except ImportError:
        fixed = None
    return {"file": trl.__file__, "version": trl.__version__, "fixed_issues": fixed}


def main(argv=None, *, build, trainers):
    """Parse the worker's arguments, build the trainer with ``build(kind, manifest, out_dir, steps)`` (one of
    ``trainers``, the line's), train it, record what it did and leave."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainer", choices=trainers, required=True)
    parser.add_argument("--fixtures", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    a = parser.parse_args(argv)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    result = {"trainer": a.trainer, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "steps": a.steps}
    try:
        import torch

        from .fixtures import load_manifest

        result["trl"] = _trl_info()
        trainer = build(a.trainer, load_manifest(a.fixtures), out, a.steps)
        trainer.train()
        result["global_step"] = trainer.state.global_step
        result["logs"] = _jsonable(trainer.state.log_history)
        result["weights"], tensors = weight_checksums(trainer.accelerator.unwrap_model(trainer.model))
        if rank == 0:
            torch.save(tensors, out / "weights.pt")
        # The final save as the scripts do it (every rank), apart from training (0.16.1's PPO cannot save under DDP):
        # each weight file it writes, its sha256 and its tensors' names, dtypes and shapes (#40: the same files)
        try:
            trainer.save_model(str(out / "saved"))
        except Exception as exc:
            result["save_error"] = f"{type(exc).__name__}: {exc}"
        else:
            if rank == 0:
                result["saved"] = saved_files(out / "saved")
    except BaseException:
        result["error"] = traceback.format_exc()
        raise
    finally:
        if rank == 0:
            (out / "result.json").write_text(json.dumps(result, indent=1))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another one still uses it
        dist.destroy_process_group()
    # Everything is written. The interpreter's shutdown after a 2-process gloo run was seen to hang one rank (2 of 32
    # DDP launches in one CI run, on pristine 0.16.1 as on the fork, after training had finished): leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
