"""One launch per backend for the 1.16.0 line's matrix: every trainer in turn, 2 optimizer steps each.

Launched by ``matrix116.py`` next to this file (``accelerate launch --num_processes 2``, CPU ranks over gloo, with the
harness shims of ``tests/harness/accelerate110.py``).  Trainers (``TRAINERS``): GRPO (reward model + reward function,
``beta > 0``), RLOO (reward model, ``beta > 0``), Online DPO (``trl.experimental.online_dpo``, reward model), GKD
(``trl.experimental.gkd``, teacher), DPO and KTO (reference model), GRPO with a LoRA adapter (reward model; its
reference is the policy with the adapter disabled) and Online DPO with a LoRA adapter generating through a vLLM server
(``online_dpo_lora``: the server is a stand-in client on the main process, ``StandInVLLMClient``, that records the
weights each sync sends).

Each trainer runs in a ``try``: a failure records its first error line and the next trainer starts.  Between two
trainers the accelerator state is reset (``AcceleratorState._reset_state``, private accelerate API, test-only; the
process group is kept).  Per trainer and rank it writes ``<out>/<trainer>/rank<R>.json`` (rewritten at each stage,
so a crash or a hang leaves what was gathered so far):

- ``stage``: ``start`` -> ``initialized`` -> ``training`` -> ``trained`` (``...-failed`` with ``error`` and
  ``error_line`` on an exception);
- ``accelerator``: distributed type, device, number of processes; ``policy``: the trained model's wrappers when
  training begins (and, with LoRA, how many parameters are trainable);
- ``frozen``: for each frozen model (``ref_model``, ``reward_model``, ``teacher_model``) what this rank holds
  (``harness.facts.describe_model``: devices, local parameter count, train mode, requires_grad);
- ``prompts``: the token ids this rank generated from (generating trainers) or trained on (DPO, KTO), padding removed;
- ``global_step`` and ``log_history`` after training;
- ``online_dpo_lora``: ``vllm``, what reached the stand-in server (the calls in order; the first sync compared with the
  checkpoint's weights with the adapter merged, computed here from the checkpoint file and the adapter's values; the
  second against the checkpoint and the first), and ``base_after``, the policy's base weights after training, gathered
  whole on every rank, against the checkpoint.
"""

import argparse
import contextlib
import gc
import json
import math
import os
import sys
import time
import traceback
import zlib
from pathlib import Path
from unittest import mock


REPO_ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO_ROOT / "tests"))  # import harness

TRAINERS = ("grpo", "rloo", "online_dpo", "gkd", "dpo", "kto", "grpo_lora", "online_dpo_lora")
FROZEN_NAMES = ("ref_model", "reward_model", "teacher_model")
COLLECTIVE_TIMEOUT_S = 90  # gloo collectives give up after this: a rank left alone in one fails instead of hanging


class Recorder:
    def __init__(self, out_dir, trainer, **base):
        self.rank = int(os.environ.get("RANK", "0"))
        self.path = Path(out_dir) / trainer / f"rank{self.rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.data = dict(base, trainer=trainer, rank=self.rank, world_size=int(os.environ.get("WORLD_SIZE", "1")))
        self.data.update(stage="start", started=time.time(), prompts=[], policy=None, error=None, error_line=None)
        self.flush()

    def flush(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


CURRENT = {"rec": None, "pad": None}  # the recorder of the trainer being run (read by the generate hook)


def _strip(rows, masks, pad):
    out = []
    for i, row in enumerate(rows):
        keep = masks[i] if masks is not None else [int(t != pad) for t in row]
        out.append([t for t, m in zip(row, keep) if m])
    return out


def _install_generate_recorder():
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate

    def generate(self, *args, **kwargs):
        rec = CURRENT["rec"]
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        if rec is not None and input_ids is not None:
            rows = input_ids.tolist()
            rec.data["prompts"] += _strip(rows, mask.tolist() if mask is not None else None, CURRENT["pad"])
        return original(self, *args, **kwargs)

    GenerationMixin.generate = generate


def _record_training_inputs(trainer, rec, pad):
    """DPO / KTO generate nothing: record the token ids of each batch they train on instead."""
    original = trainer.training_step

    def training_step(model, inputs, *args, **kwargs):
        for key in ("prompt_ids", "prompt_input_ids", "input_ids", "completion_input_ids"):
            value = inputs.get(key) if isinstance(inputs, dict) else None
            if value is not None and hasattr(value, "tolist"):
                rec.data["prompts"] += _strip(value.tolist(), None, pad)
                break
        return original(model, inputs, *args, **kwargs)

    trainer.training_step = training_step


def _record_server_prompts(trainer, rec, pad):
    """Generation goes through the server (the main process generates for every rank): record the prompt ids each
    rank generates from, as Online DPO tokenizes them on its rank."""
    original = trainer._generate_vllm_server

    def generate(*args, **kwargs):
        completion_ids, prompt_ids = original(*args, **kwargs)
        rec.data["prompts"] += _strip(prompt_ids[: len(prompt_ids) // 2], None, pad)  # 2 copies of each prompt
        return completion_ids, prompt_ids

    trainer._generate_vllm_server = generate


def _vllm_facts(checkpoint, expected):
    """What reached the stand-in server on this rank: the calls; the first sync against ``expected``; the second one
    against the checkpoint (weights without an adapter: bit for bit) and the first (weights with one: changed by the
    step in between)."""
    clients = StandInVLLMClient.instances
    facts = {"clients": len(clients), "calls": [call for client in clients for call in client.calls]}
    facts["generated"] = [entry for client in clients for entry in client.generated]
    syncs = [sync for client in clients for sync in client.syncs]
    facts["syncs"] = len(syncs)
    if syncs:
        facts["first_sync"] = _compare_sync(syncs[0], expected)
    if len(syncs) > 1:
        first, second = syncs[:2]
        targeted = {name for name in expected if not torch_equal(expected[name], checkpoint[name])}
        facts["second_sync"] = {
            "names_differ": sorted(set(first) ^ set(second)),
            "untargeted_changed": sorted(
                n for n in set(second) - targeted if n in checkpoint and not torch_equal(second[n], checkpoint[n])
            ),
            "targeted_unchanged": sorted(
                n for n in targeted if n in first and n in second and torch_equal(first[n], second[n])
            ),
        }
    return facts


def torch_equal(a, b):
    import torch

    return a.shape == b.shape and torch.equal(a, b)


def _gathered_policy(trainer):
    """(the module whose parameters are the policy's, a context in which they are whole on every rank): ZeRO-3 gathers
    them, FSDP1 summons them through the root unit (it holds the embeddings and the head), FSDP2 parameters are
    DTensors (``full_tensor()``). Collective under ZeRO-3 and FSDP1."""
    backend = os.environ.get("TRL_MATRIX_BACKEND")
    if backend == "zero3":
        import deepspeed

        return trainer.model, deepspeed.zero.GatheredParameters(list(trainer.model.parameters()))
    if backend == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return trainer.model_wrapped, FSDP.summon_full_params(trainer.model_wrapped, writeback=False)
    return trainer.model, contextlib.nullcontext()


def _base_weights_after_training(trainer, checkpoint):
    """Every rank: the policy's base weights, gathered whole, against the checkpoint (frozen under LoRA, and the syncs
    merge into copies: bit-identical). Collective under ZeRO-3 and FSDP."""
    import torch

    owner, gathered = _gathered_policy(trainer)
    seen, changed = set(), []
    with gathered, torch.no_grad():
        for name, param in owner.named_parameters():
            name = name.replace("_fsdp_wrapped_module.", "").removeprefix("base_model.model.")
            name = name.replace(".base_layer", "")
            if "lora_" in name:
                continue
            tensor = param.full_tensor() if hasattr(param, "full_tensor") else param
            seen.add(name)
            if name not in checkpoint or not torch_equal(tensor.detach().cpu(), checkpoint[name]):
                changed.append(name)
    return {"compared": len(seen), "changed": sorted(changed), "missing": sorted(set(checkpoint) - seen)}


def _trained_policy(trainer):
    """Every rank: the trained policy's parameters, gathered whole (collective under ZeRO-3 and FSDP), under the names
    ``save_model`` writes them: the model's own names, or with LoRA the adapter's (``lora_A.weight``, no adapter name,
    as PEFT saves them). Read independently of ``save_model``: what the saved folder must hold."""
    import torch

    owner, gathered = _gathered_policy(trainer)
    is_peft = hasattr(trainer.model, "peft_config")
    out = {}
    with gathered, torch.no_grad():
        for name, param in owner.named_parameters():
            name = name.replace("_fsdp_wrapped_module.", "")
            if is_peft:
                if "lora_" not in name:
                    continue
                name = name.replace(".default.", ".")
            tensor = param.full_tensor() if hasattr(param, "full_tensor") else param
            out[name] = tensor.detach().cpu().clone().contiguous()
    return out


def _save_model(trainer, trainer_dir, rec):
    """``trainer.save_model(<trainer_dir>/final)`` on every rank, as the ``trl`` scripts end, next to the trained
    policy gathered independently (``<trainer_dir>/expected.safetensors``, main process): ``check_saves`` compares
    them. A failure of the save is recorded apart (the training's own outcome stays the cell's)."""
    from safetensors.torch import save_file

    if os.environ.get("TRL_MATRIX_BACKEND") == "fsdp1":
        # The full state dict of FSDP1 (FullStateDictConfig(offload_to_cpu=True), what FULL_STATE_DICT and the fork's
        # save both use) kills the process with a segfault inside torch when the model is on the CPU: not here
        rec.data["save_skipped"] = "FSDP1's full state dict with offload_to_cpu segfaults on CPU ranks (torch)"
        return
    expected = _trained_policy(trainer)
    final = Path(trainer_dir) / "final"
    try:
        trainer.save_model(str(final))
    except Exception as exc:
        rec.data["save_error"] = _first_error_line(exc)
        return
    if rec.rank == 0:
        save_file(expected, str(Path(trainer_dir) / "expected.safetensors"))
    rec.data["saved_to"] = str(final)


def _trl_info():
    import trl

    try:
        from trl import _fork_info

        fixed = sorted(_fork_info.FIXED_ISSUES)
    except ImportError:
        fixed = []
    return {"file": trl.__file__, "version": trl.__version__, "fixed_issues": fixed}


def _jsonable_logs(log_history):
    return [
        {k: (v if not isinstance(v, float) or math.isfinite(v) else repr(v)) for k, v in entry.items()}
        for entry in log_history
    ]


def _first_error_line(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


class StandInVLLMClient:
    """Stands in for ``trl.generation.vllm_client.VLLMClient`` (vLLM cannot run on CPU): records the calls a server
    would get and the weights each sync streams; generates 3 fixed tokens per completion."""

    instances = []

    def __init__(self, **kwargs):
        self.calls, self.syncs, self.generated = [], [], []
        StandInVLLMClient.instances.append(self)

    def init_communicator(self, device):
        self.calls.append("init_communicator")

    def weight_update(self):
        self.calls.append("weight_update")
        return contextlib.nullcontext()

    def update_named_params(self, metadata, named_params):
        # A server allocates what the metadata announces, then fills it from the stream in that order
        received = {name: tensor.detach().to("cpu", copy=True) for name, tensor in named_params}
        announced = [(name, str(dtype).removeprefix("torch."), list(shape)) for name, dtype, shape in metadata]
        streamed = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in received.items()]
        if announced != streamed:
            raise AssertionError(f"the stream differs from its announcement: {announced[:2]} vs {streamed[:2]}")
        self.calls.append("update_named_params")
        self.syncs.append(received)

    def update_named_param(self, name, weights):  # one request per tensor (pristine Online DPO)
        if not self.calls or self.calls[-1] != "update_named_param":  # the first tensor of a sync
            self.syncs.append({})
        self.calls.append("update_named_param")
        self.syncs[-1][name] = weights.detach().to("cpu", copy=True)

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def generate(self, prompts, n=1, **kwargs):
        self.calls.append("generate")
        self.generated.append((len(prompts), n))
        # The completions of a prompt differ (identical pairs would give Online DPO no gradient)
        return {"completion_ids": [[5 + k % n, 6 + (k // n) % 3, 7] for k in range(len(prompts) * n)]}


class _SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


@contextlib.contextmanager
def _vllm_server_stand_in():
    """``VLLMClient`` replaced by ``StandInVLLMClient`` where Online DPO and ``VLLMGeneration`` look it up (and vLLM
    reported available, ``SamplingParams`` stubbed, the CPU taken for the current accelerator), for one trainer."""
    import torch

    import trl.experimental.online_dpo.online_dpo_trainer as online_dpo_trainer
    import trl.generation.vllm_generation as vllm_generation

    StandInVLLMClient.instances.clear()
    with contextlib.ExitStack() as stack:
        for module in (online_dpo_trainer, vllm_generation):
            stack.enter_context(mock.patch.object(module, "VLLMClient", StandInVLLMClient, create=True))
            stack.enter_context(mock.patch.object(module, "is_vllm_available", lambda *a, **k: True, create=True))
        stack.enter_context(mock.patch.object(online_dpo_trainer, "SamplingParams", _SamplingParams, create=True))
        cpu = lambda *args, **kwargs: torch.device("cpu")  # noqa: E731
        stack.enter_context(mock.patch.object(torch.accelerator, "current_accelerator", cpu))
        stack.callback(StandInVLLMClient.instances.clear)  # the copies of every sync go with the trainer
        yield


LORA_SCALE = 2.0  # lora_alpha / r of the LoRA cells that merge


def _lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=4 * LORA_SCALE, target_modules=["q_proj", "v_proj", "down_proj"])


def _set_adapters(model, checkpoint_dir):
    """Gives the LoRA adapter of the trainer's (not yet wrapped) PEFT ``model`` values seeded per name, the same on
    every rank (a fresh adapter's B is zero: a sync that merged nothing would pass); returns the checkpoint's weights
    and those a sync must send (the checkpoint's with the adapter merged)."""
    import torch
    from safetensors.torch import load_file

    checkpoint = load_file(str(Path(checkpoint_dir) / "model.safetensors"))
    adapters = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                if param.numel() == 0 or hasattr(param, "ds_id"):
                    raise RuntimeError(f"{name} is already sharded: the adapter must be set before wrapping")
                generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                adapters[name] = torch.randn(param.shape, generator=generator) * 0.1
                param.copy_(adapters[name])
    expected = dict(checkpoint)
    for name, a in adapters.items():
        if ".lora_A." in name:
            b = adapters[name.replace(".lora_A.", ".lora_B.")]
            base = name.removeprefix("base_model.model.").split(".lora_A.")[0] + ".weight"
            delta = LORA_SCALE * (b @ a)
            if not delta.abs().max() > 1e-3:
                raise RuntimeError(f"the adapter of {base} barely changes it: a sync that merged nothing would pass")
            expected[base] = checkpoint[base] + delta
    if not adapters or len(expected) != len(checkpoint):
        raise RuntimeError(f"no LoRA adapter to set, or names that are not the checkpoint's: {sorted(adapters)[:4]}")
    return checkpoint, expected


def _compare_sync(received, expected):
    """What a sync sent against the expected weights: names missing or extra, the largest difference."""
    worst, where = 0.0, None
    for name in sorted(set(received) & set(expected)):
        if received[name].shape != expected[name].shape:
            diff = float("inf")
        else:
            diff = (received[name].float() - expected[name].float()).abs().max().item()
        if where is None or diff > worst:
            worst, where = diff, name
    return {
        "missing": sorted(set(expected) - set(received)),
        "extra": sorted(set(received) - set(expected)),
        "max_abs_diff": worst,
        "worst": where,
    }


def build_trainer(kind, manifest, out_dir, steps, rec):
    import torch
    from datasets import load_dataset
    from harness import fixtures
    from harness.facts import describe_model, wrapper_chain
    from transformers import AutoTokenizer, TrainerCallback

    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = AutoTokenizer.from_pretrained(manifest["policy"])
    # TRL 1.x defaults to bf16=True; CPU ranks run in float32
    common = fixtures.training_kwargs(
        Path(out_dir) / kind, bf16=False, fp16=False, max_steps=steps, ddp_timeout=COLLECTIVE_TIMEOUT_S
    )

    class Facts(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            trainer = rec.trainer
            model = getattr(trainer, "model_wrapped", None) or trainer.model
            policy = {"wrappers": wrapper_chain(model), "n_gpu": args.n_gpu}
            # ZeRO-3 partitions parameters (numel() 0 outside a gather): count their full size (ds_numel)
            sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in trainer.model.parameters()]
            policy["numel"] = sum(n for n, _ in sizes)
            policy["trainable_numel"] = sum(n for n, trainable in sizes if trainable)
            policy["is_peft"] = hasattr(trainer.model, "peft_config")
            rec.data["policy"] = policy
            rec.data["stage"] = "training"
            rec.flush()

    def policy():
        return fixtures.load_policy(manifest)

    def reward():
        return fixtures.load_reward(manifest)

    def teacher():
        """The policy's architecture with other random weights: a teacher identical to the student gives a zero loss."""
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(1)  # the same teacher on every rank
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(manifest["policy"]))
        return model.eval()  # as from_pretrained returns it (GKD sets eval mode only in compute_loss)

    def length_reward(completions, **kwargs):
        return [float(len(c)) / 10.0 for c in completions]

    prompts = load_dataset(manifest["prompt_only"], split="train")
    preference = load_dataset(manifest["preference"], split="train")
    generation = dict(num_generations=2, max_completion_length=8, temperature=1.0, beta=0.04)

    if kind in ("grpo", "grpo_lora"):
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(**common, **generation)
        peft = {}
        if kind == "grpo_lora":
            from peft import LoraConfig

            peft["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        trainer = GRPOTrainer(
            model=policy(),
            reward_funcs=[reward(), length_reward],
            args=args,
            train_dataset=prompts,
            processing_class=tokenizer,
            reward_processing_classes=[tokenizer, None],
            callbacks=[Facts()],
            **peft,
        )
        frozen = {"ref_model": trainer.ref_model, "reward_model": trainer.reward_funcs[0]}
    elif kind == "rloo":
        from trl import RLOOConfig, RLOOTrainer

        args = RLOOConfig(**common, **generation)
        trainer = RLOOTrainer(
            model=policy(),
            reward_funcs=[reward(), length_reward],
            args=args,
            train_dataset=prompts,
            processing_class=tokenizer,
            reward_processing_classes=[tokenizer, None],
            callbacks=[Facts()],
        )
        frozen = {"ref_model": trainer.ref_model, "reward_model": trainer.reward_funcs[0]}
    elif kind in ("online_dpo", "online_dpo_lora"):
        from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

        lora = kind == "online_dpo_lora"  # with a LoRA adapter, generating through the (stand-in) vLLM server
        server = dict(use_vllm=True, vllm_mode="server") if lora else {}
        args = OnlineDPOConfig(**common, max_new_tokens=8, max_length=64, beta=0.1, **server)
        trainer = OnlineDPOTrainer(
            model=policy(),
            reward_funcs=[reward()],
            reward_processing_classes=[tokenizer],
            args=args,
            train_dataset=prompts,
            processing_class=tokenizer,
            callbacks=[Facts()],
            peft_config=_lora_config() if lora else None,
        )
        frozen = {"ref_model": trainer.ref_model, "reward_model": trainer.reward_funcs[0]}
        if lora:
            rec.checkpoint, rec.expected_sync = _set_adapters(trainer.model, manifest["policy"])  # not wrapped yet
            _record_server_prompts(trainer, rec, tokenizer.pad_token_id)
    elif kind == "gkd":
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        messages = preference.map(
            lambda row: {
                "messages": [
                    {"role": "user", "content": row["prompt"]},
                    {"role": "assistant", "content": row["chosen"]},
                ]
            },
            remove_columns=preference.column_names,
        )
        # lmbda=1: every step generates on-policy (so the teacher scores generated completions)
        args = GKDConfig(**common, max_new_tokens=8, max_length=64, lmbda=1.0, temperature=1.0)
        trainer = GKDTrainer(
            model=policy(),
            teacher_model=teacher(),
            args=args,
            train_dataset=messages,
            processing_class=tokenizer,
            callbacks=[Facts()],
        )
        frozen = {"teacher_model": trainer.teacher_model}
    elif kind == "dpo":
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**common, max_length=64, beta=0.1)
        trainer = DPOTrainer(
            model=policy(),
            ref_model=policy(),
            args=args,
            train_dataset=preference,
            processing_class=tokenizer,
            callbacks=[Facts()],
        )
        frozen = {"ref_model": trainer.ref_model}
    elif kind == "kto":
        from trl import KTOConfig, KTOTrainer
        from trl.data_utils import unpair_preference_dataset

        args = KTOConfig(**common, max_length=64, beta=0.1)
        trainer = KTOTrainer(
            model=policy(),
            ref_model=policy(),
            args=args,
            train_dataset=unpair_preference_dataset(preference),
            processing_class=tokenizer,
            callbacks=[Facts()],
        )
        frozen = {"ref_model": trainer.ref_model}
    else:
        raise ValueError(f"unknown trainer {kind!r}")

    if kind in ("dpo", "kto"):
        _record_training_inputs(trainer, rec, tokenizer.pad_token_id)
    accelerator = trainer.accelerator
    rec.data["accelerator"] = {
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "device": str(accelerator.device),
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
    }
    full = {"ref_model": manifest["policy_numel"], "teacher_model": manifest["policy_numel"]}
    full["reward_model"] = manifest["reward_numel"]
    rec.data["full_numel"] = full
    rec.data["frozen"] = {
        name: describe_model(model, accelerator.device) for name, model in frozen.items() if model is not None
    }
    rec.data["frozen_absent"] = sorted(name for name, model in frozen.items() if model is None)
    world_ok = accelerator.num_processes == world
    rec.data["world_matches"] = world_ok
    return trainer


def run_one(kind, manifest, out_dir, steps):
    import torch
    from harness.accelerate110 import reset_accelerate_state

    rec = Recorder(out_dir, kind, backend=os.environ.get("TRL_MATRIX_BACKEND", "?"), steps=steps)
    rec.data["trl"] = _trl_info()
    CURRENT["rec"] = rec
    rec.trainer = None
    try:
        reset_accelerate_state()
        torch.manual_seed(0)
        from transformers import AutoTokenizer

        CURRENT["pad"] = AutoTokenizer.from_pretrained(manifest["policy"]).pad_token_id
        with _vllm_server_stand_in() if kind == "online_dpo_lora" else contextlib.nullcontext():
            rec.trainer = build_trainer(kind, manifest, out_dir, steps, rec)
            rec.data["stage"] = "initialized"
            rec.flush()
            try:
                rec.trainer.train()
            finally:
                if kind == "online_dpo_lora":
                    try:
                        rec.data["vllm"] = _vllm_facts(rec.checkpoint, rec.expected_sync)
                    except Exception as exc:  # recorded apart: the training's own error stays the cell's error
                        rec.data["vllm_error"] = _first_error_line(exc)
            if kind == "online_dpo_lora":
                rec.data["base_after"] = _base_weights_after_training(rec.trainer, rec.checkpoint)
            _save_model(rec.trainer, Path(out_dir) / kind, rec)
        rec.data["global_step"] = rec.trainer.state.global_step
        rec.data["log_history"] = _jsonable_logs(rec.trainer.state.log_history)
        rec.data["stage"] = "trained"
    except Exception as exc:
        rec.data["error"] = traceback.format_exc()
        rec.data["error_line"] = _first_error_line(exc)
        rec.data["stage"] = f"{rec.data['stage']}-failed"
    finally:
        rec.data["seconds"] = round(time.time() - rec.data["started"], 1)
        rec.flush()
        CURRENT["rec"] = None
        rec.trainer = None
        gc.collect()
    _barrier(rec)


def _barrier(rec):
    """Both ranks finish a trainer before the next one starts (a rank whose trainer failed early waits here)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        except Exception as exc:  # the group is broken (a peer gave up in a collective): say so, carry on
            rec.data["barrier_error"] = _first_error_line(exc)
            rec.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fixtures", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--trainers", default=",".join(TRAINERS))
    a = parser.parse_args(argv)

    from harness.fixtures import load_manifest

    manifest = load_manifest(a.fixtures)
    _install_generate_recorder()
    for kind in a.trainers.split(","):
        run_one(kind, manifest, a.out, a.steps)

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
