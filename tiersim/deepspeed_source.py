"""Find the DeepSpeed config in a file: a DeepSpeed JSON, the ``deepspeed`` entry of Hugging Face Trainer
arguments (JSON or YAML; a dict or a path to a DeepSpeed JSON), or the ``deepspeed_config`` section of an
accelerate config (a ``deepspeed_config_file`` path, or accelerate's flat keys, converted as accelerate's
``DeepSpeedPlugin`` converts them). Files are read with ``workloads.files`` (one-line errors, exit 2).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiersim.deepspeed_keys import set_path
from tiersim.errors import UsageError
from workloads.files import read_json, read_yaml


class DeepSpeedConfigError(UsageError):
    """A DeepSpeed config tiersim cannot read or represent: one line naming the file, the key and the fix."""


@dataclass(frozen=True)
class DeepSpeedSource:
    """A DeepSpeed config as found: the DeepSpeed dict, where it came from, and the training arguments around
    it (HF ``TrainingArguments`` fields of a Trainer file; what accelerate's config sets) that "auto" uses."""

    label: str                       # e.g. "ds.json" or "train.yaml: deepspeed -> ds_z3.json"
    config: dict[str, Any]
    wrapper: str | None = None       # "hf-trainer" or "accelerate", None for a plain DeepSpeed file
    training_args: Mapping[str, Any] = field(default_factory=dict)
    num_processes: int | None = None  # accelerate's world size, checked against the hardware


# accelerate's flat ``deepspeed_config`` keys -> DeepSpeed paths (accelerate's DeepSpeedPlugin.__post_init__)
ACCELERATE_KEYS = {
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
ACCELERATE_IGNORED = ("zero3_init_flag", "deepspeed_multinode_launcher", "deepspeed_hostfile",
                      "deepspeed_exclusion_filter", "deepspeed_inclusion_filter", "deepspeed_moe_layer_cls_names")


def read_any(path: Path) -> Any:
    if path.suffix.lower() in (".yaml", ".yml"):
        return read_yaml(path, kind="training-yaml")
    return read_json(path, kind="deepspeed")


def load_source(path_text: str) -> DeepSpeedSource:
    """The DeepSpeed config of the file at ``path_text`` (see the module docstring)."""
    path = Path(path_text)
    data = read_any(path)
    if not isinstance(data, Mapping):
        raise DeepSpeedConfigError(f"{path}: expected a JSON object (a DeepSpeed config), got "
                                   f"{type(data).__name__}; give a DeepSpeed config file")
    if "deepspeed_config" in data:
        return _accelerate(path, data)
    if "deepspeed" in data:
        return _hf_trainer(path, data)
    return DeepSpeedSource(str(path), copy.deepcopy(dict(data)))


def _nested_file(outer: Path, name: object, key: str) -> tuple[Path, dict[str, Any]]:
    if not isinstance(name, str) or not name.strip():
        raise DeepSpeedConfigError(f"{outer}: {key}: expected a DeepSpeed config (an object or a path to a "
                                   f"JSON file), got {name!r}")
    candidate = Path(name)
    if not candidate.is_absolute() and not candidate.exists():  # HF resolves from the working directory
        candidate = outer.parent / name
    data = read_json(candidate, kind="deepspeed")
    if not isinstance(data, Mapping):
        raise DeepSpeedConfigError(f"{candidate}: expected a JSON object (a DeepSpeed config)")
    return candidate, copy.deepcopy(dict(data))


def _hf_trainer(path: Path, data: Mapping[str, Any]) -> DeepSpeedSource:
    ds = data["deepspeed"]
    args = {k: v for k, v in data.items() if k != "deepspeed"}
    if isinstance(ds, Mapping):
        return DeepSpeedSource(f"{path}: deepspeed", copy.deepcopy(dict(ds)), "hf-trainer", args)
    inner, config = _nested_file(path, ds, "deepspeed")
    return DeepSpeedSource(f"{path}: deepspeed -> {inner}", config, "hf-trainer", args)


def _accelerate(path: Path, data: Mapping[str, Any]) -> DeepSpeedSource:
    section = data["deepspeed_config"]
    if not isinstance(section, Mapping):
        raise DeepSpeedConfigError(f"{path}: deepspeed_config: expected a mapping (accelerate config), got "
                                   f"{section!r}")
    n = data.get("num_processes")
    num_processes = n if isinstance(n, int) and not isinstance(n, bool) else None
    mp = data.get("mixed_precision")
    args: dict[str, Any] = {}
    if mp is not None:
        if mp not in ("no", "fp16", "bf16"):
            raise DeepSpeedConfigError(f"{path}: mixed_precision: {mp!r} is not one tiersim models; use no, fp16 "
                                       "or bf16")
        args = {"fp16": mp == "fp16", "bf16": mp == "bf16"}
    if "deepspeed_config_file" in section:
        inner, nested = _nested_file(path, section["deepspeed_config_file"], "deepspeed_config.deepspeed_config_file")
        return DeepSpeedSource(f"{path}: deepspeed_config_file -> {inner}", nested, "accelerate", args, num_processes)
    config: dict[str, Any] = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}
    for key, value in section.items():
        if key in ACCELERATE_IGNORED:
            continue
        if key not in ACCELERATE_KEYS:
            raise DeepSpeedConfigError(f"{path}: deepspeed_config.{key}: not an accelerate DeepSpeed key tiersim "
                                       f"knows ({', '.join(ACCELERATE_KEYS)}); remove it or use "
                                       "deepspeed_config_file")
        if key.endswith("_device") and value == "none":
            continue
        set_path(config, ACCELERATE_KEYS[key], value)
    if args:
        config["fp16"] = {"enabled": "auto"}
        config["bf16"] = {"enabled": "auto"}
    return DeepSpeedSource(f"{path}: deepspeed_config", config, "accelerate", args, num_processes)
