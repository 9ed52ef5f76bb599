"""What the benchmark scripts share: the size options and builder of their randomly initialised Qwen2 model, and a
free port for their process groups. Imported by the scripts (their directory is on ``sys.path`` when they run,
and the workers they spawn inherit it)."""

import os
import socket
import sys


def add_model_args(parser, *, vocab=32000):
    """``--layers/--hidden/--intermediate/--vocab``; the defaults make a model of about 100M parameters."""
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=vocab)


def build_qwen2(options):
    """A randomly initialised Qwen2ForCausalLM (seed 0, untied head) of the size in ``options``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=options["vocab"],
        hidden_size=options["hidden"],
        intermediate_size=options["intermediate"],
        num_hidden_layers=options["layers"],
        num_attention_heads=12 if options["hidden"] % 12 == 0 else 8,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def set_rank_env(rank, world_size, port):
    """The torch.distributed environment of one rank of a single-machine process group on 127.0.0.1:``port``."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )


def deepspeed_on_cpu():
    """DeepSpeed on CPU ranks (gloo): no JIT-compiled shared-memory op, and async collectives that complete before
    they return (ZeRO-3 otherwise reads gathers still in flight on CPU). The test harness's shims, see
    tests/harness/cpu_shims.py; call it in each rank before ``deepspeed.initialize``."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    harness = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "harness")
    sys.path.insert(0, os.path.abspath(harness))
    import cpu_shims

    cpu_shims.deepspeed_on_cpu()
