"""``zero-infinity``'s decisions about sizes: where each model state lives, the optimizer's sub-groups,
NVMe traffic per step, and the lower bounds of what each memory pool must hold (feasibility)."""

from __future__ import annotations

from hardware_models import build_topology
from policies import kit
from policies.base import Job, PlanInfeasible
from policies.zero_infinity.knobs import NAME, Knobs

DS_PARAM_BUFFERS = 5          # DeepSpeed offload_param.buffer_count
DS_PARAM_BUFFER_SIZE = 1e8    # DeepSpeed offload_param.buffer_size (elements)
DS_OPTIMIZER_BUFFERS = 4      # DeepSpeed offload_optimizer.buffer_count (p32, g32, m, v of one sub-group)


def per_param_bytes(job: Job, knobs: Knobs) -> dict[str, float]:
    """Bytes per parameter of each model state (ZeRO-Infinity's 20 B/param with bf16/fp16)."""
    db = kit.dtype_bytes(job)
    mixed = db < 4
    return {"param16": float(db), "grad": knobs.grad_bytes_per_param, "param32": 4.0 if mixed else 0.0,
            "optim": 8.0, "grad32": 4.0}


def state_homes(knobs: Knobs) -> dict[str, str]:
    return {"param16": knobs.param_device, "grad": "cpu", "param32": knobs.optimizer_device,
            "optim": knobs.optimizer_device, "grad32": knobs.optimizer_device}


def model_state_bytes(job: Job, knobs: Knobs) -> dict[str, dict[str, float]]:
    """Whole-machine model-state bytes by location and kind."""
    p = float(job.trace.params)
    out: dict[str, dict[str, float]] = {}
    for kind, nb in per_param_bytes(job, knobs).items():
        if nb > 0:
            out.setdefault(state_homes(knobs)[kind], {})[kind] = nb * p
    return out


def sub_groups(job: Job, n: int, size: int) -> list[list[int]]:
    """Consecutive layers whose per-rank partition holds at most ``size`` parameters (a bigger layer alone)."""
    groups: list[list[int]] = []
    cur: list[int] = []
    acc = 0.0
    for i, layer in enumerate(job.trace.layers):
        s = layer.params / n
        if cur and acc + s > size:
            groups.append(cur)
            cur, acc = [], 0.0
        cur.append(i)
        acc += s
    if cur:
        groups.append(cur)
    return groups


def nvme_bytes_per_step(job: Job, knobs: Knobs, accumulation: int) -> dict[str, float]:
    """Bytes read and written over nvme.io per step (package docstring)."""
    p = float(job.trace.params)
    db = kit.dtype_bytes(job)
    pp = per_param_bytes(job, knobs)
    read = write = 0.0
    if knobs.param_device == "nvme":
        read += 2 * db * p * accumulation
        write += db * p
    if knobs.optimizer_device == "nvme":
        states = pp["param32"] + pp["optim"]
        read += (states + pp["grad32"]) * p
        write += (states + pp["grad32"]) * p
    return {"read": read, "write": write}


def offloads_ckpt(job: Job, knobs: Knobs, i: int) -> bool:
    """Whether layer i's saved activations go to CPU memory between its forward and its backward."""
    layer = job.trace.layers[i]
    return knobs.offload_checkpoints and layer.kind == "block" and layer.activation_bytes > 0


def param_pinned_window(job: Job, knobs: Knobs, n: int) -> float:
    """Elements per rank staged in pinned CPU memory at once on the NVMe path (an upper estimate)."""
    if knobs.param_device != "nvme":
        return 0.0
    depth = max(knobs.nvme_prefetch - min(knobs.cpu_prefetch, knobs.nvme_prefetch), 0) + 1
    return depth * max(layer.params for layer in job.trace.layers) / n


def check_fit(job: Job, knobs: Knobs, n: int, groups: list[list[int]]) -> dict[str, float]:
    """Lower bounds of what each pool must hold at once; PlanInfeasible when one is over capacity."""
    topo = build_topology(job.hw)
    layers = job.trace.layers
    db = kit.dtype_bytes(job)
    pp = per_param_bytes(job, knobs)
    full = max(layer.params for layer in layers) * db
    ws = max(layer.peak_transient_bytes for layer in layers)
    kept = [layer.activation_bytes for i, layer in enumerate(layers) if not offloads_ckpt(job, knobs, i)]
    moved = [layer.activation_bytes for i, layer in enumerate(layers) if offloads_ckpt(job, knobs, i)]
    gpu_need = n * (ws + sum(kept) + max(moved, default=0) + 2 * full)  # backward of the largest layer
    need: dict[str, float] = {}
    what: dict[str, list[str]] = {}

    def add(loc: str, nbytes: float, label: str) -> None:
        pool = topo.pool_of[loc]
        need[pool] = need.get(pool, 0.0) + nbytes
        what.setdefault(pool, []).append(label)

    for g in range(n):
        add(f"gpu{g}", gpu_need / n, "")
    what = {k: ["the GPU working set (workspace, activations, a gathered layer and its gradient bucket)"]
            for k in what}
    for loc, kinds in model_state_bytes(job, knobs).items():
        add(loc, sum(kinds.values()), f"model states ({', '.join(f'{k} {v / 1e9:.0f} GB' for k, v in kinds.items())})")
    if moved:
        add("cpu", n * sum(moved), "offloaded activation checkpoints")
    if knobs.optimizer_device == "nvme":
        q = max(sum(layers[i].params for i in grp) / n for grp in groups)
        add("cpu", n * q * (pp["param32"] + pp["optim"] + pp["grad32"]), "one sub-group's optimizer swap buffers")
    for pool, nbytes in need.items():
        cap = topo.pools[pool].capacity_bytes
        if nbytes > cap:
            raise PlanInfeasible(NAME, pool, nbytes, cap, " + ".join(dict.fromkeys(what[pool])))
    return need
