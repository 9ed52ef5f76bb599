"""`tools/tiny_model.py` (#39 item 5): run as a user runs it, then each artifact loaded as `trl grpo` and vLLM load it.

The tool runs once (module fixture) in a subprocess with HF_HUB_OFFLINE=1, into a temporary directory; each test
loads one artifact from it: the tokenizer (end of sequence and padding tokens, the chat template), the policy (a
head_dim that vLLM's CPU attention runs, generation), the reward model (one score per sequence of a padded batch),
the prompt dataset (`datasets.load_dataset(path)`), and the `trl grpo` arguments it prints (this line's parser takes
them).
"""

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[3]
TOOL = REPO / "tools" / "tiny_model.py"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(output directory as given, its absolute path, the tool's stdout): the tool run from a work directory."""
    work = tmp_path_factory.mktemp("tiny-model")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(work / "hf_home"))
    result = subprocess.run(
        [sys.executable, str(TOOL), "out"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return "out", work / "out", result.stdout


def test_it_writes_what_it_prints(made):
    given, out, stdout = made
    manifest = json.loads((out / "tiny_model.json").read_text())
    for name in ("policy", "reward", "prompts"):
        assert manifest[name] == str(out / name)
        assert f"{given}/{name}" in stdout
    [command] = [line.strip() for line in stdout.splitlines() if line.strip().startswith("trl grpo ")]
    printed = shlex.split(command)[2:]
    assert printed[printed.index("--model_name_or_path") + 1] == f"{given}/policy"  # paths as the user gave them
    assert [arg.replace(str(out), given) for arg in manifest["grpo_args"]] == printed


def test_tokenizer(made):
    from transformers import AutoTokenizer

    _, out, _ = made
    tokenizer = AutoTokenizer.from_pretrained(out / "policy")
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|pad|>")
    assert tokenizer.eos_token_id != tokenizer.pad_token_id and tokenizer.padding_side == "left"
    text = "Tell me a story about a brave comet."
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    unseen = "Zebras? 42 ünïcode"
    assert tokenizer.decode(tokenizer(unseen)["input_ids"]) == unseen  # any text: byte-level
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    reward_tokenizer = AutoTokenizer.from_pretrained(out / "reward")
    assert reward_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_policy(made):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, out, _ = made
    tokenizer = AutoTokenizer.from_pretrained(out / "policy")
    policy = AutoModelForCausalLM.from_pretrained(out / "policy")
    config = policy.config
    assert config.model_type == "qwen2" and config.num_hidden_layers == 2
    assert config.hidden_size // config.num_attention_heads >= 32  # vLLM's CPU attention: head_dim >= 32
    assert (config.eos_token_id, config.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert config.vocab_size == len(tokenizer)
    batch = tokenizer(
        ["Why is the cat so slow?", "Count the legs of a tiny old robot."], return_tensors="pt", padding=True
    )
    with torch.no_grad():
        generated = policy.generate(**batch, max_new_tokens=4, do_sample=False)
    assert generated.shape == (2, batch["input_ids"].shape[1] + 4)


def test_reward_model(made):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    _, out, _ = made
    tokenizer = AutoTokenizer.from_pretrained(out / "reward")
    reward = AutoModelForSequenceClassification.from_pretrained(out / "reward")
    assert reward.config.num_labels == 1 and reward.config.pad_token_id == tokenizer.pad_token_id
    batch = tokenizer(["A short one.", "A longer completion about a green river."], return_tensors="pt", padding=True)
    with torch.no_grad():
        scores = reward(**batch).logits
    assert scores.shape == (2, 1) and torch.isfinite(scores).all()


def test_prompt_dataset(made):
    from datasets import load_dataset

    _, out, _ = made
    dataset = load_dataset(str(out / "prompts"))
    assert list(dataset) == ["train"]
    train = dataset["train"]
    assert train.column_names == ["prompt"] and len(train) == 64
    assert len(set(train["prompt"])) == 64 and all(prompt.strip() for prompt in train["prompt"])


def test_the_printed_arguments_parse_as_trl_grpo(made):
    from trl.scripts.grpo import make_parser

    _, out, _ = made
    args = json.loads((out / "tiny_model.json").read_text())["grpo_args"]
    script_args, training_args, model_args, *_ = make_parser(prog="trl grpo").parse_args_and_config(args)
    assert model_args.model_name_or_path == str(out / "policy")
    assert script_args.reward_model_name_or_path == str(out / "reward")
    assert script_args.dataset_name == str(out / "prompts")
    assert training_args.bf16 is False and training_args.num_generations == 4


def test_bad_prompt_count_is_refused(capsys):
    spec = importlib.util.spec_from_file_location("tiny_model", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with pytest.raises(SystemExit) as exited:
        tool.main(["unused", "--num_prompts", "0"])
    assert exited.value.code == 2 and "--num_prompts: between 1 and" in capsys.readouterr().err
