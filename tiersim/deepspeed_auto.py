"""HF's ``"auto"`` values, resolved the way transformers' DeepSpeed integration resolves them
(transformers 5.24.0, ``integrations/deepspeed.py``: ``HfTrainerDeepSpeedConfig.trainer_config_process`` fills the
batch, precision, clipping and optimizer keys from ``TrainingArguments``; ``trainer_config_finalize`` the bucket
sizes from the model's ``hidden_size``). tiersim's flags play ``TrainingArguments``' part (``--micro-batch`` for
``--per_device_train_batch_size``, ``--precision bf16`` for ``--bf16``); a Trainer or accelerate file's own
arguments count too; otherwise HF's defaults (``deepspeed_keys.HF_DEFAULTS``).
"""

from __future__ import annotations

from typing import Any

from policies.job import JobRequest
from tiersim.deepspeed_keys import HF_AUTO_UNPRICED, HF_DEFAULTS, leaves, set_path, show
from tiersim.deepspeed_source import DeepSpeedConfigError, DeepSpeedSource

#: resolved first, in this order: the train batch is HF's product of the other two
BATCH_FIRST = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")


def resolve_auto(cfg: dict[str, Any], src: DeepSpeedSource, flags: JobRequest, *, hidden: int, stage: int,
                 world: int) -> list[tuple[str, str]]:
    """Replace every "auto" of ``cfg`` in place; (path, how it was resolved) for each."""
    autos = sorted((p for p, v in leaves(cfg) if v == "auto"),
                   key=lambda p: BATCH_FIRST.index(p) if p in BATCH_FIRST else len(BATCH_FIRST))
    out = []
    for path in autos:
        value, how = _value(cfg, src, flags, path, hidden=hidden, stage=stage, world=world)
        set_path(cfg, path, value)
        out.append((path, how if value == "auto" else
                    f"-> {show(value)} ({how}, as transformers' DeepSpeed integration fills it)"))
    return out


def _arg(src: DeepSpeedSource, name: str) -> tuple[Any, str]:
    """A TrainingArguments value: the wrapper file's, else HF's default."""
    if name in src.training_args:
        return src.training_args[name], f"{name} of the {src.wrapper} file"
    return HF_DEFAULTS[name], f"HF TrainingArguments.{name} default"


def _value(cfg: dict[str, Any], src: DeepSpeedSource, f: JobRequest, path: str, *, hidden: int, stage: int,
           world: int) -> tuple[Any, str]:
    if path == "train_micro_batch_size_per_gpu":
        if f.micro_batch is not None:
            return f.micro_batch, "--micro-batch, as --per_device_train_batch_size"
        return _arg(src, "per_device_train_batch_size")
    if path == "gradient_accumulation_steps":
        if "gradient_accumulation_steps" not in src.training_args and f.global_batch is not None:
            micro = cfg.get("train_micro_batch_size_per_gpu")
            if isinstance(micro, int) and f.global_batch % (micro * world) == 0:
                return f.global_batch // (micro * world), "--global-batch / (micro-batch x world size)"
        return _arg(src, "gradient_accumulation_steps")
    if path == "train_batch_size":
        micro, accum = cfg.get("train_micro_batch_size_per_gpu"), cfg.get("gradient_accumulation_steps")
        if isinstance(micro, int) and isinstance(accum, int):
            return world * micro * accum, "world size x micro-batch x accumulation"
        raise _fail(src, path, "HF computes it from the micro-batch and the accumulation; give them")
    if path in ("fp16.enabled", "bf16.enabled"):
        dtype = path.split(".")[0]
        if f.precision is not None:
            return f.precision == dtype, f"--precision {f.precision}, as --{dtype}"
        value, how = _arg(src, dtype)
        return bool(value or src.training_args.get(f"{dtype}_full_eval", False)), how
    if path == "zero_optimization.reduce_bucket_size":
        return hidden * hidden, f"hidden_size^2, hidden_size {hidden}"
    if path == "zero_optimization.stage3_prefetch_bucket_size" and stage == 3:
        return int(0.9 * hidden * hidden), f"0.9 x hidden_size^2, hidden_size {hidden}"
    if path == "zero_optimization.stage3_param_persistence_threshold" and stage == 3:
        return 10 * hidden, f"10 x hidden_size, hidden_size {hidden}"
    if path in HF_AUTO_UNPRICED:
        return "auto", f"HF fills it from {HF_AUTO_UNPRICED[path]}; it changes nothing tiersim prices"
    raise _fail(src, path, "\"auto\" here is not one transformers' DeepSpeed integration resolves; give a value")


def _fail(src: DeepSpeedSource, path: str, why: str) -> DeepSpeedConfigError:
    return DeepSpeedConfigError(f"{src.label}: {path} = \"auto\": {why}")
