"""``zero-infinity``'s knobs and its decisions about sizes: where each model state lives, the optimizer's
sub-groups, NVMe traffic per step, and the lower bounds of what each memory pool must hold (feasibility)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from hardware_models import build_topology
from policies import kit
from policies.base import Job, KnobError, PlanInfeasible

NAME = "zero-infinity"
DS_PARAM_BUFFERS = 5          # DeepSpeed offload_param.buffer_count
DS_PARAM_BUFFER_SIZE = 1e8    # DeepSpeed offload_param.buffer_size (elements)
DS_OPTIMIZER_BUFFERS = 4      # DeepSpeed offload_optimizer.buffer_count
DS_REDUCE_BUCKET_SIZE = 5e8   # DeepSpeed zero_optimization.reduce_bucket_size (elements; zero/config.py default)
DS_REDUCE_EVENTS = 2          # DeepSpeed stage3.py max_param_reduce_events (reductions in flight, not configurable)


_STAGE3 = ("ZeRO-Infinity offloads by definition; for ZeRO-3 with everything on the GPUs use "
           "--policy none --knob stage=3")


@dataclass(frozen=True)
class Knobs:
    KNOB_ADVICE: ClassVar[Mapping[tuple[str, str], str]] = {("param_device", "gpu"): _STAGE3,
                                                          ("optimizer_device", "gpu"): _STAGE3}
    param_device: Literal["cpu", "nvme"] = "cpu"
    optimizer_device: Literal["cpu", "nvme"] = "cpu"
    nvme_prefetch: int = 3
    cpu_prefetch: int = 2
    gather_prefetch: int = 1
    sub_group_size: int = 1_000_000_000
    pipeline_io: bool = True
    offload_checkpoints: bool = False
    grad_bytes_per_param: float = 2.0
    cpu_grad_buffer: Literal["auto", "always"] = "auto"
    tile_factor: int | Literal["auto"] = "auto"

    def validate(self) -> None:
        if self.cpu_grad_buffer not in ("auto", "always"):
            raise KnobError(f"{NAME}: knob 'cpu_grad_buffer' must be auto (a 16-bit CPU buffer only when "
                            f"accumulating over micro-steps, DeepSpeed 0.3-0.4 as in the paper) or always (one "
                            f"whole-model buffer, later DeepSpeed), got {self.cpu_grad_buffer!r}")
        if self.tile_factor != "auto" and (isinstance(self.tile_factor, bool) or not isinstance(self.tile_factor, int)
                                           or self.tile_factor < 1):
            raise KnobError(f"{NAME}: knob 'tile_factor' must be auto or an integer >= 1 (1 = no tiling), "
                            f"got {self.tile_factor!r}")
        for name in ("param_device", "optimizer_device"):
            value = getattr(self, name)
            if value == "gpu":
                raise KnobError(f"{NAME}: knob '{name}' must be cpu or nvme, got 'gpu'; {_STAGE3}")
            if value not in ("cpu", "nvme"):
                raise KnobError(f"{NAME}: knob '{name}' must be cpu or nvme, got {value!r} (all on the GPUs: "
                                f"--policy none --knob stage=3)")
        for name in ("nvme_prefetch", "cpu_prefetch", "gather_prefetch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise KnobError(f"{NAME}: knob '{name}' must be an integer >= 0 (0 = fetch on demand), got {v!r}")
        if isinstance(self.sub_group_size, bool) or not isinstance(self.sub_group_size, int) \
                or self.sub_group_size < 1:
            raise KnobError(f"{NAME}: knob 'sub_group_size' must be a positive number of parameters, "
                            f"got {self.sub_group_size!r}")
        if self.grad_bytes_per_param not in (2.0, 4.0):
            raise KnobError(f"{NAME}: knob 'grad_bytes_per_param' must be 2 (fp16/bf16) or 4 (fp32), "
                            f"got {self.grad_bytes_per_param!r}")

    @property
    def param_nvme(self) -> bool:
        return self.param_device == "nvme"

    @property
    def optimizer_nvme(self) -> bool:
        return self.optimizer_device == "nvme"

    def check_devices(self, job: Job) -> None:
        """KnobError naming the knob when an NVMe home is asked of a machine without a drive."""
        for name in ("param_device", "optimizer_device"):
            if getattr(self, name) == "nvme" and job.hw.nvme is None:
                raise KnobError(f"{NAME}: knob '{name}' = nvme but {job.hw.name} has no NVMe drive; use cpu")


def has_cpu_grad_buffer(job: Job, knobs: Knobs) -> bool:
    """Whether each rank keeps a 16-bit gradient partition buffer on the CPU.

    DeepSpeed 0.3-0.4 (the ZeRO-Infinity paper's code), ``deepspeed/runtime/zero/stage3.py``
    ``partition_previous_reduced_grads``: with ``offload_optimizer`` the 16-bit partition buffers
    (``grads_in_partition``, one per sub-group of ``fp16_groups``) are allocated only when
    ``gradient_accumulation_steps > 1``; otherwise each reduced gradient partition goes from the GPU straight
    into its sub-group's fp32 gradient (``fp32_partitioned_groups_flat[i].grad`` on the CPU, or
    ``param.grad.float()`` handed to ``optimizer_swapper.swap_out_gradients`` when the sub-group is swapped to
    NVMe). Later DeepSpeed (``_setup_for_real_optimizer``: ``grad_partitions_flat_buffer``) always keeps one
    whole-model 16-bit buffer on the CPU: ``cpu_grad_buffer=always``.
    """
    return knobs.cpu_grad_buffer == "always" or job.accumulation(job.n_gpus) > 1


def per_param_bytes(job: Job, knobs: Knobs) -> dict[str, float]:
    """Bytes per parameter of each model state (ZeRO-Infinity's 20 B/param with bf16/fp16; 18 without the
    16-bit CPU gradient buffer, ``has_cpu_grad_buffer``)."""
    db = kit.dtype_bytes(job)
    grad = knobs.grad_bytes_per_param if has_cpu_grad_buffer(job, knobs) else 0.0
    return {"param16": float(db), "grad": grad, "param32": 4.0 if db < 4 else 0.0,
            "optim": 8.0, "grad32": 4.0}


def state_homes(knobs: Knobs) -> dict[str, str]:
    return {"param16": knobs.param_device, "grad": "cpu", "param32": knobs.optimizer_device,
            "optim": knobs.optimizer_device, "grad32": knobs.optimizer_device}


def model_state_bytes(job: Job, knobs: Knobs) -> dict[str, dict[str, float]]:
    """Whole-machine model-state bytes by location and kind."""
    out: dict[str, dict[str, float]] = {}
    for kind, nb in per_param_bytes(job, knobs).items():
        if nb > 0:
            out.setdefault(state_homes(knobs)[kind], {})[kind] = nb * float(job.trace.params)
    return out


def sub_groups(job: Job, n: int, size: int) -> list[list[int]]:
    """Consecutive layers whose per-rank partition holds at most ``size`` parameters (a bigger layer alone)."""
    groups: list[list[int]] = [[]]
    acc = 0.0
    for i, layer in enumerate(job.trace.layers):
        if groups[-1] and acc + layer.params / n > size:
            groups.append([])
            acc = 0.0
        groups[-1].append(i)
        acc += layer.params / n
    return groups if groups[-1] else []


def nvme_bytes_per_step(job: Job, knobs: Knobs, accumulation: int) -> dict[str, float]:
    """Bytes read and written over nvme.io per step (package docstring)."""
    p, db, pp = float(job.trace.params), kit.dtype_bytes(job), per_param_bytes(job, knobs)
    read = write = 0.0
    if knobs.param_device == "nvme":
        read += 2 * db * p * accumulation
        write += db * p
    if knobs.optimizer_device == "nvme":
        read += (pp["param32"] + pp["optim"] + pp["grad32"]) * p
        write += (pp["param32"] + pp["optim"] + pp["grad32"]) * p
    return {"read": read, "write": write}


def offloads_ckpt(job: Job, knobs: Knobs, i: int) -> bool:
    """Whether layer i's saved activations go to CPU memory between its forward and its backward."""
    layer = job.trace.layers[i]
    return knobs.offload_checkpoints and layer.kind == "block" and layer.activation_bytes > 0


def grad_buckets_in_flight(job: Job) -> int:
    """Layers whose 16-bit gradient bucket may be on a GPU at once (being filled, reduced or copied to its
    home) before a layer's backward waits: the ``kit.bucket_gate`` bound of this policy.

    DeepSpeed (``deepspeed/runtime/zero/stage3.py``): gradients are copied into the contiguous ipg bucket of
    ``reduce_bucket_size`` elements (``__add_grad_to_ipg_bucket``; the buffer is allocated once in
    ``_setup_for_real_optimizer``); a full bucket is reduce-scattered and its partitions moved to their home on
    ``reduce_and_partition_stream`` (``__reduce_and_partition_ipg_grads`` -> ``partition_grads``), and when more
    than ``max_param_reduce_events`` (2) of those are outstanding the gradient hook synchronizes on the oldest,
    so the backward waits. At most ``DS_REDUCE_EVENTS x DS_REDUCE_BUCKET_SIZE`` gradient elements are in flight
    per GPU; in our unit (a whole layer) that is this many of the largest layer, and at least two: a layer
    larger than the budget is split by DeepSpeed into buckets whose copies overlap the rest of its own
    backward, so the backward never waits for the whole previous layer to leave. A bound of one whole layer
    would serialize every layer's backward behind the previous layer's copy (70B on a100x8: +18% step time,
    19 s of exposed transfer), which DeepSpeed does not do; two layers keep that overlap at the price of
    holding up to one layer more than DeepSpeed's budget."""
    largest = max(layer.params for layer in job.trace.layers)
    return max(2, int(DS_REDUCE_EVENTS * DS_REDUCE_BUCKET_SIZE // max(largest, 1.0)))


def param_pinned_window(job: Job, knobs: Knobs, n: int) -> float:
    """Elements per rank staged in pinned CPU memory at once on the NVMe path (an upper estimate)."""
    if knobs.param_device != "nvme":
        return 0.0
    depth = max(knobs.nvme_prefetch - min(knobs.cpu_prefetch, knobs.nvme_prefetch), 0) + 1
    return depth * max(layer.params for layer in job.trace.layers) / n


def check_fit(job: Job, knobs: Knobs, n: int, groups: list[list[int]]) -> dict[str, float]:
    """Lower bounds of what each pool must hold at once; PlanInfeasible when one is over capacity."""
    topo, layers, pp = build_topology(job.hw), job.trace.layers, per_param_bytes(job, knobs)
    full = max(layer.params for layer in layers) * kit.dtype_bytes(job)
    ws = max(layer.peak_transient_bytes for layer in layers)
    kept = [layer.activation_bytes for i, layer in enumerate(layers) if not offloads_ckpt(job, knobs, i)]
    moved = [layer.activation_bytes for i, layer in enumerate(layers) if offloads_ckpt(job, knobs, i)]
    gpu_need = n * (ws + sum(kept) + max(moved, default=0) + 2 * full)  # backward of the largest layer
    need: dict[str, float] = {}
    what: dict[str, list[str]] = {}  # pool -> what it must hold

    def add(loc: str, nbytes: float, label: str) -> None:
        pool = topo.pool_of[loc]
        need[pool] = need.get(pool, 0.0) + nbytes
        what.setdefault(pool, []).append(label)

    for g in range(n):
        add(f"gpu{g}", gpu_need / n, "the GPU working set (workspace, activations, a gathered layer and its "
                                     "gradient bucket)")
    for loc, kinds in model_state_bytes(job, knobs).items():
        add(loc, sum(kinds.values()), f"model states ({', '.join(f'{k} {v / 1e9:.0f} GB' for k, v in kinds.items())})")
    if moved:
        add("cpu", n * sum(moved), "offloaded activation checkpoints")
    if knobs.optimizer_nvme:
        q = max(sum(layers[i].params for i in grp) / n for grp in groups)
        add("cpu", n * q * (pp["param32"] + pp["optim"] + pp["grad32"]), "one sub-group's optimizer swap buffers")
    for pool, nbytes in need.items():
        if nbytes > (cap := topo.pools[pool].capacity_bytes):
            raise PlanInfeasible(NAME, pool, nbytes, cap, " + ".join(dict.fromkeys(what[pool])))
    return need
