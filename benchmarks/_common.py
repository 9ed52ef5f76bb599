"""What the benchmark scripts share: the size options and builder of their randomly initialised Qwen2 model, a
free port for their process groups, and the measurement of a process's peak extra resident memory. Imported by the
scripts (their directory is on ``sys.path`` when they run, and the workers they spawn inherit it)."""

import contextlib
import os
import re
import socket
import sys
from types import SimpleNamespace


MIB = 1 << 20


def add_model_args(parser, *, vocab=32000):
    """``--layers/--hidden/--intermediate/--vocab``; the defaults make a model of about 100M parameters."""
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=vocab)


def qwen2_config(options):
    """The Qwen2Config (untied head) of the size in ``options``."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=options["vocab"],
        hidden_size=options["hidden"],
        intermediate_size=options["intermediate"],
        num_hidden_layers=options["layers"],
        num_attention_heads=12 if options["hidden"] % 12 == 0 else 8,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )


def build_qwen2(options):
    """A randomly initialised Qwen2ForCausalLM (seed 0, untied head) of the size in ``options``."""
    import torch
    from transformers import Qwen2ForCausalLM

    config = qwen2_config(options)
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


def mmap_large_blocks():
    """Tells glibc to ``mmap`` every block of 64 KiB or more, so that a freed buffer leaves the resident set at once
    and the resident size follows the live tensors. Call it before starting the processes to measure: glibc reads
    ``MALLOC_MMAP_THRESHOLD_`` once, at start-up."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 * 1024))


def status_kib(field):
    """A field of ``/proc/self/status`` in KiB (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def reset_peak():
    """Resets this process's peak resident size (``VmHWM``) to its current resident size."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


@contextlib.contextmanager
def peak_extra():
    """Measures the peak resident memory of this process inside the block on top of its resident memory when the
    block starts; yields a namespace whose ``bytes`` is set when the block ends."""
    result = SimpleNamespace(bytes=None)
    before = status_kib("VmRSS")
    reset_peak()
    yield result
    result.bytes = (status_kib("VmHWM") - before) * 1024


def deepspeed_on_cpu():
    """DeepSpeed on CPU ranks (gloo): no JIT-compiled shared-memory op, and async collectives that complete before
    they return (ZeRO-3 otherwise reads gathers still in flight on CPU). The test harness's shims, see
    tests/harness/cpu_shims.py; call it in each rank before ``deepspeed.initialize``."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    harness = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "harness")
    sys.path.insert(0, os.path.abspath(harness))
    import cpu_shims

    cpu_shims.deepspeed_on_cpu()


def use_fsdp_on_cpu(plugin):
    """Makes every ``Accelerator`` of this process FSDP with ``plugin`` on the CPU: Accelerate selects FSDP only with an
    accelerator (MULTI_CPU or NO otherwise), so the state is set explicitly, as the patches' tests do."""
    import torch
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.fsdp_plugin = plugin
        self.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        self.device = PartialState._shared_state["device"] = torch.device("cpu")

    AcceleratorState.__init__ = __init__
