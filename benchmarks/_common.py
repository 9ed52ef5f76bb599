"""What the benchmark scripts share: the size options and builder of their randomly initialised Qwen2 model, and a
free port for their process groups. Imported by the scripts (their directory is on ``sys.path`` when they run,
and the workers they spawn inherit it)."""

import socket


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
