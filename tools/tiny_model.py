"""Make a tiny local model to try `trl grpo` with, offline, in a few seconds: `python tools/tiny_model.py OUT_DIR`.

Writes into OUT_DIR:

    policy/       a Qwen2 causal LM (2 layers, hidden 64, 2 attention heads of 64 / 2 = 32: vLLM's CPU attention has
                  no kernel below head_dim 32) with its tokenizer and generation config
    reward/       a Qwen2 sequence classifier (one score), the same tokenizer: a reward model for `trl grpo`
    prompts/      train.jsonl, one {"prompt": ...} per line: `datasets.load_dataset(path)`, `--dataset_name path`
    tiny_model.json   the absolute paths, and the `trl grpo` arguments printed at the end with absolute paths

The tokenizer is a byte-level BPE trained here on the prompts (any text encodes), with an end-of-sequence token
(`<|im_end|>`), a padding token (`<|pad|>`, left padding) and a chat template (`<|im_start|>role ... <|im_end|>`),
for conversational prompts (`apply_chat_template`). The weights are random: the model produces noise, fast. Nothing
is downloaded (HF_HUB_OFFLINE=1 is set here). This is a user tool, not test code: the project's tests build their
own fixtures (tests/harness/fixtures.py).
"""

import argparse
import json
import os
import random
import shlex
import sys
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PAD, EOS, IM_START = "<|pad|>", "<|im_end|>", "<|im_start|>"
# Unknown token: byte-level BPE never needs one, but transformers loads this tokenizer beside a Qwen2 config as
# Qwen2's tokenizer, which adds its default `<|endoftext|>` past the model's vocabulary when none is set.
UNK = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# (hidden 64 / 2 heads = head_dim 32, the smallest vLLM's CPU attention runs; one key-value head)
MODEL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    use_sliding_window=False,
)
SUBJECTS = "cat dog river mountain robot garden ocean train violin lantern forest comet".split()
TASKS = (
    "Describe a {a} {s} in one sentence.",
    "Write a short poem about the {a} {s}.",
    "Why is the {s} so {a}?",
    "Tell me a story about a {a} {s}.",
    "Count the legs of a {a} {s}.",
    "What does a {a} {s} eat?",
)
ADJECTIVES = "quiet bright old tiny brave green slow happy".split()


def make_prompts(count, seed):
    """`count` distinct short prompts (plain text)."""
    rng = random.Random(seed)
    combos = [task.format(a=a, s=s) for task in TASKS for a in ADJECTIVES for s in SUBJECTS]
    rng.shuffle(combos)
    return combos[:count]


def make_tokenizer(corpus, vocab_size=384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, IM_START, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus + ["system user assistant\n"], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=[IM_START],
        padding_side="left",
        model_max_length=MODEL["max_position_embeddings"],
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def grpo_args(out):
    """The `trl grpo` arguments for the artifacts in `out` (paths as `out` gives them): a short run, small enough for
    one CPU process."""
    out = Path(out)
    return [
        "--model_name_or_path", str(out / "policy"),
        "--reward_model_name_or_path", str(out / "reward"),
        "--dataset_name", str(out / "prompts"),
        "--output_dir", str(out / "grpo-output"),
        "--per_device_train_batch_size", "4",
        "--num_generations", "4",
        "--max_completion_length", "16",
        "--max_steps", "2",
        "--logging_steps", "1",
        "--report_to", "none",
        "--bf16", "false",  # TRL 1.x defaults to bf16, which CPUs refuse; a tiny model trains in fp32 anywhere
    ]  # fmt: skip


def build(out, *, seed=0, num_prompts=64):
    """Write the policy, reward model, tokenizer and prompts into `out`; return the manifest (also tiny_model.json)."""
    import torch
    import transformers
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    transformers.utils.logging.disable_progress_bar()
    out = Path(out).resolve()
    prompts = make_prompts(num_prompts, seed)
    tokenizer = make_tokenizer(make_prompts(len(TASKS) * len(ADJECTIVES) * len(SUBJECTS), seed))
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    ids["bos_token_id"] = tokenizer.eos_token_id

    torch.manual_seed(seed)
    policy = Qwen2ForCausalLM(Qwen2Config(**MODEL, **ids))
    policy.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    policy.save_pretrained(out / "policy")
    tokenizer.save_pretrained(out / "policy")

    torch.manual_seed(seed + 1)
    reward = Qwen2ForSequenceClassification(Qwen2Config(**MODEL, **ids, num_labels=1))
    reward.save_pretrained(out / "reward")
    tokenizer.save_pretrained(out / "reward")

    (out / "prompts").mkdir(parents=True, exist_ok=True)
    with open(out / "prompts" / "train.jsonl", "w") as f:
        for prompt in prompts:
            f.write(json.dumps({"prompt": prompt}) + "\n")

    manifest = {
        "policy": str(out / "policy"),
        "reward": str(out / "reward"),
        "prompts": str(out / "prompts"),
        "policy_parameters": sum(p.numel() for p in policy.parameters()),
        "vocab_size": len(tokenizer),
        "grpo_args": grpo_args(out),
    }
    (out / "tiny_model.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="tiny_model.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path, help="where to write policy/, reward/, prompts/ (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and prompts (default: %(default)s)")
    parser.add_argument("--num_prompts", type=int, default=64, help="prompts in the dataset (default: %(default)s)")
    args = parser.parse_args(argv)
    limit = len(TASKS) * len(ADJECTIVES) * len(SUBJECTS)
    if not 1 <= args.num_prompts <= limit:
        parser.error(f"--num_prompts: between 1 and {limit}")
    manifest = build(args.out_dir, seed=args.seed, num_prompts=args.num_prompts)
    print(f"policy:       {args.out_dir / 'policy'}  ({manifest['policy_parameters']:,} parameters)")
    print(f"reward model: {args.out_dir / 'reward'}")
    print(f"prompts:      {args.out_dir / 'prompts'}  ({args.num_prompts} rows, column 'prompt')")
    print("train it (from this directory):")
    print("  trl grpo " + " ".join(shlex.quote(arg) for arg in grpo_args(args.out_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
