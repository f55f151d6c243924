"""The one table between DeepSpeed's config keys and tiersim's jobs: read by ``tiersim.deepspeed_config``
(a DeepSpeed config -> policy, knobs and workload) and written by ``tiersim.deepspeed_export`` (a plan -> a
DeepSpeed config), so a round trip config -> job -> config is one definition.

Key names, defaults and checks follow DeepSpeed 0.19.8 (``deepspeed/runtime/config.py``,
``deepspeed/runtime/zero/config.py``, ``deepspeed/runtime/zero/offload_config.py``); ``"auto"`` values follow
Hugging Face transformers 5.24.0 (``transformers/integrations/deepspeed.py``: ``trainer_config_process`` and
``trainer_config_finalize``; the ``TrainingArguments`` defaults of ``transformers/training_args.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: the policies a DeepSpeed config can express, and the ZeRO stage each is written with
DS_POLICIES = ("none", "zero-offload", "zero-infinity")
#: policies without a DeepSpeed equivalent: their plans run with the torch runner
NO_DS_EQUIVALENT = "has no DeepSpeed equivalent; run its plan with the torch runner: --plan-out plan.json, then " \
                   "tiersim replay plan.json"


@dataclass(frozen=True)
class KnobKey:
    """A DeepSpeed key that is one policy knob: read when ``applies`` holds for the job's knobs (else the key
    is not used by DeepSpeed in that setting: reported as ignored), written under the same condition."""

    path: str
    policy: str
    knob: str
    applies: Callable[[Mapping[str, Any]], bool]
    kind: type
    why: str  # what the knob does, shown with the mapping


def _always(knobs: Mapping[str, Any]) -> bool:
    return True


def _tp_above_one(knobs: Mapping[str, Any]) -> bool:
    return int(knobs.get("tp", 1)) > 1


def _optimizer_nvme(knobs: Mapping[str, Any]) -> bool:
    return knobs.get("optimizer_device") == "nvme"


KNOB_KEYS: tuple[KnobKey, ...] = (
    KnobKey("zero_optimization.stage", "none", "stage", _always, int, "ZeRO stage, nothing offloaded"),
    KnobKey("tensor_parallel.autotp_size", "none", "tp", _tp_above_one, int, "tensor-parallel degree"),
    KnobKey("tensor_parallel.autotp_size", "zero-offload", "tp", _tp_above_one, int, "tensor-parallel degree"),
    KnobKey("zero_optimization.offload_param.device", "zero-infinity", "param_device", _always, str,
            "home of the 16-bit parameters"),
    KnobKey("zero_optimization.offload_optimizer.device", "zero-infinity", "optimizer_device", _always, str,
            "home of fp32 master weights, Adam m and v, fp32 gradients"),
    KnobKey("zero_optimization.sub_group_size", "zero-infinity", "sub_group_size", _always, int,
            "parameters per optimizer sub-group"),
    KnobKey("zero_optimization.offload_optimizer.pipeline_read", "zero-infinity", "pipeline_io", _optimizer_nvme,
            bool, "overlap the optimizer's NVMe reads and writes with CPU Adam"),
    KnobKey("zero_optimization.offload_optimizer.pipeline_write", "zero-infinity", "pipeline_io", _optimizer_nvme,
            bool, "overlap the optimizer's NVMe reads and writes with CPU Adam"),
    KnobKey("activation_checkpointing.cpu_checkpointing", "zero-infinity", "offload_checkpoints", _always, bool,
            "activation checkpoints to CPU memory between forward and backward"),
)

#: the keys a policy always writes (what makes the policy): path -> value
POLICY_KEYS: dict[str, dict[str, Any]] = {
    "none": {},
    "zero-offload": {"zero_optimization.stage": 2, "zero_optimization.offload_optimizer.device": "cpu"},
    "zero-infinity": {"zero_optimization.stage": 3},
}

#: the knobs a DeepSpeed config fixes although it has no key for them (DeepSpeed's fixed behaviour)
IMPLIED_KNOBS: dict[str, dict[str, Any]] = {
    "none": {"tp": 1},
    "zero-offload": {"tp": 1, "delayed_update": False, "upload_bytes_per_param": 2.0,
                     "grad_offload_bytes_per_param": 2.0, "cpu_grad_bytes": 4.0, "cpu_param_copy_per_rank": False},
    "zero-infinity": {"pipeline_io": False, "offload_checkpoints": False},
}

#: the workload keys (always written): DeepSpeed path -> what it is in tiersim
WORKLOAD_KEYS = {
    "train_micro_batch_size_per_gpu": "micro-batch (--micro-batch)",
    "gradient_accumulation_steps": "micro-steps per step (global batch / (micro-batch x data-parallel ranks))",
    "train_batch_size": "global batch (--global-batch)",
    "fp16.enabled": "precision fp16 (--precision)",
    "bf16.enabled": "precision bf16 (--precision)",
    "activation_checkpointing": "checkpointing full (--checkpointing)",
}

# keys DeepSpeed reads that change nothing tiersim prices: path -> why (a path ending in '.' covers a section)
IGNORED = {
    "zero_optimization.contiguous_gradients": "gradient buffer layout; tiersim counts bytes, not fragmentation",
    "zero_optimization.reduce_scatter": "tiersim reduce-scatters the gradients of ZeRO-2/3 and all-reduces stage 0/1",
    "zero_optimization.reduce_bucket_size": "tiersim reduces one layer's gradients per bucket",
    "zero_optimization.allgather_partitions": "tiersim all-gathers the updated partitions",
    "zero_optimization.allgather_bucket_size": "tiersim all-gathers one layer per collective",
    "zero_optimization.use_multi_rank_bucket_allreduce": "collective implementation detail",
    "zero_optimization.stage3_prefetch_bucket_size": "tiersim prefetches by layer distance (zero-infinity knobs "
                                                     "nvme_prefetch / cpu_prefetch / gather_prefetch)",
    "zero_optimization.stage3_param_persistence_threshold": "tiersim partitions every layer (no persistent small "
                                                            "parameters)",
    "zero_optimization.stage3_model_persistence_threshold": "tiersim partitions every layer",
    "zero_optimization.stage3_max_live_parameters": "tiersim keeps live only the layers its prefetch window holds",
    "zero_optimization.stage3_max_reuse_distance": "tiersim re-fetches a layer for its backward (a small "
                                                   "overestimate of traffic)",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": "checkpoint saving, not the training step",
    "zero_optimization.gather_16bit_weights_on_model_save": "checkpoint saving, not the training step",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save": "checkpoint saving, not the training step",
    "zero_optimization.round_robin_gradients": "gradient copy ordering on the CPU",
    "zero_optimization.load_from_fp32_weights": "checkpoint loading",
    "zero_optimization.elastic_checkpoint": "checkpoint loading",
    "zero_optimization.ignore_unused_parameters": "every parameter is used in tiersim's models",
    "zero_optimization.memory_efficient_linear": "tiersim's activation model counts the saved tensors",
    "zero_optimization.compute_grad_norm": "gradient-norm reporting",
    "zero_optimization.legacy_stage1": "implementation variant",
    "zero_optimization.parameter_alignment": "padding of a few elements",
    "zero_optimization.stage3_module_granularity_threshold": "tiersim fetches per layer",
    "zero_optimization.stage3_use_all_reduce_for_fetch_params": "collective implementation detail",
    "zero_optimization.stage3_allgather_sequential": "collective implementation detail",
    "zero_optimization.pipeline_loading_checkpoint": "checkpoint loading",
    "zero_optimization.override_module_apply": "module initialisation",
    "zero_optimization.log_trace_cache_warnings": "logging",
    "zero_optimization.enable_sanity_checks": "debugging",
    "zero_optimization.save_muon_momentum_buffer_in_memory": "Muon optimizer only",
    "zero_optimization.leaf_module": "MoE leaf modules: tiersim fetches per layer",
    "zero_optimization.zero_quantized_nontrainable_weights": "frozen weights: tiersim trains every parameter",
    "zero_optimization.offload_param.nvme_path": "where the files live; tiersim uses the hardware's NVMe set",
    "zero_optimization.offload_param.buffer_count": "pinned staging pool; tiersim allocates the prefetch window "
                                                    "actually in flight (zero-infinity notes say when it exceeds "
                                                    "DeepSpeed's default pool)",
    "zero_optimization.offload_param.buffer_size": "pinned staging pool; tiersim allocates the window in flight",
    "zero_optimization.offload_param.max_in_cpu": "not modelled: parameters stay at their home device",
    "zero_optimization.offload_optimizer.nvme_path": "where the files live; tiersim uses the hardware's NVMe set",
    "zero_optimization.offload_optimizer.buffer_count": "swap buffers; tiersim allocates one sub-group's (three "
                                                        "with pipeline_io)",
    "zero_optimization.offload_optimizer.fast_init": "initialisation only",
    "zero_optimization.offload_optimizer.cpuadam_cores_perc": "tiersim's CPU Adam rate is the hardware's cpu.adam",
    "activation_checkpointing.partition_activations": "splits checkpoints over model-parallel ranks; a DeepSpeed "
                                                      "config alone runs data-parallel",
    "activation_checkpointing.contiguous_memory_optimization": "buffer layout; tiersim counts bytes",
    "activation_checkpointing.number_checkpoints": "used only with contiguous_memory_optimization",
    "activation_checkpointing.synchronize_checkpoint_boundary": "profiling aid",
    "activation_checkpointing.profile": "profiling aid",
    "fp16.": "loss scaling costs no memory or time tiersim models",
    "bf16.": "settings beyond enabled cost no memory or time tiersim models",
    "optimizer.params": "learning rate and betas change no bytes or seconds",
    "scheduler": "learning-rate schedule",
    "gradient_clipping": "a norm over the gradients, not modelled",
    "steps_per_print": "logging",
    "wall_clock_breakdown": "logging",
    "memory_breakdown": "logging",
    "dump_state": "logging",
    "tensorboard": "logging",
    "wandb": "logging",
    "csv_monitor": "logging",
    "comet": "logging",
    "flops_profiler": "profiling",
    "comms_logger": "logging",
    "timers": "logging",
    "checkpoint": "checkpoint saving",
    "zero_allow_untested_optimizer": "a safety switch",
    "zero_force_ds_cpu_optimizer": "a safety switch",
    "prescale_gradients": "the same bytes move",
    "gradient_predivide_factor": "the same bytes move",
    "gradient_allreduce_op": "the same bytes move",
    "communication_data_type": "tiersim communicates gradients in the training precision",
    "aio": "the NVMe runs at the hardware preset's sustained rate (tiersim hardware show)",
    "data_types": "accumulation dtype of gradients is the training precision in tiersim",
    "dataloader_drop_last": "data loading",
    "disable_allgather": "not modelled",
    "seed": "randomness",
    "compile": "torch.compile: tiersim's compute model is the hardware's efficiency curve",
}

# keys with a value tiersim cannot represent: path -> (the values that are fine, why else)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "zero_optimization.zero_hpz_partition_size": ((0, 1), "ZeRO++ hierarchical partitioning changes which "
                                                          "collectives move which bytes; tiersim does not model it"),
    "zero_optimization.zero_quantized_weights": ((False,), "ZeRO++ quantized weights are not modelled"),
    "zero_optimization.zero_quantized_gradients": ((False,), "ZeRO++ quantized gradients are not modelled"),
    "zero_optimization.offload_optimizer.ratio": ((1, 1.0), "partial optimizer offload (ratio < 1) is not modelled"),
    "zero_optimization.offload_optimizer.super_offload": ((False,), "SuperOffload is not modelled"),
    "zero_optimization.zenflow": ((None,), "ZenFlow is not modelled"),
    "zero_optimization.cpu_offload": ((None, False), "deprecated alias; write offload_optimizer: {device: cpu}"),
    "zero_optimization.cpu_offload_param": ((None, False), "deprecated alias; write offload_param: {device: cpu}"),
    "zero_optimization.cpu_offload_use_pin_memory": ((None,), "deprecated alias; write offload_*: {pin_memory: ...}"),
    "fp16.fp16_master_weights_and_grads": ((False,), "16-bit master weights change the bytes per parameter"),
    "bf16.bf16_master_weights_and_grads": ((False,), "16-bit master weights change the bytes per parameter"),
    "bf16.bf16_optimizer_states": ((False,), "16-bit optimizer states change the bytes per parameter"),
    "torch_autocast.enabled": ((False,), "torch autocast keeps fp32 parameters; use fp16 or bf16"),
    "sequence_parallel_size": ((1,), "sequence parallelism is not modelled"),
    "pipeline": ((None,), "pipeline parallelism comes with a PipelineModule in the model code; tiersim's "
                          "pipeline policy is tinypipe (simulate --policy tinypipe)"),
}

#: optimizers whose state is Adam's (fp32 master, m, v: 12 B/param), as tiersim models (lower-case names)
ADAM_LIKE = ("adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam", "torch.optim.adamw", "torch_adam")

#: Hugging Face ``TrainingArguments`` defaults used for "auto" when neither a flag nor a wrapper file sets them
#: (transformers 5.24.0, training_args.py: per_device_train_batch_size=8, gradient_accumulation_steps=1,
#: fp16=False, bf16=False, max_grad_norm=1.0)
HF_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "fp16": False, "bf16": False,
               "max_grad_norm": 1.0}

#: "auto" keys HF fills from TrainingArguments / the model and tiersim does not price: path -> HF's rule
HF_AUTO_UNPRICED = {
    "gradient_clipping": "TrainingArguments.max_grad_norm (default 1.0)",
    "optimizer.params.lr": "TrainingArguments.learning_rate",
    "optimizer.params.betas": "TrainingArguments.adam_beta1, adam_beta2",
    "optimizer.params.eps": "TrainingArguments.adam_epsilon",
    "optimizer.params.weight_decay": "TrainingArguments.weight_decay",
    "scheduler.params.warmup_min_lr": "0",
    "scheduler.params.warmup_max_lr": "TrainingArguments.learning_rate",
    "scheduler.params.total_num_steps": "the number of training steps",
    "scheduler.params.warmup_num_steps": "TrainingArguments warmup steps",
}


def get_path(d: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or None."""
    node: Any = d
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def set_path(d: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path, creating the sections on the way."""
    *parents, last = path.split(".")
    node = d
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def leaves(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Every (dotted path, value) of a nested mapping whose value is not a mapping."""
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.extend(leaves(v, f"{path}."))
        else:
            out.append((path, v))
    return out


def ignored_reason(path: str) -> str | None:
    """Why tiersim does not price this key, or None when it is not one of the ignored ones."""
    if path in IGNORED:
        return IGNORED[path]
    for prefix, why in IGNORED.items():
        if path.startswith(f"{prefix}." if not prefix.endswith(".") else prefix):
            return why
    return None


def show(v: Any) -> str:
    """A config value as JSON writes it (a section as ``{...}``, a whole float as ``1e+09``)."""
    if isinstance(v, Mapping):
        return "{...}"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
