"""A plan -> the DeepSpeed config that runs it (``--deepspeed-out ds.json`` on ``simulate`` and ``plan``).

Written from the same table that ``tiersim.deepspeed_config`` reads (``tiersim.deepspeed_keys``), so reading
the written config gives back the policy, the knobs and the workload. Policies without a DeepSpeed equivalent
(tinypipe, lazytrain, synergyscale) are refused with a line that points to ``tiersim replay``; a knob whose
value DeepSpeed cannot express (zero-offload's delayed update, non-default prefetch distances) is named in
the notes that come with the config.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies import get_policy, parse_knobs
from simulator import Plan
from tiersim.deepspeed_keys import DS_POLICIES, KNOB_KEYS, NO_DS_EQUIVALENT, POLICY_KEYS, set_path
from tiersim.errors import UsageError

# knobs DeepSpeed has no key for, with the value its behaviour matches and what the difference means
NOT_EXPRESSIBLE: dict[str, dict[str, tuple[Any, str]]] = {
    "zero-offload": {
        "delayed_update": (False, "DeepSpeed has no delayed parameter update: the config runs without it (slower "
                                  "than the simulated plan)"),
        "upload_bytes_per_param": (2.0, "DeepSpeed uploads 16-bit parameters"),
        "grad_offload_bytes_per_param": (2.0, "DeepSpeed offloads gradients in the training precision"),
        "cpu_grad_bytes": (4.0, "DeepSpeed accumulates fp32 gradients on the CPU"),
        "cpu_param_copy_per_rank": (False, "a per-rank fp32 copy is DeepSpeed's initialisation, not a setting"),
    },
    "zero-infinity": {
        "nvme_prefetch": (3, "DeepSpeed prefetches by stage3_prefetch_bucket_size elements, not by layers"),
        "cpu_prefetch": (2, "DeepSpeed prefetches by stage3_prefetch_bucket_size elements, not by layers"),
        "gather_prefetch": (1, "DeepSpeed prefetches by stage3_prefetch_bucket_size elements, not by layers"),
        "grad_bytes_per_param": (2.0, "DeepSpeed moves gradients in the training precision"),
    },
}
NVME_PATH = "/local_nvme"  # DeepSpeed's documentation's placeholder: the user's NVMe mount


@dataclass(frozen=True)
class Exported:
    config: dict[str, Any]
    notes: tuple[str, ...]


def check_exportable(policy: str) -> None:
    """UsageError (exit 2) naming the policy and ``tiersim replay`` when it has no DeepSpeed equivalent."""
    if policy not in DS_POLICIES:
        raise UsageError(f"--deepspeed-out: policy {policy} {NO_DS_EQUIVALENT}")


def to_deepspeed(policy: str, knobs: Mapping[str, Any], *, micro_batch: int, global_batch: int, precision: str,
                 checkpointing: str, n_gpus: int) -> Exported:
    """The DeepSpeed config of a plan: its policy and knobs, micro-batch, global batch, precision and
    checkpointing, on ``n_gpus`` GPUs (DeepSpeed's world size is ``n_gpus / tp``)."""
    check_exportable(policy)
    knobs = {**dataclasses.asdict(parse_knobs(get_policy(policy), dict(knobs)))}  # every knob, defaults filled in
    tp = int(knobs.get("tp", 1) or 1)
    world = n_gpus // tp
    notes: list[str] = []
    if knobs.get("tp") == 0:
        notes.append("zero-offload's tp=0 (auto) has no DeepSpeed value: written as data parallel only (tp=1)")
    cfg: dict[str, Any] = {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": global_batch // (micro_batch * world),
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"overlap_comm": True},
    }
    for path, value in POLICY_KEYS[policy].items():
        set_path(cfg, path, value)
    for key in KNOB_KEYS:
        if key.policy == policy and key.knob in knobs and key.applies(knobs):
            if key.path.startswith("activation_checkpointing.") and checkpointing != "full":
                continue
            set_path(cfg, key.path, knobs[key.knob])
    for section in ("offload_param", "offload_optimizer"):
        node = cfg["zero_optimization"].get(section)
        if isinstance(node, dict):
            node["pin_memory"] = True
            if node.get("device") == "nvme":
                node["nvme_path"] = NVME_PATH
                notes.append(f"zero_optimization.{section}.nvme_path = {NVME_PATH}: set it to your NVMe mount")
    if checkpointing == "full":
        ac = cfg.setdefault("activation_checkpointing", {})
        ac.setdefault("partition_activations", False)
        ac.setdefault("contiguous_memory_optimization", False)
        ac.setdefault("cpu_checkpointing", False)
        notes.append("activation_checkpointing configures deepspeed.checkpointing; with the HF Trainer also pass "
                     "--gradient_checkpointing")
    elif checkpointing == "selective":
        notes.append("selective checkpointing has no DeepSpeed key: it is chosen in the model code")
    for knob, (same, why) in NOT_EXPRESSIBLE.get(policy, {}).items():
        if knob in knobs and knobs[knob] != same:
            notes.append(f"knob {knob}={knobs[knob]} has no DeepSpeed key: {why}")
    return Exported(cfg, tuple(notes))


def export_plan(plan: Plan) -> Exported:
    """:func:`to_deepspeed` of a plan (an automatic tensor-parallel degree as the plan resolved it)."""
    knobs = dict(plan.knobs)
    if knobs.get("tp") == 0 and isinstance(plan.info.get("tp"), int):
        knobs["tp"] = plan.info["tp"]
    w = plan.workload.config
    assert w.global_batch is not None
    return to_deepspeed(plan.policy, knobs, micro_batch=w.micro_batch, global_batch=w.global_batch,
                        precision=w.precision, checkpointing=w.checkpointing, n_gpus=plan.hardware.gpu.count)


def write_config(exported: Exported, path: str | Path) -> None:
    Path(path).write_text(json.dumps(exported.config, indent=2) + "\n", encoding="utf-8")
