"""``tinypipe``'s cost model: what the packing search knows of each layer, and per-parameter state bytes.

A layer's time per micro-batch is its compute (forward, recompute, backward: each task priced by
``costs.ComputePricer`` as the engine charges it, a roofline plus a launch on the presets, operator by
operator on a calibrated spec) and, when swapped, its transfers over a GPU's DRAM route with every GPU
swapping (``swap_link``, the engine's max-min sharing): two fetches of its 16-bit weights (forward and
backward) one way and its gradient the other, ``max(2 w / one-way, 3 w / both-ways)``. A pack adds the
route's copy latency three times (``pack_overhead_s``). The tied embedding table counts in the head's figures too.
"""

from __future__ import annotations

from costs import ComputePricer, link_capacities, slowest_transfer_rate, transfer_rates
from hardware_models import Topology, build_topology
from policies.base import Job
from policies.kit import dtype_bytes
from policies.tinypipe.packing import LayerCost
from policies.tinypipe.pipeline import Pipeline
from simulator.phase import Phase

GRAD32_BYTES = 4.0      # CPU-side fp32 gradient accumulator per parameter
ADAM_BYTES = 8.0        # Adam m and v, fp32
BOUNCE_BUFFERS = 2      # pinned upload buffers per GPU (resident stages)


def master_bytes(job: Job) -> float:
    """fp32 master weights per parameter: none when training in fp32."""
    return 0.0 if job.config.precision == "fp32" else 4.0


def table_params(job: Job) -> float:
    """Parameters of the tied embedding table (0 when the head has its own)."""
    return float(job.model.vocab * job.model.hidden) if job.model.tied_embeddings else 0.0


def swap_link(job: Job) -> tuple[float, float, float]:
    """:func:`swap_rates` of the job's machine."""
    return swap_rates(build_topology(job.hw))


def swap_rates(topo: Topology) -> tuple[float, float, float]:
    """(one-way bytes/s, both-ways bytes/s, latency) of a GPU's DRAM route while every GPU swaps at once,
    priced as the engine shares links (max-min fair over the routes' resources, ``costs``): one way, the
    slowest of every GPU's upload; both ways, the least over GPUs of its upload's and download's rates with
    every GPU uploading and downloading; the largest route latency. The search gives every stage these
    rates (the slowest GPU's), as it gives every stage one cost per layer."""
    caps = link_capacities(topo)
    gpus = topo.gpu_locations()
    one, lat = slowest_transfer_rate(topo, [("cpu", g) for g in gpus], caps)
    rates = transfer_rates(topo, [pair for g in gpus for pair in (("cpu", g), (g, "cpu"))], caps)
    both = min(rates[2 * k] + rates[2 * k + 1] for k in range(len(gpus)))
    return one, both, lat


def layer_costs(job: Job) -> tuple[list[LayerCost], float]:
    """Per-layer costs for the search, and the per-pack overhead (seconds per micro-batch)."""
    price = ComputePricer(job.hw, job.config.precision, (job.model, job.config)).seconds
    one, both, lat = swap_link(job)
    db = dtype_bytes(job)
    master = master_bytes(job)
    table = table_params(job)
    last = len(job.trace.layers) - 1
    out = []
    for i, ly in enumerate(job.trace.layers):
        c = price(ly.fwd_flops, ly.fwd_hbm_bytes, i, Phase.FWD)
        if ly.recompute_flops > 0:
            c += price(ly.recompute_flops, ly.fwd_hbm_bytes, i, Phase.RECOMPUTE)
        c += price(ly.bwd_flops, ly.bwd_hbm_bytes, i, Phase.BWD)
        extra = table if i == last else 0.0
        w = float(ly.param_bytes) + extra * db
        x = max(2 * w / one, 3 * w / both)
        st = float(ly.master_bytes + ly.optimizer_bytes) + extra * (master + ADAM_BYTES)
        out.append(LayerCost(c, x, w, st, float(ly.activation_bytes), float(ly.peak_transient_bytes)))
    return out, 3 * lat


def dram_bytes(pipe: Pipeline, job: Job) -> dict[str, float]:
    """DRAM the plan keeps, by purpose, for the feasibility check and ``info``: per CPU-optimised stage
    its fp32 master, Adam m and v and fp32 gradient accumulator; swapped packs' 16-bit homes; resident
    stages' bounce buffers; without active CPU memory management, every GPU's own 16-bit stage copy."""
    master = master_bytes(job)
    out = {"param32": 0.0, "optim": 0.0, "grad32": 0.0, "swap_home16": 0.0, "bounce": 0.0, "naive16": 0.0}
    for st in pipe.stages:
        if st.mode == "gpu":
            continue
        p = pipe.stage_params(st)
        out["param32"] += master * p
        out["optim"] += ADAM_BYTES * p
        out["grad32"] += GRAD32_BYTES * p
        if st.mode == "swap":
            out["swap_home16"] += sum(pipe.pack_home_bytes(st.index, u, t) for u, t in st.packs)
        else:
            # per GPU BOUNCE_BUFFERS of a layer's 1/dp share, on dp GPUs
            out["bounce"] += BOUNCE_BUFFERS * max(pipe.layer_bytes(st.index, x) for x in range(st.first, st.last + 1))
    if not pipe.active_cpu_mm and not pipe.unified:
        out["naive16"] = pipe.dp * sum(pipe.stage_bytes(st) for st in pipe.stages)
    return out
