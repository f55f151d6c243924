"""``synergyscale``: hierarchical offloading across peer GPUs, CPU DRAM and NVMe, with multi-stream chunking
and an automatic search of its parameters (SynergyScale; seed abstract only, see
docs/reference/policies.md).

Idea (from the abstract): jointly optimise memory and compute. Dynamic hierarchical offloading across the
aggregated memory of the GPUs, CPU DRAM and secondary storage lowers GPU memory pressure; fine-grained
multi-stream task partitioning uses the GPU's ability to run several streams at once; the framework picks
the offloading parameters that balance data movement against parallel efficiency; training semantics are
unchanged (no delayed update).

Our reading (every point an assumption; the full text was not available to us):
- Data parallelism over every GPU (dp = n, no tensor parallelism). Each layer's model states live in
  one tier: ``gpu`` (fp16 weights replicated on every GPU; gradients, fp32 master, Adam m and v
  partitioned over the ranks, ZeRO-2 style, updated by GPU Adam and all-gathered once per step),
  ``peer`` (all 16 B/param partitioned over the GPUs' spare HBM, ZeRO-3 style: the weights are
  all-gathered over NVLink before each use and dropped after it, gradients reduce-scattered, GPU Adam on
  the shard; only with NVLink and more than one GPU, and only within the spare HBM left after the
  working set and the gpu tier), ``cpu`` (fp16 weights, fp32 master, m, v and a gradient buffer of
  ``host_grad_bytes`` in host DRAM: 18 B/param with fp32 gradients, DeepSpeed's ``18 P`` estimate; CPU
  Adam) and ``nvme`` (weights, master, m and v on the NVMe set; per step the optimizer swaps each layer's
  fp32 states in, runs CPU Adam and writes states and weights back, double-buffered). The NVMe tier's
  gradients follow DeepSpeed's NVMe optimizer path (ZeRO-3, ``deepspeed/runtime/zero/stage3.py``
  ``partition_grads`` -> ``_swap_out_offload_fp32_gradients`` -> ``swap_tensor/partitioned_optimizer_swapper.py``
  ``swap_out_gradients``): with one micro-step per step each rank's reduced partition lands in a pinned host
  buffer as fp32 (4 B/param; we convert on the host), is written to NVMe, and is read back with the
  optimizer states (``swap_in_optimizer_state``: one pinned buffer per state tensor plus one for the
  gradient, so 16 B/param of the layer per buffer set). Host DRAM holds only pinned buffers for this tier:
  ``NVME_SWAP_BUFFERS`` (2) sets of one layer's master, m, v and gradient, and the fp32 gradients of at
  most ``GRAD_STAGING_LAYERS`` (2) layers on their way to NVMe (the next layer's copy to the host waits for
  the oldest write, as DeepSpeed's ``AsyncTensorSwapper`` waits when its pinned buffers are full); the
  writes and reads are NVMe traffic priced on the drives. With gradient accumulation (more than one
  micro-step) the partitions are summed in a host buffer of ``host_grad_bytes`` per parameter instead
  (DeepSpeed 0.3-0.4's ``grads_in_partition``; we keep the sum there and the optimizer reads it from DRAM).
- Offloaded weights are fetched per use, forward and backward (recompute + backward), by every GPU.
  With NVLink each rank uploads 1/n of the chunk over its PCIe link and an NVLink all-gather assembles it
  (ZeRO-Infinity's bandwidth-centric partitioning); without NVLink every GPU uploads the whole chunk.
  NVMe weights are read into a host staging buffer first. Gradients of offloaded layers are
  reduce-scattered and each rank copies its partition to the host (ZeRO-Offload).
- Which layers get the fast tiers: ``order`` tail (first layers resident, offloaded ones last, so their
  gradients arrive first in the backward and the CPU optimizer overlaps the rest of it and the next
  forward) or spread (offloaded layers interleaved with resident ones so their fetches hide behind
  resident compute). Tied embeddings: the embedding stays on the GPU (the head's matmul reads it).
- Multi-stream partitioning: a fetched layer's forward, recompute and backward are split into ``chunks``
  chunks along its hidden dimension (attention heads, FFN columns; each chunk reads 1/c of the weights
  and of the FLOPs, the whole layer input, and writes a partial sum: +2 x output bytes of HBM traffic),
  so the fetch of chunk k+1 overlaps the compute of chunk k and a chunk's buffer is freed as soon as it
  is used. Chunk k runs on compute stream k mod ``streams``. The engine shares a GPU's SMs between
  concurrent streams (processor sharing), so more streams only pay when a chunk waits for its transfer
  while another stream's chunk could run; smaller chunks lose efficiency on the GPU's gemm_efficiency
  curve and pay a launch overhead and a copy latency each, which is what makes too many chunks bad.
  Resident (gpu-tier) layers are not split: there is nothing to overlap.
- Prefetch window: ``buffers`` = round(prefetch x chunks) chunk buffers per GPU; the fetch of a unit
  starts when the buffer ``buffers`` units back is freed (across micro-steps too), into a buffer reserved
  on the compute stream right after that unit's compute (for the first ``buffers`` units: at the
  micro-step's start). Gradient buckets are bounded the same way: a layer's backward waits until the
  bucket 3 layers back is reduced / offloaded (unbounded when every layer is resident and all buckets fit,
  as in plain data parallelism); when some layer lives on the host the buckets are held until released on
  the compute stream (before the backward 3 layers later, the last after the last backward), so the GPU's
  peak does not depend on copy speed (``kit``).
- With every layer resident the plan is exactly ``none`` at ZeRO stage 2 (stage 0 on one GPU); on
  several GPUs that is faster than ``none``'s default stage 0 (GPU Adam over 1/n of the states).
- Automatic selection (``auto``): a staged search over order x GPU/peer split x chunks x prefetch (the
  knobs left on auto) scored by an analytic list schedule of one rank (``search.estimate``); ``plan()``
  returns that choice. The ``refine`` hook (run by ``planner.job.make_plan`` with the simulator's step
  seconds) then, when the job is small enough (at most SIM_TASK_BUDGET simulated tasks in all), prices
  the fixed defaults and the best candidates (a reduced plan: 1 and 2 micro-steps, extrapolated to the
  real accumulation; the real one when it is 1 or 2; 'streams' is only chosen there) and keeps the
  fastest (the defaults on a tie, or within 0.2% when extrapolated). ``plan.info`` records the choice, the
  candidates evaluated and simulated, and the estimates. Placement always fills the fastest tier first
  subject to capacities (gpu, peer, cpu, nvme), leaving the host room the remaining layers need; on a
  unified machine (DGX Spark) the CPU tier is the GPU's own pool, so auto never uses it and an explicit
  ``cpu_fraction`` there reports no savings (``gpu_bytes_saved_per_gpu`` is the net, <= 0).
- Optimizer: GPU Adam (HBM-bound) for the gpu and peer tiers on compute stream 0 after the last backward;
  CPU Adam per layer in backward order as the gradients land, the next step's forward of an offloaded
  layer waiting for its update (no delayed update).

Where our reading is weakest:
- How SynergyScale partitions "tasks" over streams is unknown: we split along the hidden dimension and
  ignore the attention -> MLP sync inside a block; a batch split would change the cost model. In our
  engine extra compute streams rarely help (transfers already overlap on their own streams), so the
  search usually keeps one; the paper's measured gains may come from kernel concurrency we cannot model.
- "Peer GPU memory" is read as ZeRO-3-style partitioning into the GPUs' spare HBM; the paper may instead
  park whole layers on one peer and pull them over NVLink point-to-point.
- The search space and objective are ours (the paper's selector may use profiling); the analytic estimate
  ignores bandwidth sharing between concurrent streams beyond aggregate per-link bounds.
- Activation offload is a plain switch (checkpointed layer inputs of fetched layers go to DRAM), not
  searched. Our swapper works per layer (a DeepSpeed sub-group of one layer), so its pinned buffers
  grow with the largest NVMe-tier layer (2 x 16 B/param of it: 58 GB at hidden 12288); DeepSpeed bounds them
  by ``sub_group_size``. With gradient accumulation the NVMe tier's host gradient buffer makes DRAM, not
  NVMe, bound the largest model. CPU-side gradient accumulation and the fp32 conversion are free.
- Fill-fastest-first is per layer in a fixed priority order; the GPU working-set bound used while
  filling assumes every layer may be fetched, so some HBM (a few GB) stays unused.

Knobs (defaults in brackets):
- ``auto`` (bool, True): search the knobs left on auto; False uses the fixed defaults below.
- ``peer_fraction``, ``cpu_fraction``, ``nvme_fraction`` (str, "auto"): share of the parameters placed in
  that tier (0..1), or auto (fill the fastest tiers first). The gpu tier takes the rest.
- ``chunks`` (int, 0 = auto; fixed default 2): chunks per fetched layer.
- ``streams`` (int, 0 = auto; fixed default 2): compute streams per GPU.
- ``prefetch`` (float, 0 = auto; fixed default 2): chunk buffers per GPU, in layers (buffers =
  round(prefetch x chunks), at least 1).
- ``order`` (str, "auto"; fixed default tail): tail | spread.
- ``offload_activations`` (bool, False): move fetched layers' saved activations to DRAM between their
  forward and backward.
- ``host_grad_bytes`` (float, 4): bytes per parameter of the host gradient buffer of the cpu tier (and of
  the nvme tier when it accumulates over micro-steps) (4: fp32 as DeepSpeed's offload path; 2 keeps them
  in bf16/fp16 and lets bigger models fit).

Modules: ``context`` (knobs and their validation, per-job facts, the ``Choice``), ``placement`` (which
tier holds each layer), ``search`` (the analytic cost model, priced with ``costs``; the parameter search;
what the refinement simulates), ``emit`` (plan emission as ``policies.kit`` calls, and ``plan.info``); the
``refine`` hook is here.
"""

from __future__ import annotations

from policies.base import Job, KnobError, PolicyInfo, StepSeconds
from policies.synergyscale.context import NAME, Knobs, make_ctx
from policies.synergyscale.emit import build
from policies.synergyscale.search import SIM_TASK_BUDGET, fixed_choice, search, sim_candidates, sim_reps, sim_tasks
from simulator import Plan

DEFAULT_TOLERANCE = 2e-3   # extrapolated scores: keep the defaults unless beaten by more than this share


def plan(job: Job, knobs: Knobs) -> Plan:
    """The plan of the analytic choice (``refine`` may replace it after simulating the alternatives)."""
    knobs.validate()
    ctx = make_ctx(job, knobs.host_grad_bytes)
    fr = knobs.fractions()
    if (fr.peer or 0) > 0 and not ctx.peer_ok:
        raise KnobError(f"{NAME}: knob 'peer_fraction' needs more than one GPU joined by NVLink; "
                        f"'{job.hw.name}' has {'no NVLink' if job.n_gpus > 1 else 'one GPU'} (use 0 or auto)")
    if (fr.nvme or 0) > 0 and not ctx.has_nvme:
        raise KnobError(f"{NAME}: knob 'nvme_fraction' needs NVMe drives; '{job.hw.name}' has none (use 0 or auto)")
    job.accumulation(ctx.n)  # a clear error for a global batch that does not divide
    found = search(ctx, knobs)
    return build(ctx, knobs, found.choice, found.info)


def refine(job: Job, knobs: Knobs, plan: Plan, step_seconds: StepSeconds) -> Plan:
    """The ``PolicyInfo.refine`` hook: ``plan``, or the fastest of the candidates ``sim_candidates`` picks,
    priced with ``step_seconds`` (the policy never runs the simulator itself) at the real accumulation when
    it is 1 or 2 micro-steps, else at 1 and 2 micro-steps and extrapolated linearly."""
    if plan.info.get("search") != "analytic":
        return plan  # not searched (auto off, or everything resident)
    ctx = make_ctx(job, knobs.host_grad_bytes)
    default = fixed_choice(ctx, knobs)  # None when it does not fit: the first candidate is the analytic best
    if default is not None and sum(sim_tasks(ctx, default, r) for r in sim_reps(ctx)) > SIM_TASK_BUDGET:
        return plan  # too large to simulate even the defaults: skip re-running the search
    found = search(ctx, knobs)
    runs = sim_candidates(ctx, knobs, found)
    if len(runs) < 2 or runs[-1][0] == 0:
        return plan
    accum = job.accumulation(ctx.n)
    scored = []
    for k, ch in runs:
        p = build(ctx, knobs, ch, {})
        times = [step_seconds(p.with_repeats({"micro-steps": r})) for r in sim_reps(ctx)]
        scored.append((times[0] if len(times) == 1 else times[0] + (accum - 1) * (times[1] - times[0]), k, ch))
    t_def = scored[0][0]
    t_best, _, ch_best = min(scored, key=lambda x: (x[0], x[2].streams))
    keep_default = found.default is not None and not t_best < t_def * (1 - (0.0 if accum <= 2 else DEFAULT_TOLERANCE))
    info = {**found.info, "candidates_simulated": len(scored), "search": "analytic + simulated",
            "simulated_step_s": t_def if keep_default else t_best}
    return build(ctx, knobs, scored[0][2] if keep_default else ch_best, info)


POLICY = PolicyInfo(NAME, "hierarchical offloading over peer GPUs, CPU and NVMe with multi-stream chunking and "
                          "an automatic parameter search", Knobs, plan, __doc__ or "",
                    search_grid=lambda n: {"auto": (True,), "offload_activations": (False, True)}, refine=refine)
# every plan replays: a chunked layer's tasks carry ``chunk``/``chunks`` (the runner computes the layer whole in its
# last chunk, which waits for the others), GPU Adam names its ``layers`` (the host tiers' are CPU Adam's), and the
# NVMe tier's read into host staging is a ``param-swap-in``

__all__ = ["NAME", "POLICY", "Knobs", "plan", "refine"]
