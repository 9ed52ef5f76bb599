"""pytest plugin: run TRL 0.16.1's own test suite (the sdist's ``tests/``) offline.

Load it with ``-p upstream_offline`` (``lines/0.16.1/tests/upstream`` on ``sys.path``); ``tools/upstream_suite.py`` does.
At import it points the Hugging Face caches at a fresh temporary directory (or ``TRL_UPSTREAM_HUB_DIR``), and
at configure time it builds there, in a few seconds:

- an offline hub cache (``models--<org>--<name>/snapshots/<rev>/`` + ``refs/main``) holding a tiny model of
  every architecture the upstream tests load by hub id (``MODELS``), each with a BPE tokenizer trained on the
  spot and given the special tokens and a chat template of its family (``FAMILIES``). With
  ``HF_HUB_OFFLINE=1``, ``from_pretrained("trl-internal-testing/tiny-Qwen2ForCausalLM-2.5")`` resolves there.
- the ``trl-internal-testing/zen`` dataset: synthetic rows (17 train, 2 test, as on the hub) with each
  config's columns (``ZEN_CONFIGS``), as parquet files; ``datasets.load_dataset`` is wrapped so that this repo
  id (and only it) loads them, ``split=`` and ``streaming=`` included.

Tests that need something this machine cannot have (GPU, vLLM, bitsandbytes, liger, wandb, ...) skip through
upstream's own decorators. Tests that cannot run offline for another reason are skipped here, with the reason,
from ``OFFLINE_SKIPS`` (the one place that lists them).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path


REVISION = "0" * 39 + "1"  # the snapshot "commit" every mapped repo resolves to

# ------------------------------------------------------------------------------------------- environment first
# huggingface_hub, transformers and datasets read these when first imported: set them before anything does.
# TRL_UPSTREAM_HUB_DIR: a directory to build into, or a complete one to reuse (the runner builds it once for both
# trees); what the tests write (HF_HOME, the datasets cache) always goes to a directory of this process.
_OWN_DIR = os.environ.get("TRL_UPSTREAM_HUB_DIR")
HUB_ROOT = Path(_OWN_DIR) if _OWN_DIR else Path(tempfile.mkdtemp(prefix="trl-upstream-hub-"))
SCRATCH = Path(tempfile.mkdtemp(prefix="trl-upstream-scratch-"))
for _key, _value in {
    "HF_HOME": str(SCRATCH / "home"),
    "HF_HUB_CACHE": str(HUB_ROOT / "hub"),
    "HF_DATASETS_CACHE": str(SCRATCH / "datasets-cache"),
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_DISABLED": "true",
}.items():
    os.environ[_key] = _value

# Processes the tests start (the `trl` CLI runs its scripts through `accelerate launch`) import _site's
# sitecustomize, which maps the zen dataset in them too.
SITE_DIR = Path(__file__).resolve().parent / "_site"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE_DIR), os.environ.get("PYTHONPATH")]))
if str(SITE_DIR) not in sys.path:
    sys.path.insert(0, str(SITE_DIR))

import pytest  # noqa: E402
import upstream_zen  # noqa: E402
from upstream_zen import ZEN_CONFIGS  # noqa: E402


# Tests that cannot run offline for a reason other than a missing GPU / optional package (those skip through
# upstream's decorators). Keys are node-id suffixes: "file.py::Class::test" or "file.py::Class" or "file.py".
_REAL_QWEN_IDS = "asserts token ids of the real Qwen2.5 tokenizer (e.g. 46518); the tiny tokenizer here has its own"
OFFLINE_SKIPS: dict[str, str] = {
    "test_dataset_formatting.py::DatasetFormattingTestCase::test_get_formatting_func_from_dataset_from_hub": (
        "loads three real datasets (philschmid/trl-test-instruction, dolly-15k-oai-style, guanaco-sharegpt-style) "
        "from the hub; their formats are what the test checks, so a synthetic stand-in would test nothing"
    ),
    "test_kto_trainer.py::KTOTrainerTester::test_tokenize_and_process_tokens": _REAL_QWEN_IDS,
    "test_bco_trainer.py::BCOTrainerTester::test_tokenize_and_process_tokens": _REAL_QWEN_IDS,
}


# --------------------------------------------------------------------------------------------- tokenizers
SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|finetune_right_pad_id|>",
    "<s>",
    "</s>",
    "<unk>",
    "<pad>",
    "<bos>",
    "<eos>",
    "<start_of_turn>",
    "<end_of_turn>",
)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}"
    "{% if tools %}{{ '<|start_header_id|>system<|end_header_id|>\n\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}{{ '<|eot_id|>' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
INST = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
GEMMA = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# family -> special tokens of the tokenizer (None = absent) and chat template, after the real tokenizers of the
# models the upstream tiny checkpoints were made from (Qwen2.5: eos <|im_end|>, pad <|endoftext|>, no bos; ...).
FAMILIES: dict[str, dict] = {
    "qwen": dict(bos=None, eos="<|im_end|>", pad="<|endoftext|>", unk=None, template=CHATML),
    "llama3": dict(bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, unk=None, template=LLAMA3),
    "mistral": dict(bos="<s>", eos="</s>", pad=None, unk="<unk>", template=INST),
    "gemma": dict(bos="<bos>", eos="<eos>", pad="<pad>", unk="<unk>", template=GEMMA),
    "gpt2": dict(bos="<|endoftext|>", eos="<|endoftext|>", pad=None, unk="<|endoftext|>", template=CHATML),
    "t5": dict(bos=None, eos="</s>", pad="<pad>", unk="<unk>", template=CHATML),
    "bart": dict(bos="<s>", eos="</s>", pad="<pad>", unk="<unk>", template=CHATML),
}

_WORDS = (
    "small large quick slow plain clear dark bright warm cold old new first last good bad simple complex flat "
    "nested sparse dense code rule idea way time tree river stone cloud rain sun moon star apple bread water "
    "fire wind road house door window is are was be better than worse never always now often should must may "
    "the a an of to in on for with and or not what which where when how why who hello world you me we it "
    "user assistant system answer question please tell about"
).split()


def _sentences(n: int, seed: int, low: int = 3, high: int = 8) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high))) for _ in range(n)]


def _train_bpe(vocab_size: int = 448):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _sentences(600, seed=1) + [" ".join(_WORDS)] * 4 + ["Hello, how are you? What's the weather?"] * 4
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def make_tokenizer(bpe, family: str, padding_side: str = "right"):
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["pad"],
        unk_token=spec["unk"],
        padding_side=padding_side,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],  # as the real tokenizers: no token_type_ids
    )
    tokenizer.chat_template = spec["template"]
    return tokenizer


# --------------------------------------------------------------------------------------------------- models
# The tiny sizes: every architecture gets 2 layers of width 16 (4 heads of 4) unless it needs otherwise.
H, LAYERS, HEADS, KV, FFN, POS = 16, 2, 4, 2, 32, 512

_DECODER = dict(
    hidden_size=H,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV,
    intermediate_size=FFN,
    max_position_embeddings=POS,
)


def _config_kwargs(arch: str) -> dict:
    if arch.startswith(("Qwen2", "Llama", "Mistral", "Phi3", "Cohere")):
        extra = {"use_sliding_window": False} if arch.startswith("Qwen2") else {}
        if arch.startswith(("Mistral", "Phi3")):
            extra = {"sliding_window": None}
        return dict(_DECODER, tie_word_embeddings=False, **extra)
    if arch.startswith("Gemma"):
        return dict(_DECODER, head_dim=H // HEADS)
    if arch.startswith("GPT2"):
        return dict(n_embd=H, n_layer=LAYERS, n_head=HEADS, n_positions=POS, n_inner=FFN)
    if arch.startswith("GPTNeoX"):
        return dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN)
    if arch.startswith("Bloom"):
        return dict(hidden_size=H, n_layer=LAYERS, n_head=HEADS)
    if arch.startswith("OPT"):
        return dict(
            hidden_size=H,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            ffn_dim=FFN,
            word_embed_proj_dim=H,
            max_position_embeddings=POS,
        )
    if arch.startswith("FalconMamba"):
        return dict(hidden_size=H, num_hidden_layers=LAYERS, state_size=4, intermediate_size=FFN, time_step_rank=4)
    if arch.startswith("Dbrx"):
        return dict(
            d_model=H,
            n_heads=HEADS,
            n_layers=LAYERS,
            max_seq_len=POS,
            attn_config={"kv_n_heads": KV},
            ffn_config={"ffn_hidden_size": FFN, "moe_num_experts": 2, "moe_top_k": 1},
        )
    if arch.startswith("T5"):
        return dict(
            d_model=H, d_kv=H // HEADS, d_ff=FFN, num_layers=LAYERS, num_decoder_layers=LAYERS, num_heads=HEADS
        )
    if arch.startswith("Bart"):
        return dict(
            d_model=H,
            encoder_layers=LAYERS,
            decoder_layers=LAYERS,
            encoder_attention_heads=HEADS,
            decoder_attention_heads=HEADS,
            encoder_ffn_dim=FFN,
            decoder_ffn_dim=FFN,
            max_position_embeddings=POS,
        )
    raise ValueError(f"no tiny config for {arch}")


# hub id -> (model class in transformers, tokenizer family, extra config kwargs)
MODELS: dict[str, tuple[str, str, dict]] = {
    "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5": ("Qwen2ForCausalLM", "qwen", {}),
    "trl-internal-testing/small-Qwen2ForCausalLM-2.5": ("Qwen2ForCausalLM", "qwen", {}),
    "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5": (
        "Qwen2ForSequenceClassification",
        "qwen",
        {"num_labels": 1},
    ),
    "trl-internal-testing/tiny-LlamaForCausalLM-3": ("LlamaForCausalLM", "llama3", {}),
    "trl-internal-testing/tiny-LlamaForCausalLM-3.1": ("LlamaForCausalLM", "llama3", {}),
    "trl-internal-testing/tiny-LlamaForCausalLM-3.2": ("LlamaForCausalLM", "llama3", {}),
    "trl-internal-testing/tiny-LlamaForSequenceClassification-3.2": (
        "LlamaForSequenceClassification",
        "llama3",
        {"num_labels": 1},
    ),
    "trl-internal-testing/tiny-MistralForCausalLM-0.1": ("MistralForCausalLM", "mistral", {}),
    "trl-internal-testing/tiny-MistralForCausalLM-0.2": ("MistralForCausalLM", "mistral", {}),
    "trl-internal-testing/tiny-Phi3ForCausalLM": ("Phi3ForCausalLM", "mistral", {}),
    "trl-internal-testing/tiny-CohereForCausalLM": ("CohereForCausalLM", "llama3", {}),
    "trl-internal-testing/tiny-GemmaForCausalLM": ("GemmaForCausalLM", "gemma", {}),
    "trl-internal-testing/tiny-Gemma2ForCausalLM": ("Gemma2ForCausalLM", "gemma", {}),
    "trl-internal-testing/tiny-GPT2LMHeadModel": ("GPT2LMHeadModel", "gpt2", {}),
    "trl-internal-testing/tiny-GPTNeoXForCausalLM": ("GPTNeoXForCausalLM", "gpt2", {}),
    "trl-internal-testing/tiny-BloomForCausalLM": ("BloomForCausalLM", "gpt2", {}),
    "trl-internal-testing/tiny-OPTForCausalLM": ("OPTForCausalLM", "gpt2", {}),
    "trl-internal-testing/tiny-FalconMambaForCausalLM": ("FalconMambaForCausalLM", "gpt2", {}),
    "trl-internal-testing/tiny-DbrxForCausalLM": ("DbrxForCausalLM", "gpt2", {}),
    "trl-internal-testing/tiny-T5ForConditionalGeneration": ("T5ForConditionalGeneration", "t5", {}),
    "trl-internal-testing/tiny-BartModel": ("BartModel", "bart", {}),
}


def _snapshot_dir(hub_cache: Path, repo_id: str, kind: str = "models") -> Path:
    repo_dir = hub_cache / f"{kind}--{repo_id.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(REVISION)
    snapshot = repo_dir / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def build_models(hub_cache: Path, bpe) -> list[str]:
    import torch
    import transformers
    from transformers import GenerationConfig

    built = []
    for index, (repo_id, (arch, family, extra)) in enumerate(MODELS.items()):
        tokenizer = make_tokenizer(bpe, family)
        ids = {
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        }
        model_class = getattr(transformers, arch)
        # room for tokens the tests add (e.g. a "[PAD]") and for the random ids some tests feed (up to 1000), as
        # the real checkpoints' large vocabularies have
        vocab_size = max(1024, (len(tokenizer) + 64) // 64 * 64)
        kwargs = dict(_config_kwargs(arch), vocab_size=vocab_size, **ids, **extra)
        if arch.startswith(("T5", "Bart")):
            kwargs["decoder_start_token_id"] = tokenizer.pad_token_id
        config = model_class.config_class(**kwargs)
        config.architectures = [arch]
        torch.manual_seed(index)
        model = model_class(config)
        snapshot = _snapshot_dir(hub_cache, repo_id)
        model.save_pretrained(snapshot)
        if model.can_generate():
            generation = {k: v for k, v in ids.items() if v is not None}
            if config.is_encoder_decoder:
                generation["decoder_start_token_id"] = config.decoder_start_token_id
            GenerationConfig(**generation).save_pretrained(snapshot)
        tokenizer.save_pretrained(snapshot)
        built.append(repo_id)
    return built


# ---------------------------------------------------------------------------------------------- zen dataset
N_ROWS, N_TEST = 19, 2  # as trl-internal-testing/zen: 17 train rows, 2 test rows per config


def _zen_rows(config: str) -> dict[str, list]:
    prompts = [f"Line {i}: {s}" for i, s in enumerate(_sentences(N_ROWS, seed=11))]
    good = [" " + s + "." for s in _sentences(N_ROWS, 12, 1, 5)]
    bad = [" " + s + "!" for s in _sentences(N_ROWS, 13, 1, 5)]
    labels = [i % 3 != 1 for i in range(N_ROWS)]

    def user(text):
        return [{"role": "user", "content": text.strip()}]

    def assistant(text):
        return [{"role": "assistant", "content": text.strip()}]

    if config == "standard_language_modeling":
        return {"text": [p + c for p, c in zip(prompts, good)]}
    if config == "standard_prompt_only":
        return {"prompt": prompts}
    if config == "standard_prompt_completion":
        return {"prompt": prompts, "completion": good}
    if config == "standard_preference":
        return {"prompt": prompts, "chosen": good, "rejected": bad}
    if config == "standard_implicit_prompt_preference":
        return {"chosen": [p + c for p, c in zip(prompts, good)], "rejected": [p + r for p, r in zip(prompts, bad)]}
    if config == "standard_unpaired_preference":
        return {
            "prompt": prompts,
            "completion": [g if ok else b for g, b, ok in zip(good, bad, labels)],
            "label": labels,
        }
    if config == "standard_stepwise_supervision":
        rng = random.Random(14)
        steps = [[" " + s for s in _sentences(1 + i % 3, 100 + i, 1, 4)] for i in range(N_ROWS)]
        return {"prompt": prompts, "completions": steps, "labels": [[rng.random() < 0.6 for _ in s] for s in steps]}
    if config == "conversational_language_modeling":
        return {"messages": [user(p) + assistant(c) for p, c in zip(prompts, good)]}
    if config == "conversational_prompt_only":
        return {"prompt": [user(p) for p in prompts]}
    if config == "conversational_prompt_completion":
        return {"prompt": [user(p) for p in prompts], "completion": [assistant(c) for c in good]}
    if config == "conversational_preference":
        return {
            "prompt": [user(p) for p in prompts],
            "chosen": [assistant(c) for c in good],
            "rejected": [assistant(r) for r in bad],
        }
    if config == "conversational_implicit_prompt_preference":
        return {
            "chosen": [user(p) + assistant(c) for p, c in zip(prompts, good)],
            "rejected": [user(p) + assistant(r) for p, r in zip(prompts, bad)],
        }
    if config == "conversational_unpaired_preference":
        return {
            "prompt": [user(p) for p in prompts],
            "completion": [assistant(g if ok else b) for g, b, ok in zip(good, bad, labels)],
            "label": labels,
        }
    raise ValueError(config)


def build_zen(root: Path) -> Path:
    from datasets import Dataset

    for config in ZEN_CONFIGS:
        rows = _zen_rows(config)
        (root / config).mkdir(parents=True, exist_ok=True)
        full = Dataset.from_dict(rows)
        full.select(range(N_ROWS - N_TEST)).to_parquet(str(root / config / "train.parquet"))
        full.select(range(N_ROWS - N_TEST, N_ROWS)).to_parquet(str(root / config / "test.parquet"))
    return root


# ----------------------------------------------------------------------------------------------- build + hooks
def build(root: Path = HUB_ROOT) -> dict:
    """Build (or reuse, when ``root/manifest.json`` exists) the offline hub cache and the zen dataset."""
    manifest_path = root / "manifest.json"
    if manifest_path.is_file():
        return json.loads(manifest_path.read_text())
    start = time.monotonic()
    import datasets

    datasets.disable_progress_bars()
    bpe = _train_bpe()
    models = build_models(root / "hub", bpe)
    zen = build_zen(root / "zen")
    manifest = {"models": models, "zen": str(zen), "configs": list(ZEN_CONFIGS), "seconds": time.monotonic() - start}
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return manifest


_MANIFEST: dict = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "upstream_offline_skip(reason): skipped by the upstream_offline plugin")
    _MANIFEST.update(build(HUB_ROOT))
    os.environ["TRL_UPSTREAM_ZEN_DIR"] = _MANIFEST["zen"]  # for the processes the tests start (`trl dpo`, ...)
    upstream_zen.install(_MANIFEST["zen"])


def pytest_report_header(config):
    return (
        f"upstream_offline: {len(_MANIFEST.get('models', []))} tiny models + zen ({len(ZEN_CONFIGS)} configs) "
        f"under {HUB_ROOT} (built in {_MANIFEST.get('seconds', 0):.1f} s)"
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.nodeid.replace("\\", "/").rsplit("/", 1)[-1]  # "file.py::Class::test[param]"
        for key, reason in OFFLINE_SKIPS.items():
            if name == key or name.startswith((key + "::", key + "[")):
                item.add_marker(pytest.mark.skip(reason=f"upstream_offline: {reason}"))
                break


def pytest_unconfigure(config):
    shutil.rmtree(SCRATCH, ignore_errors=True)
    if not _OWN_DIR:
        shutil.rmtree(HUB_ROOT, ignore_errors=True)
