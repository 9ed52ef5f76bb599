"""Trains a tiny SFT model for one step and prints how many processes trained together (``test_launched_alone.py``)."""

import sys

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from trl import SFTConfig, SFTTrainer


if __name__ == "__main__":
    words = "the a cat dog sat ran on mat".split()
    vocab = {token: i for i, token in enumerate(["[PAD]", "[EOS]", "[UNK]"] + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]"
    )
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    trainer = SFTTrainer(
        model=Qwen2ForCausalLM(config),
        args=SFTConfig(
            sys.argv[1],
            max_length=8,
            max_steps=1,
            bf16=False,
            report_to="none",
            per_device_train_batch_size=2,
            save_strategy="no",
        ),
        train_dataset=Dataset.from_dict({"text": ["the cat sat on the mat", "a dog ran"] * 2}),
        processing_class=tokenizer,
    )
    trainer.train()
    print(  # noqa: T201 (the test reads it)
        f"[script] rank {trainer.accelerator.process_index} of {trainer.accelerator.num_processes} trained", flush=True
    )
