"""``tinypipe``'s cost model: what the packing search knows of each layer, and per-parameter state bytes.

A layer's time per micro-batch is its compute (forward, recompute, backward: each task priced by
``costs.ComputePricer`` as the engine charges it) and, when swapped, its transfers over a GPU's DRAM route with
every GPU swapping (``swap_rates``): two fetches of its 16-bit weights one way and its gradient the other,
``max(2 w / one-way, 3 w / both-ways)``. A pack adds the route's copy latency three times (``pack_overhead_s``).
The tied embedding table counts in the head's figures too.
"""

from __future__ import annotations

from costs import ComputePricer, link_capacities, slowest_transfer_rate, transfer_rates
from hardware_models import Topology, build_topology
from policies.base import Job
from policies.kit import dtype_bytes
from policies.tinypipe.packing import LayerCost
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


def swap_rates(topo: Topology) -> tuple[float, float, float]:
    """(one-way bytes/s, both-ways bytes/s, latency) of a GPU's DRAM route while every GPU swaps at once, priced
    as the engine shares links (max-min fair, ``costs``): one way, the slowest of every GPU's upload; both ways,
    the least over GPUs of its upload's and download's rates with every GPU uploading and downloading; the
    largest route latency. The search gives every stage these rates (the slowest GPU's)."""
    caps = link_capacities(topo)
    gpus = topo.gpu_locations()
    one, lat = slowest_transfer_rate(topo, [("cpu", g) for g in gpus], caps)
    rates = transfer_rates(topo, [pair for g in gpus for pair in (("cpu", g), (g, "cpu"))], caps)
    both = min(rates[2 * k] + rates[2 * k + 1] for k in range(len(gpus)))
    return one, both, lat


def layer_costs(job: Job) -> tuple[list[LayerCost], float]:
    """Per-layer costs for the search, and the per-pack overhead (seconds per micro-batch)."""
    price = ComputePricer(job.hw, job.config.precision, (job.model, job.config)).seconds
    one, both, lat = swap_rates(build_topology(job.hw))
    db, master, table, last = dtype_bytes(job), master_bytes(job), table_params(job), len(job.trace.layers) - 1
    out = []
    for i, ly in enumerate(job.trace.layers):
        c = price(ly.fwd_flops, ly.fwd_hbm_bytes, i, Phase.FWD)
        if ly.recompute_flops > 0:
            c += price(ly.recompute_flops, ly.fwd_hbm_bytes, i, Phase.RECOMPUTE)
        c += price(ly.bwd_flops, ly.bwd_hbm_bytes, i, Phase.BWD)
        extra = table if i == last else 0.0
        w = float(ly.param_bytes) + extra * db
        st = float(ly.master_bytes + ly.optimizer_bytes) + extra * (master + ADAM_BYTES)
        out.append(LayerCost(c, max(2 * w / one, 3 * w / both), w, st, float(ly.activation_bytes),
                             float(ly.peak_transient_bytes)))
    return out, 3 * lat
