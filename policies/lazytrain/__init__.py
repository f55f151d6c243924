"""``lazytrain``: a MILP over per-layer checkpointing and activation placement on a layer-streaming executor.

The paper's idea (LazyTrain, seed abstract; docs/reference/policies.md): an optimisation layer over
a layer-streaming executor. Checkpoint selection, placement of the saved activations on GPU, CPU or NVMe,
recomputation and the overlap of CPU-GPU-NVMe transfers with compute are formulated as one mixed-integer
program, solved offline, and the solved schedule is executed. A published summary says it minimises
recomputation plus exposed communication and keeps optimizer states in a hybrid 8-bit form. Only the
abstract was available to us; everything below is our reading.

Executor (``plan``), data parallel over all GPUs of the machine (or the one GPU), tp = 1:
- parameters: where the GPU holds them they stay resident (offload nothing it need not). Otherwise the
  fp16/bf16 parameters live in DRAM (or on NVMe) and are streamed layer by layer: each rank uploads its
  1/n slice of the layer and the ranks all-gather it over NVLink (ZeRO-Infinity's bandwidth-centric
  partitioning; with one GPU the whole layer is uploaded), ``prefetch_depth`` layers ahead of use, and
  freed after the layer's forward (and again after its backward). The last ``prefetch_depth + 1`` layers
  keep their forward copy through the forward/backward turn. With tied embeddings the head's streamed
  unit includes the embedding table (its matmul reads it);
- three tierings (levels), chosen with ``param_home``/``optimizer_home`` = auto by ``tiering_rule``: the
  least offloading that fits (level 1, else 2, else 3; within a level the least estimated step time), or
  the least estimated step time overall. (1) Everything on the GPU (16 B/param, GPU Adam, per-layer
  gradient all-reduce: the plain data-parallel step of ``none`` stage 0). (2) Parameters resident,
  gradients reduce-scattered and copied to the CPU per layer, CPU Adam after the last micro-step, updated
  slices uploaded and all-gathered (as ZeRO-Offload). (3) Parameters streamed as above, gradients to the
  CPU per layer, CPU Adam writing the DRAM (or NVMe) home copy. In (2) and (3) the fp32 master weights
  and m, v sit in DRAM, or on NVMe (read into a two-layer staging buffer, updated, written back) where
  DRAM does not hold them; the CPU gradient accumulates in ``cpu_grad_bytes`` per parameter. On a unified
  machine (DGX Spark) the CPU is the GPU's own pool: only tierings and placements that use NVMe are offered;
- activations, per layer, as the MILP chose: full (``keep``) or only the layer input (``ckpt``, the forward
  is recomputed just before the backward), on the GPU, or copied out right after the layer's forward on
  a copy stream (overlapping the next layer's forward) to the CPU or NVMe (GPU->NVMe bounces through
  DRAM, no GPUDirect Storage) and brought back during the backward of the layer above. At most two
  offloaded activations are on the GPU at a time: the forward of an offloaded layer waits until the
  copy-out of the offloaded layer two before it has finished, the fetch of one waits for the backward of
  the offloaded layer two after it;
- a persistent workspace holds the largest transient working set of any layer under its chosen mode.

The MILP (``policies/lazytrain/milp.py`` has the exact algebra), per micro-step and per GPU:
- variables: binary ``x[i,(mode,place)]``, one per layer, mode keep|ckpt (embedding and head: keep only),
  place gpu|cpu|nvme (cpu only where it is a separate pool, nvme only where the hardware has drives);
  continuous ``e[w] >= 0`` per window; ``W`` (workspace) and ``S`` (staging) over level binaries;
- windows: ``start`` (upload of layer 0), ``fwd i`` (compute F_i hides the upload of layer i+1 and the
  copy-out of layer i-1), ``turn`` (no compute: the last layer's copy-out and fetch run back to back),
  ``bwd i`` (compute B_i + R_i if checkpointed hides the upload of layer i-1, the fetch of layer i-1 and
  the reduction / copy-down of layer i+1's gradients), ``end`` (layer 0's gradients);
  ``e[w] >= sum of the seconds a resource is loaded in w - compute of w`` for every resource: each link
  direction and duplex budget on the route (with the load of all GPUs that share it, e.g. two GPUs per
  PCIe switch uplink, eight on the NVMe set), NVLink for the collectives;
- memory, for every pool: GPU (per GPU) ``fixed + W + sum of GPU-placed activations + staging <= usable``:
  the peak we constrain is the forward/backward turn, where every GPU-kept activation is live at once,
  plus the workspace and two in-flight offloaded activations (budgeted as twice the largest offloaded);
  ``fixed`` = 16 B/param (tiering 1), the fp16 parameters + two gradient buckets (2), or the parameter
  window ``(depth + 1) x largest layer x (1 + 1/n)`` + two gradient buckets (3). CPU (machine-wide):
  n x CPU-placed activations + states + gradients + parameter home. NVMe likewise. On a unified machine
  the GPU and CPU terms add up in the one pool;
- objective: recomputation seconds + exposed seconds (+ 1e-3 x all transfer seconds as a tie-break).
Times: ``costs.kernel_seconds`` (the roofline + launch overhead); routes, link resources, their capacities
and ring collectives from ``costs``, as the engine prices them. Capacities lose a 1 MiB safety margin.
``plan.info["milp"]`` has the solver's status, objective, dual bound, MIP gap and the limit that stopped it
(if any); ``plan.info["lazytrain"]`` the schedule, the estimate, the pools' need, every tiering tried and the
heuristics' objectives.

Knobs:
- ``strategy`` (milp|keep_all|checkpoint_all|offload_all, default milp): the MILP, or one of its heuristics
  (full activations on the GPU; every block checkpointed, inputs on the GPU; full activations to the CPU,
  or to NVMe where the CPU does not hold them);
- ``node_limit`` (int, default 20000): HiGHS branch-and-bound nodes per solve, the deterministic limit (the
  plan never depends on the machine's speed or load);
- ``time_limit_s`` (float, default 300): HiGHS wall-clock limit per solve, a safety net only: a solve it cuts
  may differ from run to run, and the plan says so (a note, and ``info["milp"]["limit_hit"] == "time"``);
- ``mip_rel_gap`` (float, default 1e-4): HiGHS relative MIP gap;
- ``prefetch_depth`` (int, default 1): layers of parameters uploaded ahead of use;
- ``optimizer_8bit`` (bool, default False): ASSUMPTION from a summary of the paper ("hybrid 8-bit"): Adam
  m and v in 8 bits (1 B each) with one fp32 scale per block of 2048 elements; fp32 master weights kept;
  CPU Adam's rate unchanged;
- ``param_home`` (auto|gpu|cpu|nvme, default auto) and ``optimizer_home`` (auto|gpu|cpu|nvme, default
  auto): force a tiering (gpu parameters = resident; streamed parameters need a CPU optimizer);
- ``cpu_grad_bytes`` (float, default 4): bytes per parameter of the CPU gradient buffer (DeepSpeed: fp32);
- ``tiering_rule`` (least_offload|fastest_estimate, default least_offload): how the tiering is picked. The
  estimate (micro-steps x (compute + MILP objective) + optimizer phase) charges each transfer to one
  window, so it overstates bursty exposure (e.g. a big embedding all-reduce that the simulator spreads
  over several layers) and can prefer offloading the optimizer where the simulator says otherwise;
  least_offload follows the brief "offload nothing it need not".

Where our reading is weakest: (a) whether LazyTrain decides parameter and optimizer placement inside the
MILP (we enumerate tierings outside it and compare estimated step times); (b) "overlap" as a decision: we
model it with continuous exposed-time variables over fixed windows (a transfer may only hide behind its
neighbouring layer's compute; concurrent transfers on different links are taken as parallel, an upload
and its all-gather too), not as per-layer overlap binaries, and the prefetch depth is not part of the
model (we cost depth 1); (c) the peak: we bound it at the turn plus a two-slot staging budget, which is
exact for the executor above but not necessarily the paper's memory model; (d) recomputation is whole
layers only (no selective checkpointing, no Checkmate-style arbitrary rematerialisation); (e) the 8-bit
optimizer: which states and what CPU cost; (f) the data-parallel executor itself (the abstract speaks of
one layer-streaming executor, not of how several GPUs share it). The workload's own ``checkpointing``
setting is not used: the MILP decides per layer.
"""

from __future__ import annotations

from policies.base import Job, PolicyInfo
from policies.lazytrain.cost_model import Costs, Tiering, build_costs, tierings
from policies.lazytrain.emit import emit
from policies.lazytrain.schedule import HEURISTICS, NAME, Knobs, Schedule, schedule
from simulator import Plan


def plan(job: Job, knobs: Knobs) -> Plan:
    """Decide (the tiering and each layer's activations), then emit the executor's plan."""
    return emit(job, knobs, schedule(job, knobs))


POLICY = PolicyInfo(NAME, "MILP over per-layer checkpointing and GPU/CPU/NVMe activation placement on a "
                          "layer-streaming data-parallel executor", Knobs, plan, __doc__ or "",
                    search_grid=lambda n: {"strategy": ("milp",)}, fixed_checkpointing="full")

__all__ = ["HEURISTICS", "NAME", "POLICY", "Costs", "Knobs", "Schedule", "Tiering", "build_costs", "emit", "plan",
           "schedule", "tierings"]
