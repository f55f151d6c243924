"""tiersim's model-state bytes beside DeepSpeed's own estimator, every difference named in bytes.

DeepSpeed's helpers (DeepSpeed 0.19.8, ``deepspeed/runtime/zero/stage_1_and_2.py``
``estimate_zero2_model_states_mem_needs`` and ``deepspeed/runtime/zero/stage3.py``
``estimate_zero3_model_states_mem_needs``) are restated here term for term (tiersim does not import
DeepSpeed; ``tests/test_deepspeed_memory.py`` checks the restatement against the installed helpers), with
``additional_buffer_factor`` 1 (DeepSpeed's default 1.5 is a safety margin, not a count) and one node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simulator import Plan

MODEL_STATE_KINDS = ("param16", "param32", "grad", "grad32", "optim")


def zero2_estimate(total_params: float, num_gpus_per_node: int = 1, num_nodes: int = 1, cpu_offload: bool = True,
                   additional_buffer_factor: float = 1.5) -> tuple[int, int]:
    """(cpu bytes, gpu bytes) as ``estimate_zero2_model_states_mem_needs`` computes them."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def zero3_estimate(total_params: float, largest_layer_params: float, num_gpus_per_node: int = 1, num_nodes: int = 1,
                   cpu_offload: bool = True, cpu_offload_params: bool = True, zero_init: bool = True,
                   additional_buffer_factor: float = 1.5) -> tuple[int, int, float]:
    """(cpu bytes, gpu bytes, largest layer bytes) as ``estimate_zero3_model_states_mem_needs`` computes them."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


@dataclass(frozen=True)
class Comparison:
    """DeepSpeed's estimate and tiersim's count of model states: per GPU and host (CPU + NVMe, one node)."""

    helper: str
    ds_gpu: float
    ds_host: float
    tiersim_gpu: float
    tiersim_host: float
    differences: tuple[tuple[str, float, str], ...]  # (gpu|host, tiersim minus DeepSpeed bytes, why)

    def lines(self) -> list[str]:
        out = [f"DeepSpeed's estimator ({self.helper}, additional_buffer_factor=1): model states "
               f"{self.ds_gpu / 1e9:.2f} GB per GPU, {self.ds_host / 1e9:.2f} GB host",
               f"tiersim's model states: {self.tiersim_gpu / 1e9:.2f} GB per GPU, {self.tiersim_host / 1e9:.2f} GB "
               "host (CPU + NVMe)" + ("; the same count" if not self.differences else "")]
        out += [f"  {side}: tiersim {b / 1e9:+.2f} GB: {why}" for side, b, why in self.differences]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"helper": self.helper, "deepspeed": {"gpu": self.ds_gpu, "host": self.ds_host},
                "tiersim": {"gpu": self.tiersim_gpu, "host": self.tiersim_host},
                "differences": [{"side": s, "bytes": b, "why": w} for s, b, w in self.differences]}


def plan_model_states(plan: Plan) -> tuple[float, float]:
    """(bytes on GPU 0, bytes on the host's CPU and NVMe) of the plan's persistent model states (with the host's
    persistent buffers: zero-offload's per-rank fp32 copies)."""
    gpu = host = 0.0
    for t in plan.tensors:
        if not t.persistent or t.home is None or t.kind not in MODEL_STATE_KINDS + ("buffer",):
            continue
        if t.home == "gpu0" and t.kind != "buffer":  # a GPU buffer is workspace, not a model state
            gpu += t.bytes
        elif t.home in ("cpu", "nvme"):
            host += t.bytes
    return gpu, host


def compare(plan: Plan) -> Comparison | None:
    """The comparison for a plan of none (stage 2 or 3), zero-offload or zero-infinity, data parallel only
    (DeepSpeed's helpers know nothing else); None otherwise."""
    knobs: Mapping[str, Any] = plan.knobs
    n = plan.hardware.gpu.count
    p = float(plan.workload.model.params())
    layers = [t.bytes for t in plan.tensors if t.kind == "param16" and t.layer is not None and t.scope == "iteration"]
    largest = max(layers, default=0.0) / _dtype_bytes(plan)
    tp = int(plan.info.get("tp", knobs.get("tp", 1)) or 1)
    if tp != 1 or _dtype_bytes(plan) != 2:
        return None
    gpu, host = plan_model_states(plan)
    diffs: list[tuple[str, float, str]] = []
    if plan.policy == "zero-offload":
        ds_host, ds_gpu = zero2_estimate(p, n, cpu_offload=True, additional_buffer_factor=1)
        helper = "estimate_zero2_model_states_mem_needs, cpu_offload"
        cg = float(knobs.get("cpu_grad_bytes", 4.0))
        if cg != 4.0:
            diffs.append(("host", (cg - 4) * p, f"knob cpu_grad_bytes={cg:g}: DeepSpeed's CPU gradient buffer is fp32"))
        if knobs.get("cpu_param_copy_per_rank"):
            diffs.append(("host", (16 + 4 * n - max(4 * n, 16)) * p, "tiersim counts the steady state (16 B/param) "
                          f"and every rank's fp32 copy (4 B/param x {n}) together; DeepSpeed's estimator takes the "
                          "larger of the two"))
        elif 4 * n > 16:
            diffs.append(("host", 16 * p - 4 * n * p, f"DeepSpeed budgets 4 B/param per GPU process ({n} x 4 > 16): "
                                                       "each loads an fp32 copy at start-up; tiersim counts the "
                                                       "steady state (knob cpu_param_copy_per_rank adds the copies)"))
        _rest(diffs, host, ds_host, gpu, ds_gpu, "knob cpu_grad_bytes / cpu_param_copy_per_rank")
    elif plan.policy == "none" and knobs.get("stage") == 2:
        ds_host, ds_gpu = zero2_estimate(p, n, cpu_offload=False, additional_buffer_factor=1)
        helper = "estimate_zero2_model_states_mem_needs, no offload"
        diffs.append(("gpu", -(int(18 * p / n) - int(14 * p / n)), "DeepSpeed's 18 B/param over the ranks include "
                      "an fp32 gradient partition (4 B/param) for the step; tiersim's none plan counts 14 (16-bit "
                      "gradients, fp32 master, m, v)"))
        diffs.append(("host", -ds_host, "DeepSpeed's CPU figure is start-up (each process loads the fp32 model, "
                      "4 B/param per GPU); tiersim prices the training step"))
        _rest(diffs, host, ds_host, gpu, ds_gpu, "rounding")
    elif plan.policy == "none" and knobs.get("stage") == 3:
        ds_host, ds_gpu, big = zero3_estimate(p, largest, n, cpu_offload=False, cpu_offload_params=False,
                                              additional_buffer_factor=1)
        helper = "estimate_zero3_model_states_mem_needs, no offload, zero_init"
        diffs.append(("gpu", -big, "DeepSpeed's 4 B x largest layer (its gathered 16-bit parameters and gradients): "
                      "tiersim allocates them per use, in the peak's param16/grad transients"))
        diffs.append(("gpu", -(int(18 * p / n) - 16 * p / n), "DeepSpeed counts 18 B/param over the ranks (an fp32 "
                      "gradient partition); tiersim 16"))
        diffs.append(("host", -ds_host, "DeepSpeed's CPU figure is start-up (zero_init: 4 B x largest layer per "
                      "GPU); tiersim prices the training step"))
        _rest(diffs, host, ds_host, gpu, ds_gpu, "rounding")
    elif plan.policy == "zero-infinity":
        ds_host, ds_gpu, big = zero3_estimate(p, largest, n, cpu_offload=True, cpu_offload_params=True,
                                              additional_buffer_factor=1)
        helper = "estimate_zero3_model_states_mem_needs, offload_param + offload_optimizer, zero_init"
        diffs.append(("gpu", -big, "DeepSpeed's 4 B x largest layer (its gathered 16-bit parameters and gradients): "
                      "tiersim allocates them per use, in the peak's param16/grad transients"))
        grad16 = float(plan.info.get("bytes_per_param", {}).get("grad", {}).get("bytes", 0.0))
        if grad16:  # the plan keeps a 16-bit CPU gradient buffer (accumulation, or knob cpu_grad_buffer=always)
            diffs.append(("host", grad16 * p,
                          "the 16-bit gradient buffer DeepSpeed keeps on the CPU when it accumulates gradients "
                          "(or, later versions, always), outside the estimator's 18 B/param"))
        if knobs.get("param_device") == "nvme" or knobs.get("optimizer_device") == "nvme":
            helper += " (it knows CPU offload only; tiersim's host count includes NVMe)"
        _rest(diffs, host, ds_host, gpu, ds_gpu, "the plan's own accounting")
    else:
        return None
    return Comparison(helper, float(ds_gpu), float(ds_host), gpu, host, tuple(diffs))


def _rest(diffs: list[tuple[str, float, str]], host: float, ds_host: float, gpu: float, ds_gpu: float,
          what: str) -> None:
    """Name whatever the listed differences leave unexplained (nothing when the counts agree)."""
    for side, mine, theirs in (("gpu", gpu, ds_gpu), ("host", host, ds_host)):
        left = mine - theirs - sum(b for s, b, _ in diffs if s == side)
        if abs(left) > 1e-6 * max(mine, theirs, 1.0):
            diffs.append((side, left, f"unexplained by the above ({what})"))


def _dtype_bytes(plan: Plan) -> int:
    return 2 if plan.workload.config.precision in ("bf16", "fp16") else 4


def beyond_model_states(peak_by_kind: Mapping[str, Mapping[str, float]]) -> list[str]:
    """What tiersim's simulated peak holds besides model states, per pool (activations, buffers, ...)."""
    out = []
    for pool, kinds in peak_by_kind.items():
        if pool.startswith("gpu") and pool != "gpu0":
            continue  # the GPUs are alike; gpu0 speaks for them
        extra = {k: v for k, v in kinds.items() if k not in MODEL_STATE_KINDS and v > 0}
        if extra:
            out.append(f"  {pool} peak also holds (not in DeepSpeed's estimate): "
                       + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in sorted(extra.items())))
    return out
