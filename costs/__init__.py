"""costs: the one pricing layer of tiersim. Pure functions of the hardware and the workload, no SimPy.

The engine (``simulator/``) charges its tasks with these functions, the planner's bounds sum them, and
every policy estimator prices its candidates with them, so an estimate and the engine's charge cannot
drift apart. Imports only ``hardware_models`` and ``workloads``. Units: bytes, seconds, FLOP, bytes/s,
parameters/s.

Resources (:mod:`costs.resources`): a flow crosses named resources with a capacity per second.
  ``direction_key(link, forward)`` "<link>:fwd|rev" (bytes/s), ``duplex_key(link)`` "<link>:duplex" (the
  link's both-ways budget, where ``Link.duplex_bw`` is set), ``sm_resource(gpu)`` "<gpu>.sm" (capacity
  1 s/s), ``CPU_ADAM`` "cpu.adam" (params/s), ``HOST_CORES`` "host.cores" (capacity 1, shared-host machines).
  ``link_capacities(topo)`` -> {resource: bytes/s} of every link resource.
  ``machine_capacities(hw, topo)`` -> every resource the engine uses, with its capacity.
  ``both_ways_bw(link)`` -> bytes/s with both directions busy: the duplex cap, or fwd + rev.

Routes (:mod:`costs.routes`): what a transfer crosses.
  ``route_resources(topo, src, dst)`` -> ``RouteResources(resources, latency_s, links)``: each hop's
  direction resource (and the link's duplex budget where it has one), the summed latency (s), the links.
  ``RouteTable(topo)``: the same, callable as ``routes(src, dst)``, each pair worked out once.

Shared rates (:mod:`costs.rates`): concurrent flows share resources max-min fairly (the engine's model).
  A flow's *usage* is {resource: units of it per unit of flow}; ``usage(resources, weights=None)`` builds
  one (a resource listed twice is used twice).
  ``max_min_rates(usages, capacity)`` -> the rate of each flow running together (progressive filling;
  the FlowNetwork calls it). ``solo_rate(usage, capacity)`` -> rate alone (the narrowest resource).
  ``bottleneck_share(usages, capacity)`` -> the smallest max-min rate: min over resources of capacity /
  total usage.
  ``transfer_rates(topo, pairs, capacity)`` -> bytes/s of each (src, dst) transfer while all run at once.
  ``slowest_transfer_rate(topo, pairs, capacity)`` -> (bytes/s of the slowest of equal concurrent
  transfers, e.g. every GPU's upload; the largest route latency in s).
  ``both_ways_transfer_rate(topo, pairs, capacity)`` -> bytes/s both directions together of the slowest of
  ``pairs`` while each pair and its reverse all run at once (e.g. every GPU swapping with host DRAM).
  ``resource_load(topo, transfers)`` -> {resource: bytes} that (src, dst, bytes) transfers put on links.

Copies (:mod:`costs.transfer`):
  ``copy_resource_bytes(route, nbytes)`` -> {resource: bytes} one copy puts on its route.
  ``copy_seconds(route, nbytes, capacity)`` -> latency + nbytes at the narrowest resource (alone).
  ``busy_seconds(resource_units, capacity)`` -> {resource: units / capacity} (minimum busy seconds).

Collectives (:mod:`costs.collective`): a ring, as the engine runs it.
  ``ring(routes, ranks, nbytes, coll)`` -> ``Ring(per_rank, hops, steps)`` with ``.resources``,
  ``.latency_s`` (largest hop latency x ring steps), ``.links``, ``.resource_bytes()``, ``.seconds(capacity)``
  (alone). ``ring_per_rank_bytes(nbytes, n, coll)`` = nbytes (n-1)/n (x2 for all_reduce);
  ``ring_steps(n, coll)`` = (n-1) (x2 for all_reduce); ``ring_seconds(routes, ranks, nbytes, coll, capacity)``.

Compute (:mod:`costs.compute`):
  ``compute_seconds(hw, flops, hbm_bytes, dtype)`` -> roofline seconds of one kernel, no launch overhead.
  ``kernel_seconds(hw, flops, hbm_bytes, dtype)`` -> the same plus ``gpu.launch_overhead`` (a roofline task).
  ``gemm_kernels_seconds(hw, layer_ops, dtype)`` -> seconds of the matmul kernels of a layer task, each on the curve.
  ``ops_seconds(hw, layer_ops, dtype)`` -> seconds of a list of operators (needs ``gpu.op_overhead``).
  ``ComputePricer(hw, dtype, (model, config) | None).seconds(flops, hbm_bytes, layer, phase)`` -> what the
  engine charges a compute task: operator level where the hardware has ``gpu.op_overhead``, the layer's matmul
  kernels on their curves plus its element-wise bytes (all of them where the GPU prices them apart,
  ``gpu.elementwise_efficiency``; else, without flash attention, its score operators')
  (``costs.compute.kernel_level_seconds`` + one launch) where only the layer is known, else
  :func:`kernel_seconds`.

Optimizer (:mod:`costs.optimizer`):
  ``cpu_adam_seconds(hw, params, ranks=1)`` -> params x ranks / ``host.optimizer_params_per_s`` (ranks
  stepping at once share the host's rate).
  ``gpu_optimizer_seconds(hw, params)`` -> params x ``gpu.optimizer_bytes_per_param`` / ``gpu.hbm_bw`` +
  launch overhead.
"""

from costs.collective import Ring, ring, ring_factor, ring_per_rank_bytes, ring_seconds, ring_steps
from costs.compute import ComputePricer, compute_seconds, gemm_kernels_seconds, kernel_seconds, ops_seconds
from costs.optimizer import cpu_adam_seconds, gpu_optimizer_seconds
from costs.rates import (
    Usage,
    both_ways_transfer_rate,
    bottleneck_share,
    max_min_rates,
    resource_load,
    slowest_transfer_rate,
    solo_rate,
    transfer_rates,
    usage,
)
from costs.resources import (
    CPU_ADAM,
    HOST_CORES,
    both_ways_bw,
    direction_key,
    duplex_key,
    link_capacities,
    machine_capacities,
    sm_resource,
)
from costs.routes import RouteResources, RouteTable, route_resources
from costs.transfer import busy_seconds, copy_resource_bytes, copy_seconds

__all__ = [
    "CPU_ADAM", "ComputePricer", "HOST_CORES", "Ring", "RouteResources", "RouteTable", "Usage", "both_ways_bw",
    "both_ways_transfer_rate", "bottleneck_share", "busy_seconds", "compute_seconds", "copy_resource_bytes",
    "copy_seconds", "cpu_adam_seconds", "direction_key", "duplex_key", "gemm_kernels_seconds", "gpu_optimizer_seconds",
    "kernel_seconds",
    "link_capacities", "machine_capacities", "max_min_rates", "ops_seconds", "resource_load", "ring", "ring_factor",
    "ring_per_rank_bytes", "ring_seconds", "ring_steps", "route_resources", "slowest_transfer_rate", "sm_resource",
    "solo_rate", "transfer_rates", "usage",
]
