"""What each cell of the 1.16.0 matrix does on pristine TRL 1.16.0, keyed by the issue that fixes it.

Measured on CPU (2 gloo ranks, ``test_matrix_116.py``; see ``lines/1.16.0/docs/pristine_matrix.md``).
``EXPECTED[(trainer, backend, check)]`` lists the :class:`harness.marks.Broken` entries of a check; an absent key
means the check passes on the base.  A patch that fixes a cell flips it by deleting its line below (or its issue
lands in ``trl._fork_info.FIXED_ISSUES``, which deactivates the entry; ``harness.marks``).

Issues:

- #27: frozen models (reference / reward / teacher): not sharded or placed under FSDP, not frozen (its item 1: "eval
  mode and no gradients"), Online DPO's reference not built under ZeRO-3 (the 0.16.1 line's patch 0034);
- #28: PEFT weight sync / PEFT under FSDP1, Online DPO's sync one request per tensor;
- #29: generation gather;
- #40: ``save_model`` under FSDP with ``SHARDED_STATE_DICT`` (the harness's FSDP2 config, as the fork's) writes no
  weights.
"""

from harness.marks import known_broken, limitation


# --------------------------------------------------------------------------------- failure texts (regex)
NOT_SHARDED = r"is not sharded: holds"
REQUIRES_GRAD = r"has parameters with requires_grad=True"
WEIGHT_2D = r"RuntimeError: 'weight' must be 2-D"
ODPO_ZERO3_NO_REF = r"ValueError: DeepSpeed ZeRO-3 is enabled and is not compatible with `create_reference_model\(\)`"
PER_TENSOR = r"one request per tensor \(update_named_param\)"
FSDP1_FLAT_MERGE = r"RuntimeError: inconsistent tensor size"
NO_WEIGHTS = r"holds no (model|adapter) weights"
FSDP1_CPU_SAVE = r"not saved: FSDP1's full state dict with offload_to_cpu segfaults on CPU ranks"

# ------------------------------------------------------------------------------------------ the entries
REWARD_NOT_SHARDED = known_broken(
    27, match=NOT_SHARDED, why="reward model prepared with prepare_model(evaluation_mode=True): a full replica"
)
TEACHER_NOT_SHARDED = known_broken(
    27, match=NOT_SHARDED, why="GKD's teacher prepared with prepare_model(evaluation_mode=True): a full replica"
)
FROZEN_GRADS = known_broken(
    27,
    match=REQUIRES_GRAD,
    why="frozen models keep requires_grad=True (only eval mode is set; create_reference_model() alone freezes)",
)
GKD_FSDP1_GENERATE = known_broken(
    29, match=WEIGHT_2D, why="GKD generates with the FSDP1-wrapped student (flat 1-D shards), no gather"
)
ODPO_ZERO3 = known_broken(
    27,
    match=ODPO_ZERO3_NO_REF,
    why="Online DPO under ZeRO-3 without ref_model: create_reference_model() refused (0.16.1 line: patch 0034)",
)
ODPO_PER_TENSOR = known_broken(
    28, match=PER_TENSOR, why="Online DPO sends one request per tensor to the vLLM server, not GRPO's packed stream"
)
LORA_FSDP1_MERGE = known_broken(
    28, match=FSDP1_FLAT_MERGE, why="the LoRA sync merges the adapters on FSDP1's flat shards (merge_adapter)"
)
SHARDED_SAVE_EMPTY = known_broken(
    40, match=NO_WEIGHTS, why="Trainer.save_model writes weights under FSDP only with FULL_STATE_DICT (transformers)"
)
FSDP1_SAVE_ON_CPU = limitation(
    match=FSDP1_CPU_SAVE,
    why="torch segfaults gathering FSDP1's full state dict to the CPU from CPU ranks; GPU runs are not affected",
)

EXPECTED = {
    # --- placement under FSDP: the reference models are sharded (prepare_fsdp), reward models and teachers are not
    ("grpo", "fsdp1", "placement"): (REWARD_NOT_SHARDED,),
    ("grpo", "fsdp2", "placement"): (REWARD_NOT_SHARDED,),
    ("rloo", "fsdp1", "placement"): (REWARD_NOT_SHARDED,),
    ("rloo", "fsdp2", "placement"): (REWARD_NOT_SHARDED,),
    ("online_dpo", "fsdp1", "placement"): (REWARD_NOT_SHARDED,),
    ("online_dpo", "fsdp2", "placement"): (REWARD_NOT_SHARDED,),
    ("gkd", "fsdp1", "placement"): (TEACHER_NOT_SHARDED,),
    ("gkd", "fsdp2", "placement"): (TEACHER_NOT_SHARDED,),
    ("grpo_lora", "fsdp1", "placement"): (REWARD_NOT_SHARDED,),
    ("grpo_lora", "fsdp2", "placement"): (REWARD_NOT_SHARDED,),
    ("online_dpo_lora", "fsdp1", "placement"): (REWARD_NOT_SHARDED,),
    ("online_dpo_lora", "fsdp2", "placement"): (REWARD_NOT_SHARDED,),
    # --- generation
    ("gkd", "fsdp1", "trains"): (GKD_FSDP1_GENERATE,),
    # --- Online DPO with LoRA through the vLLM server (a stand-in): the weight sync
    ("online_dpo_lora", "ddp", "trains"): (ODPO_PER_TENSOR,),
    ("online_dpo_lora", "fsdp1", "trains"): (LORA_FSDP1_MERGE,),
    ("online_dpo_lora", "fsdp2", "trains"): (ODPO_PER_TENSOR,),
    ("online_dpo_lora", "zero2", "trains"): (ODPO_PER_TENSOR,),
    ("online_dpo_lora", "zero3", "trains"): (ODPO_PER_TENSOR,),
    # --- Online DPO under ZeRO-3 with no reference model given: nothing is built, every check fails
    ("online_dpo", "zero3", "trains"): (ODPO_ZERO3,),
    ("online_dpo", "zero3", "wrapping"): (ODPO_ZERO3,),
    ("online_dpo", "zero3", "placement"): (ODPO_ZERO3,),
    ("online_dpo", "zero3", "frozen"): (ODPO_ZERO3,),
}

# --- frozen: every reference / reward / teacher model tracks gradients on every backend, except Online DPO's
# reference (create_reference_model() freezes it); the LoRA cells' only frozen model is their reward model
for _trainer in ("grpo", "rloo", "online_dpo", "gkd", "dpo", "kto", "grpo_lora", "online_dpo_lora"):
    for _backend in ("ddp", "fsdp1", "fsdp2", "zero2", "zero3"):
        EXPECTED.setdefault((_trainer, _backend, "frozen"), (FROZEN_GRADS,))

# --- saves: under FSDP2 with SHARDED_STATE_DICT the final save_model writes nothing; a trainer that fails to train
# fails its save check with the same entry; FSDP1 is not saved on CPU (a torch segfault, a stated limitation)
for _trainer in ("grpo", "rloo", "online_dpo", "gkd", "dpo", "kto", "grpo_lora", "online_dpo_lora"):
    EXPECTED[(_trainer, "fsdp2", "saves")] = (SHARDED_SAVE_EMPTY,)
    EXPECTED[(_trainer, "fsdp1", "saves")] = (FSDP1_SAVE_ON_CPU,)
EXPECTED[("online_dpo", "zero3", "saves")] = (ODPO_ZERO3,)
# (on pristine 1.16.0 these two fail to train under FSDP1 first)
EXPECTED[("gkd", "fsdp1", "saves")] = (GKD_FSDP1_GENERATE, FSDP1_SAVE_ON_CPU)
EXPECTED[("online_dpo_lora", "fsdp1", "saves")] = (LORA_FSDP1_MERGE, FSDP1_SAVE_ON_CPU)
