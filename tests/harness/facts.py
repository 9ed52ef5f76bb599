"""What a rank holds of a model: wrappers, devices, local parameter count/bytes, modes.

Works on plain modules and on DDP / DataParallel / DeepSpeed engines, ZeRO-3 partitioned parameters
(``ds_tensor``), FSDP1 (flat or original parameters, local shard only) and FSDP2 (``DTensor`` local shard).
"""

import torch


def _fsdp2_module_type():
    for path in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = __import__(path, fromlist=["FSDPModule"])
            return module.FSDPModule
        except (ImportError, AttributeError):
            continue
    return None


def _fsdp1_type():
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel
    except ImportError:  # pragma: no cover
        return None


def wrapper_chain(model):
    """Type names from the outermost wrapper down to the wrapped model, e.g. ['DataParallel', 'Qwen2ForCausalLM']."""
    names, seen = [], set()
    while model is not None and id(model) not in seen:
        seen.add(id(model))
        names.append(type(model).__name__)
        submodules = getattr(model, "_modules", {})
        inner = submodules.get("_fsdp_wrapped_module") or submodules.get("module")
        model = inner
    return names


def _local_tensor(p):
    if hasattr(p, "ds_tensor"):  # DeepSpeed ZeRO-3: p.data is empty unless gathered or persistent
        return p.data if p.data.numel() > 0 else p.ds_tensor
    to_local = getattr(p, "to_local", None)  # FSDP2 DTensor
    if to_local is not None:
        return to_local()
    return p.data


def normalize_device(device):
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # one process: Accelerate's device is `cuda`, tensors `cuda:0`
        device = torch.device("cuda", torch.cuda.current_device())
    return "cpu" if device.type == "cpu" else str(device)


def describe_model(model, accelerator_device=None):
    """Facts about ``model`` on this rank (JSON-serialisable)."""
    fsdp2 = _fsdp2_module_type()
    fsdp1 = _fsdp1_type()
    seen, local_numel, local_bytes, devices = set(), 0, 0, set()
    requires_grad, n_params = False, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n_params += 1
        t = _local_tensor(p)
        local_numel += t.numel()
        local_bytes += t.numel() * t.element_size()
        devices.add(normalize_device(t.device))
        requires_grad = requires_grad or bool(p.requires_grad)
    modules = list(model.modules())
    inner = model
    while True:  # innermost model under DDP / DataParallel / DeepSpeedEngine / FSDP1 wrappers
        submodules = getattr(inner, "_modules", {})
        nxt = submodules.get("_fsdp_wrapped_module") or submodules.get("module")
        if not isinstance(nxt, torch.nn.Module):
            break
        inner = nxt
    facts = {
        "wrappers": wrapper_chain(model),
        "fsdp1_units": sum(isinstance(m, fsdp1) for m in modules) if fsdp1 else 0,
        "fsdp2_units": sum(isinstance(m, fsdp2) for m in modules) if fsdp2 else 0,
        "deepspeed_engine": type(model).__name__ == "DeepSpeedEngine",
        "zero3_params": any(hasattr(p, "ds_tensor") for p in model.parameters()),
        "n_params": n_params,
        "local_numel": local_numel,
        "local_bytes": local_bytes,
        "devices": sorted(devices),
        # DeepSpeedEngine.train() never updates the engine's own flag: look at the wrapped modules
        "training": any(m.training for m in inner.modules()),
        "requires_grad": requires_grad,
    }
    if accelerator_device is not None:
        target = normalize_device(accelerator_device)
        facts["accelerator_device"] = target
        facts["on_accelerator_device"] = devices == {target}
    return facts


def describe_for_humans(name, facts, full_numel, rank=None):
    share = facts["local_numel"] / full_numel if full_numel else float("nan")
    where = ", ".join(facts["devices"]) or "-"
    prefix = f"[rank {rank}] " if rank is not None else ""
    return (
        f"{prefix}{name}: {'/'.join(facts['wrappers'])} on {where}; holds {facts['local_numel']:,} of "
        f"{full_numel:,} params ({share:.0%}), {facts['local_bytes']:,} bytes"
    )
