"""Memory and time of the final ``save_model`` of a trainer under FSDP2 with a sharded state dict (issue #40).

At 2 CPU ranks (gloo), a randomly initialised Qwen2 model (``--layers/--hidden/--intermediate/--vocab``, default about
100M parameters, float32) is wrapped by FSDP2 as a trainer wraps it (GRPO's trainer, the test harness's FSDP-on-CPU
setup: each decoder layer a unit), then ``trainer.save_model(dir)`` runs on every rank. Variants, each in fresh
processes:

- ``sharded``: ``fsdp_state_dict_type: SHARDED_STATE_DICT``, the fork's save (0.16.1 patch 0038, 1.16.0 patch 0020;
  pristine TRL writes nothing here);
- ``full`` (1.16.0 line only): ``FULL_STATE_DICT``, transformers' own save, the reference the issue sets ("no more than
  a full-state-dict save needs"); accelerate 1.6 (0.16.1 line) refuses it for FSDP2;
- ``accelerate-1.6`` (0.16.1 line only): ``Accelerator.get_state_dict`` of accelerate 1.6 alone, the gather the fork's
  0.16.1 patch does not use (every tensor gathered on every rank at once), for comparison.

Peak extra per rank: peak resident memory during the call minus the resident memory right before it (``VmHWM`` after
resetting it, ``benchmarks/_common.py``). Run with the line's venv:

    lines/0.16.1/.venv/bin/python benchmarks/save_memory.py          # 0.16.1 line
    lines/1.16.0/.venv/bin/python benchmarks/save_memory.py          # 1.16.0 line
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    MIB,
    add_model_args,
    build_qwen2,
    free_port,
    mmap_large_blocks,
    peak_extra,
    set_rank_env,
    use_fsdp_on_cpu,
)


def _use_fsdp2_on_cpu(state_dict_type):
    """The accelerator state of this process: FSDP2, each decoder layer a unit, on CPU (as the patches' tests)."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        reshard_after_forward=True,
        state_dict_type=state_dict_type,
        cpu_ram_efficient_loading=False,
    )
    use_fsdp_on_cpu(plugin)


def _tokenizer(vocab):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i + 3 for i in range(vocab - 3)}
    tokenizer = Tokenizer(models.WordLevel(vocab={"[PAD]": 0, "[EOS]": 1, "[UNK]": 2, **words}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]", padding_side="left"
    )


def _worker(rank, world_size, port, options, variant, out_dir):
    import torch
    import torch.distributed as dist
    from datasets import Dataset

    set_rank_env(rank, world_size, port)
    os.environ["ACCELERATE_USE_CPU"] = "true"  # accelerate >= 1.10 forms a process group on CPU with this
    torch.set_num_threads(1)
    _use_fsdp2_on_cpu("FULL_STATE_DICT" if variant == "full" else "SHARDED_STATE_DICT")
    from trl import GRPOConfig, GRPOTrainer

    model = build_qwen2(options)
    numel = sum(p.numel() for p in model.parameters())
    args = GRPOConfig(
        os.path.join(out_dir, "trainer"),
        use_cpu=True,
        bf16=False,
        beta=0.0,  # no reference model
        per_device_train_batch_size=2,
        num_generations=2,
        report_to="none",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["w1 w2"] * 4}),
        processing_class=_tokenizer(options["vocab"]),
    )
    # Wrapped as `Trainer.train` wraps it (FSDP2 shards in place: `trainer.model` is the sharded model)
    optimizer = torch.optim.SGD(trainer.model.parameters(), lr=0.0)  # FSDP2 prepares a model with its optimizer
    trainer.model_wrapped, _ = trainer.accelerator.prepare(trainer.model, optimizer)
    dist.barrier()
    start = time.monotonic()
    with peak_extra() as peak:
        if variant == "accelerate-1.6":
            state_dict = trainer.accelerator.get_state_dict(trainer.model)
            del state_dict
        else:
            trainer.save_model(os.path.join(out_dir, "saved"))
    seconds = time.monotonic() - start
    files = sorted(p.name for p in Path(out_dir, "saved").glob("*")) if rank == 0 else []
    result = dict(rank=rank, peak_extra=peak.bytes, seconds=seconds, model_bytes=numel * 4, files=files)
    Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def run(options, variant, ranks=2):
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(ranks, free_port(), options, variant, out_dir), nprocs=ranks, join=True)
        return [json.loads(Path(out_dir, f"{rank}.json").read_text()) for rank in range(ranks)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(parser, vocab=16000)
    parser.add_argument("--variants", default=None, help="default: sharded,full (1.16.0) or sharded,accelerate-1.6")
    options = parser.parse_args(argv)
    mmap_large_blocks()
    import trl

    line = "1.16.0" if trl.__version__.startswith("1.") else "0.16.1"
    variants = options.variants or ("sharded,full" if line == "1.16.0" else "sharded,accelerate-1.6")
    size = {k: getattr(options, k) for k in ("layers", "hidden", "intermediate", "vocab")}
    print(f"trl {trl.__version__}, model {size}")
    print("| line | variant | model | peak extra rank 0 | peak extra rank 1 | time | rank 0 wrote |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for variant in variants.split(","):
        results = run(size, variant)
        model_mib = results[0]["model_bytes"] / MIB
        peaks = [r["peak_extra"] / MIB for r in results]
        seconds = max(r["seconds"] for r in results)
        wrote = ", ".join(results[0]["files"]) or "-"
        print(
            f"| {line} | {variant} | {model_mib:.0f} MiB | {peaks[0]:.0f} MiB | {peaks[1]:.0f} MiB | {seconds:.1f} s "
            f"| {wrote} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
