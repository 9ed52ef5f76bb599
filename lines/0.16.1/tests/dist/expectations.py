"""What each matrix cell does on the pristine base (TRL 0.16.1), keyed by the issue that fixes it.

Measured on CPU (2 gloo ranks; DataParallel: 1 process with ``n_gpu = 2``) with ``test_matrix.py`` (this folder).
``CPU_EXPECTED[(trainer, backend, check)]`` lists the :class:`~harness.marks.Broken` entries of a check; an
absent key means the check passes on the base.  Entries are built from three tables:

- ``LAUNCH_FAILURES``: the launch itself fails.  Stage ``"init"`` (the trainer cannot even be built): every
  check of the cell fails with that text.  Stage ``"train"``: only ``trains`` does (facts were recorded).
- ``PLACEMENT`` / ``FROZEN``: the frozen-model facts are wrong (full replica under FSDP; gradients or train
  mode on frozen models).
- ``WRAPPING``: the trained model is not wrapped as the backend wraps it.

Add a cell: add the trainer to ``harness.matrix.TRAINERS`` and the worker, run it, and add a row here for each
failing check with the issue that fixes it (``known_broken``) or, when no open issue does, ``limitation``
(and a line in ``LIMITATIONS.md`` here).
"""

from harness.marks import known_broken, limitation
from harness.matrix import BACKEND_NAMES, CHECKS, TRAINERS


GRPO, ODPO_J, ODPO_RM, RLOO, PPO = TRAINERS
ONLINE_DPO = (ODPO_J, ODPO_RM)

# --------------------------------------------------------------------------------- failure texts (regex)
WEIGHT_2D_IN_GENERATE = r"generation/utils\.py.*RuntimeError: 'weight' must be 2-D"
WEIGHT_2D_IN_REWARD = r"reward_func\(\*\*reward_inputs\).*RuntimeError: 'weight' must be 2-D"
DDP_NO_CONFIG = r"AttributeError: 'DistributedDataParallel' object has no attribute 'config'"
DP_NO_CONFIG = r"AttributeError: 'DataParallel' object has no attribute 'config'"
DS_CONFIG_IS_DICT = r"AttributeError: 'dict' object has no attribute 'is_encoder_decoder'"
NO_SPLIT_MODULES = r"AttributeError: 'PolicyAndValueWrapper' object has no attribute '_no_split_modules'"
SECOND_ACCELERATOR_DS = (
    r"(RLOOTrainer|PPOTrainer|rloo_trainer|ppo_trainer).*Accelerator\(.*ValueError: Please make sure to properly "
    r"initialize your accelerator via `accelerator = Accelerator\(\)`"
)
NOT_SHARDED = r"is not sharded: holds"
REQUIRES_GRAD = r"has parameters with requires_grad=True"
TRAIN_MODE = r"is in train mode"
NOT_DATAPARALLEL = r"trained model is (?!DataParallel)\S+, expected it wrapped in DataParallel"

# ------------------------------------------------------------------------------------------- the tables
LAUNCH_FAILURES = {}
for _t in TRAINERS:
    # generate() runs on FSDP1's flat 1-D shards (unwrap_model_for_generation does not gather them)
    LAUNCH_FAILURES[(_t, "fsdp1")] = (
        "train",
        known_broken(7, match=WEIGHT_2D_IN_GENERATE, why="FSDP1: generate() on flat-sharded parameters"),
    )
for _t in ONLINE_DPO:
    LAUNCH_FAILURES[(_t, "ddp")] = (
        "train",
        known_broken(5, match=DDP_NO_CONFIG, why="training_step reads model.config on the DDP-wrapped model"),
    )
    LAUNCH_FAILURES[(_t, "dataparallel")] = (
        "train",
        known_broken(5, match=DP_NO_CONFIG, why="training_step reads model.config on the DataParallel model"),
    )
    LAUNCH_FAILURES[(_t, "zero2")] = (
        "train",
        known_broken(5, match=DS_CONFIG_IS_DICT, why="model.config on a DeepSpeedEngine is the DeepSpeed dict"),
    )
    LAUNCH_FAILURES[(_t, "zero3")] = LAUNCH_FAILURES[(_t, "zero2")]
LAUNCH_FAILURES[(GRPO, "zero3")] = (
    "train",
    known_broken(
        6,
        match=WEIGHT_2D_IN_REWARD,
        why="ZeRO-3: reward model partitioned at load (zero.Init) but never given to DeepSpeed",
    ),
)
LAUNCH_FAILURES[(PPO, "fsdp2")] = (
    "init",
    known_broken(7, match=NO_SPLIT_MODULES, why="FSDP2 auto-wrap of PPO's PolicyAndValueWrapper"),
)
for _t in (RLOO, PPO):
    for _b in ("zero2", "zero3"):
        LAUNCH_FAILURES[(_t, _b)] = (
            "init",
            known_broken(
                7,
                match=SECOND_ACCELERATOR_DS,
                why="the trainer builds its own Accelerator() after TrainingArguments set up DeepSpeed",
            ),
        )

# every frozen model is a full replica under FSDP: prepare_model(evaluation_mode=True) or .to(device)
PLACEMENT = {
    (t, b): known_broken(6, match=NOT_SHARDED, why="frozen models not sharded under FSDP")
    for t in TRAINERS
    for b in ("fsdp1", "fsdp2")
}

# frozen models with gradients enabled (reward models everywhere; RLOO/PPO's reference too; GRPO's ZeRO-3 ref)
FROZEN = {}
for _b in BACKEND_NAMES:
    for _t in TRAINERS:
        if _t == ODPO_J and _b != "zero3":
            continue  # its only frozen model comes from create_reference_model(): eval, no grad
        FROZEN[(_t, _b)] = known_broken(6, match=f"{REQUIRES_GRAD}|{TRAIN_MODE}", why="frozen models track gradients")

# PPO and RLOO run their own loop: n_gpu > 1 never wraps the policy in DataParallel (one device is used)
WRAPPING = {
    (t, "dataparallel"): limitation(
        match=NOT_DATAPARALLEL, why=f"{t.upper()} ignores n_gpu > 1: trains on one device, no DataParallel"
    )
    for t in (RLOO, PPO)
}


def _build():
    table = {}
    for t in TRAINERS:
        for b in BACKEND_NAMES:
            for check in CHECKS:
                entries = []
                launch = LAUNCH_FAILURES.get((t, b))
                if launch and (check == "trains" or launch[0] == "init"):
                    entries.append(launch[1])
                if check == "placement" and (t, b) in PLACEMENT:
                    entries.append(PLACEMENT[(t, b)])
                if check == "frozen" and (t, b) in FROZEN:
                    entries.append(FROZEN[(t, b)])
                if check == "wrapping" and (t, b) in WRAPPING:
                    entries.append(WRAPPING[(t, b)])
                if entries:
                    table[(t, b, check)] = tuple(entries)
    return table


CPU_EXPECTED = _build()

# The fast subset (`-m "dist and not slow"`): one launch per backend for GRPO, plus Online DPO under
# DataParallel; covers issues 5, 6 and 7.  Every other cell is `slow` (run by `make test-dist`).
FAST_CELLS = {(GRPO, b) for b in ("ddp", "fsdp1", "fsdp2", "zero3", "dataparallel")} | {(ODPO_J, "dataparallel")}
SLOW_CELLS = {(t, b) for t in TRAINERS for b in BACKEND_NAMES} - FAST_CELLS


def gpu_expected(world_size):
    """Expectations on CUDA (derived from the CPU matrix and the seed reports; not measured here).

    World size 1 (one GPU): nothing is sharded, so placement under FSDP checks the *device*: GRPO's reference
    and reward models stay on the CPU (prepare_model(evaluation_mode=True) neither places nor wraps them),
    and training then fails with the seed's device mismatch.  FSDP1 at world size 1 runs NO_SHARD, so
    generation works there.  At world size >= 2 the CPU expectations apply, plus GRPO's device mismatch.
    """
    device_mismatch = known_broken(
        6,
        match=r"not on the accelerator device|Expected all tensors to be on the same device",
        why="frozen model left on the CPU under FSDP",
    )
    table = dict(CPU_EXPECTED)
    if world_size == 1:
        for t in TRAINERS:
            for b in ("fsdp1", "fsdp2"):
                for check in ("placement", "trains"):
                    table.pop((t, b, check), None)
        for check in CHECKS:
            table[(PPO, "fsdp2", check)] = (LAUNCH_FAILURES[(PPO, "fsdp2")][1],)
        for t in ONLINE_DPO:
            table.pop((t, "ddp", "trains"), None)  # one process: no DDP wrapper, model.config is readable
    for b in ("fsdp1", "fsdp2"):
        table[(GRPO, b, "placement")] = (device_mismatch,) + (() if world_size == 1 else (PLACEMENT[(GRPO, b)],))
        table[(GRPO, b, "trains")] = (device_mismatch,) + (
            (LAUNCH_FAILURES[(GRPO, b)][1],) if b == "fsdp1" and world_size > 1 else ()
        )
    return table


GPU_EXPECTED = gpu_expected(1)
