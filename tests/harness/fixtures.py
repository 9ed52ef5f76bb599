"""Offline tiny fixtures: tokenizer, causal LM, reward model and datasets, all built in code.

``build_fixtures(directory)`` writes everything below ``directory`` and returns a manifest (also saved as
``manifest.json``) with the paths.  Every artefact is saved the way users save theirs, so
``AutoTokenizer.from_pretrained``, ``AutoModelForCausalLM.from_pretrained``,
``AutoModelForSequenceClassification.from_pretrained`` and ``datasets.load_dataset`` (hence the ``trl`` CLI)
load them from the local paths with ``HF_HUB_OFFLINE=1``:

    <dir>/tokenizer/            PreTrainedTokenizerFast (BPE trained here, eos/pad tokens, chat template)
    <dir>/policy/               Qwen2ForCausalLM (2 layers, hidden 32) + tokenizer
    <dir>/reward/               Qwen2ForSequenceClassification (num_labels=1, same tokenizer) + tokenizer
    <dir>/data/prompt_only/     {train,test}.parquet, column "prompt" (plain text, unique per row)
    <dir>/data/preference/      {train,test}.parquet, columns "prompt", "chosen", "rejected"
    <dir>/manifest.json

Usable from pytest (session fixture in ``harness.pytest_plugin``), from worker scripts and from the demo.
"""

import json
import os
import random
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MANIFEST = "manifest.json"
FIXTURE_VERSION = 1  # bump when the content changes

PAD, EOS, BOS = "<|pad|>", "<|endoftext|>", "<|startoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = (
    "zero one two three four five six seven eight nine ten red green blue cat dog bird fish tree "
    "river stone cloud rain sun moon star apple bread milk water fire wind road house door window "
    "small large quick slow happy sad bright dark warm cold what which where when how why is are the a "
    "after before next count name color animal answer question please tell me about"
).split()
_TOPICS = ("number", "color", "animal", "weather", "food", "place")

MODEL_KW = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    use_sliding_window=False,
    sliding_window=None,
)


def _prompts(n, seed):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 6)))
        # the index makes every prompt unique, so workers can tell which rank saw which prompt
        out.append(f"Question {i} about {_TOPICS[i % len(_TOPICS)]}: {words}?")
    return out


def _train_tokenizer(vocab_size=320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, BOS, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _prompts(400, seed=1) + [" ".join(_WORDS)] * 4 + ["user assistant system\n"] * 4
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        bos_token=None,
        additional_special_tokens=[IM_START, IM_END],
        padding_side="left",
        model_max_length=256,
        model_input_names=["input_ids", "attention_mask"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _model_config(tokenizer, **extra):
    """The tiny Qwen2 config of `MODEL_KW` for `tokenizer`; `extra` adds keys or replaces those of `MODEL_KW`."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        **{**MODEL_KW, **extra},
    )


def _numel(model):
    return sum(p.numel() for p in model.parameters())


def build_fixtures(directory, *, seed=0, n_prompts=64):
    """Build (or reuse, if already complete) the tiny fixtures under ``directory``; return the manifest dict."""
    directory = Path(directory).resolve()
    manifest_path = directory / MANIFEST
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("version") == FIXTURE_VERSION:
            return manifest

    import datasets
    import torch
    from datasets import Dataset
    from transformers import GenerationConfig, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    directory.mkdir(parents=True, exist_ok=True)
    datasets.disable_progress_bars()
    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(directory / "tokenizer")

    torch.manual_seed(seed)
    policy = Qwen2ForCausalLM(_model_config(tokenizer))
    policy.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    policy.save_pretrained(directory / "policy")
    tokenizer.save_pretrained(directory / "policy")

    torch.manual_seed(seed + 1)
    reward = Qwen2ForSequenceClassification(_model_config(tokenizer, num_labels=1))
    reward.save_pretrained(directory / "reward")
    tokenizer.save_pretrained(directory / "reward")

    prompts = _prompts(n_prompts + 8, seed=seed + 2)
    rng = random.Random(seed + 3)
    data_dir = directory / "data"
    splits = {"train": prompts[:n_prompts], "test": prompts[n_prompts:]}
    for split, rows in splits.items():
        (data_dir / "prompt_only").mkdir(parents=True, exist_ok=True)
        Dataset.from_dict({"prompt": rows}).to_parquet(str(data_dir / "prompt_only" / f"{split}.parquet"))
        pref = {
            "prompt": rows,
            "chosen": [" " + " ".join(rng.choice(_WORDS) for _ in range(4)) + "." for _ in rows],
            "rejected": [" " + rng.choice(_WORDS) for _ in rows],
        }
        (data_dir / "preference").mkdir(parents=True, exist_ok=True)
        Dataset.from_dict(pref).to_parquet(str(data_dir / "preference" / f"{split}.parquet"))

    manifest = {
        "version": FIXTURE_VERSION,
        "root": str(directory),
        "tokenizer": str(directory / "tokenizer"),
        "policy": str(directory / "policy"),
        "reward": str(directory / "reward"),
        "prompt_only": str(data_dir / "prompt_only"),
        "preference": str(data_dir / "preference"),
        "policy_numel": _numel(policy),
        "reward_numel": _numel(reward),
        "vocab_size": len(tokenizer),
        "n_train_prompts": n_prompts,
    }
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    tmp.replace(manifest_path)  # written last: a manifest means the directory is complete
    return manifest


def load_manifest(directory):
    return json.loads((Path(directory) / MANIFEST).read_text())


def load_policy(manifest):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(manifest["policy"])


def load_reward(manifest):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(manifest["reward"], num_labels=1)


def training_kwargs(out_dir, **extra):
    """The TrainingArguments every distributed worker shares (small batches, no saving, no reporting); ``extra``
    adds to them or overrides them."""
    shared = dict(
        output_dir=str(Path(out_dir) / "run"),
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=42,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return {**shared, **extra}


def load_prompt_dataset(manifest, split="train"):
    from datasets import load_dataset

    return load_dataset(manifest["prompt_only"], split=split)


def load_preference_dataset(manifest, split="train"):
    from datasets import load_dataset

    return load_dataset(manifest["preference"], split=split)


if __name__ == "__main__":
    import sys

    print(json.dumps(build_fixtures(sys.argv[1] if len(sys.argv) > 1 else "tiny-fixtures"), indent=2))


def on_policy_kwargs(common, *, total_episodes):
    """RLOO / PPO arguments of the workers: `common` (see `training_kwargs`) plus the smallest rollout settings."""
    return dict(
        common,
        total_episodes=total_episodes,
        num_ppo_epochs=1,
        num_mini_batches=1,
        response_length=8,
        local_rollout_forward_batch_size=2,
        num_sample_generations=0,
        missing_eos_penalty=1.0,
    )
