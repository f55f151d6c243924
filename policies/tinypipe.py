"""``tinypipe``: heterogeneous pipeline parallelism over GPU and CPU memory (Tiny-Pipe, ACM TACO vol. 23).

Idea (abstract only; the full text was not available to us): train on resource-constrained commodity
servers with pipeline parallelism whose stages use GPU *and* CPU memory, with (1) holistic layer packing
(stage boundaries and the layers swapped together decided at once, to cut GPU memory and keep
throughput), (2) active CPU memory management (no redundant parameter copies in DRAM, so DRAM stops
being the limit), (3) layer-wise runtime swapping (weights move between DRAM and the GPU pack by pack,
prefetched and overlapped with compute). Neighbours with the same shape: Mobius (stages kept in DRAM and
prefetched to the GPU just before they run), STRONGHOLD (a sliding window of layers on the GPU).

Our reading, as planned here:

- Pipeline: the layers (embedding, blocks, head) are split into ``stages`` contiguous stages, one per GPU;
  with fewer stages than GPUs there are ``gpus / stages`` data-parallel pipeline replicas (replica r runs
  stage s on ``gpu{r * stages + s}``). A step is every micro-batch of the global batch through the pipe
  (1F1B, PipeDream-flush, or GPipe) and then the optimizer; stage s sends its last layer's output to
  stage s+1 (NVLink, or PCIe and possibly a bounce through DRAM) and receives the gradient of it back.
- Stage modes, by a rule in this order (``policies/tinypipe_search.py``): ``gpu`` when the stage's
  weights, gradients, fp32 master, Adam m and v, activations in flight and workspace all fit (nothing is
  offloaded that need not be; GPU Adam); else ``resident`` when 16-bit weights and gradients fit (CPU
  Adam; gradients accumulate on the GPU and go down once per step, layer by layer, then the updated
  16-bit weights are uploaded); else ``swap`` (where it needs less GPU memory than ``resident``; with one
  or two layers the swap buffers can outweigh the stage): the stage's 16-bit weights live in DRAM and are fetched
  pack by pack into freshly allocated GPU buffers, ``prefetch_packs`` packs ahead of the one computing,
  in the forward and again in the backward (in a forward-backward pair of 1F1B the last pack stays for
  the backward); a pack is resident from its fetch start to its last use; each backward pack's gradient
  goes down to DRAM (the CPU accumulates micro-batches, cost not modelled), at most two gradient packs
  live; CPU Adam per pack after the last micro-batch writes the 16-bit weights in place in DRAM.
- Holistic packing: an exact search (``tinypipe_search``) picks the stage boundaries and the packs
  together, minimising the peak GPU memory of the worst stage subject to every stage's estimated time per
  micro-batch being within ``balance_tolerance`` of the best balanced partition's bottleneck; among equal
  peaks, the least bottleneck. If no partition within the tolerance fits the GPU, the tolerance is
  dropped (a note says so); if none fits at all, PlanInfeasible names the stage, its GPU and the overshoot.
- Active CPU memory management (``active_cpu_mm``): on, the 16-bit copy a stage swaps from is the buffer
  CPU Adam writes, shared by the data-parallel replicas, and no DRAM copy of GPU-resident layers exists.
  Off, every GPU process also keeps a DRAM 16-bit copy of its whole stage (for resident layers: the model
  as loaded, never released; for swapped layers: the optimizer's separate fp16 output, copied into the
  swap buffer afterwards - that CPU memcpy is not timed). ``plan.info["cpu_bytes_saved"]`` is their sum;
  both plans run the same tasks, so their peak DRAM differs by exactly that.
- CPU-side model states per stage with a CPU optimizer: fp32 master (4 B/param, none in fp32 training),
  Adam m and v (8), an fp32 gradient accumulator (4); ``resident`` uploads go through a pinned bounce
  buffer per layer, at most two per GPU.
- Tied embeddings with S > 1: the head's stage keeps its own copy of the table (weights and states,
  as Megatron does) and the two copies' gradients are summed once per step (an all-reduce between the
  two GPUs, or on the CPU when a side swaps). With one stage the head reads the embedding's table.
- Unified memory (DGX Spark): moving to the CPU frees nothing, so only ``gpu`` mode is planned, no
  swapping, and no savings are reported (``cpu_bytes_saved`` = 0, ``active_cpu_mm`` changes nothing).
- Stage modes are all-or-nothing: a stage that does not fit swaps all its packs, even where the GPU could
  keep some of them (STRONGHOLD's window would); e.g. 13b on a100-40g swaps everything and uses ~5 GB.
- NVMe is not used.

Where our reading is weakest (the paper's text would settle these; each is a knob or stated here):
- the packing objective and cost model are ours: Tiny-Pipe may optimise throughput under a memory budget
  rather than memory under a throughput tolerance, and its pack cost is unknown (we use
  ``max(compute, transfer)`` per pack plus copy latency); the three-mode rule (notably keeping the
  optimizer on the GPU when everything fits) is ours;
- which copies "active CPU memory management" removes is a guess (one fp16 copy per GPU process, i.e.
  2 B/param per replica); real frameworks may also hold pinned staging pools or fp32 gradient copies;
- we swap weights only, never activations, and do not swap gradients of resident stages per micro-batch;
- the 1F1B schedule, per-micro-batch gradient offload with CPU-side accumulation, replica placement
  and the tied-embedding handling are assumptions; so is the stage-time estimate, which ignores the
  activation sends and the once-per-step optimizer when balancing.

Knobs:
- ``stages`` (int, default 0 = auto: the fewest stages with which every stage keeps everything on its
  GPU, else the GPU count, or its largest divisor not above the layer count): pipeline stages; must
  divide the GPU count.
- ``schedule`` (1f1b | gpipe, default 1f1b): micro-batch schedule.
- ``balance_tolerance`` (float, default 0.05): how far a stage's estimated time may exceed the best
  balanced partition's bottleneck when trading time for GPU memory.
- ``prefetch_packs`` (int, default 1): packs fetched ahead of the one computing (0: fetch on demand).
- ``active_cpu_mm`` (bool, default True): no redundant 16-bit copies in DRAM.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from costs import compute_seconds
from hardware_models import build_topology
from policies.base import Job, KnobError, PlanInfeasible, PolicyInfo, gpu_pool, pow2_divisors, unified
from policies.builder import PlanBuilder
from policies.kit import dtype_bytes
from policies.tinypipe_emit import Ctx, Emitter, gpipe, one_f_one_b
from policies.tinypipe_search import MODES, LayerCost, Problem, Solution, StagePlan, solve
from simulator import Plan

NAME = "tinypipe"
GRAD32_BYTES = 4.0      # CPU-side fp32 gradient accumulator per parameter
ADAM_BYTES = 8.0        # Adam m and v, fp32
BOUNCE_BUFFERS = 2      # pinned upload buffers per GPU (resident stages)


@dataclass(frozen=True)
class Knobs:
    stages: int = 0
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    balance_tolerance: float = 0.05
    prefetch_packs: int = 1
    active_cpu_mm: bool = True

    def validate(self) -> None:
        if self.stages < 0:
            raise KnobError(f"{NAME}: knob 'stages' must be 0 (= GPU count) or a divisor of the GPU count")
        if self.schedule not in ("1f1b", "gpipe"):
            raise KnobError(f"{NAME}: knob 'schedule' must be one of 1f1b, gpipe, got {self.schedule!r}")
        if not (math.isfinite(self.balance_tolerance) and self.balance_tolerance >= 0):
            raise KnobError(f"{NAME}: knob 'balance_tolerance' must be a finite number >= 0")
        if self.prefetch_packs < 0:
            raise KnobError(f"{NAME}: knob 'prefetch_packs' must be an integer >= 0")


def _swap_link(job: Job) -> tuple[float, float, float]:
    """(one-way bytes/s, both-ways bytes/s, latency) of gpu0's DRAM route, shared links split evenly."""
    topo = build_topology(job.hw)
    gpus = topo.gpu_locations()
    users: dict[str, int] = {}
    for g in gpus:
        for h in topo.route("cpu", g):
            users[h.link] = users.get(h.link, 0) + 1
    one, both = math.inf, math.inf
    for h in topo.route("cpu", "gpu0"):
        ln = topo.links[h.link]
        one = min(one, ln.bw(h.forward) / users[h.link])
        both = min(both, (ln.duplex_bw or ln.bw_fwd + ln.bw_rev) / users[h.link])
    return one, both, topo.route_latency("cpu", "gpu0")


def _table_params(job: Job) -> float:
    return float(job.model.vocab * job.model.hidden) if job.model.tied_embeddings else 0.0


def layer_costs(job: Job) -> tuple[list[LayerCost], float]:
    """Per-layer costs for the search, and the per-pack overhead (seconds per micro-batch)."""
    hw, dtype = job.hw, job.config.precision
    launch = hw.gpu.launch_overhead_s
    one, both, lat = _swap_link(job)
    db = dtype_bytes(job)
    master = 0.0 if job.config.precision == "fp32" else 4.0
    table = _table_params(job)
    last = len(job.trace.layers) - 1
    out = []
    for i, ly in enumerate(job.trace.layers):
        c = compute_seconds(hw, ly.fwd_flops, ly.fwd_hbm_bytes, dtype) + launch
        if ly.recompute_flops > 0:
            c += compute_seconds(hw, ly.recompute_flops, ly.fwd_hbm_bytes, dtype) + launch
        c += compute_seconds(hw, ly.bwd_flops, ly.bwd_hbm_bytes, dtype) + launch
        extra = table if i == last else 0.0
        w = float(ly.param_bytes) + extra * db
        x = max(2 * w / one, 3 * w / both)
        st = float(ly.master_bytes + ly.optimizer_bytes) + extra * (master + ADAM_BYTES)
        out.append(LayerCost(c, x, w, st, float(ly.activation_bytes), float(ly.peak_transient_bytes)))
    return out, 3 * lat


def _stages(job: Job, knobs: Knobs) -> tuple[int, int]:
    """(stages, data-parallel replicas). Auto: the fewest stages (a divisor of the GPU count) with which
    every stage keeps everything, optimizer included, on its GPU — a pipeline exists to cut memory, and
    where memory allows, data-parallel replicas beat a pipeline's bubble; otherwise one stage per GPU (or,
    when the model has fewer layers than GPUs, the largest divisor of the GPU count it has layers for)."""
    n = job.n_gpus
    fits = [d for d in range(1, n + 1) if n % d == 0 and d <= len(job.trace.layers)]
    S = knobs.stages
    if not S:
        S = fits[-1]
        need = _all_gpu_need(job)
        for d in fits[:-1]:
            try:
                job.accumulation(n // d)
            except KnobError:
                continue
            if need / d > gpu_pool(job).capacity_bytes * (1 + 1e-9):
                continue  # some stage's weights, gradients and states alone overflow: no search can say "all gpu"
            _, sol = search(job, dataclasses.replace(knobs, stages=d))
            if sol.peak_bytes <= gpu_pool(job).capacity_bytes and all(st.mode == "gpu" for st in sol.stages):
                S = d
                break
    if n % S:
        raise KnobError(f"{NAME}: knob 'stages' must divide the GPU count {n}, got {S}")
    if len(job.trace.layers) < S:
        raise KnobError(f"{NAME}: knob 'stages' = {S} exceeds the model's {len(job.trace.layers)} layers")
    return S, n // S


def _all_gpu_need(job: Job) -> float:
    """A lower bound of the sum over stages of what ``gpu`` mode keeps (16-bit weights and gradients, master
    and Adam states), activations and workspace left out: the largest of ``d`` stages needs at least a
    ``1/d`` share of it. The tied table is counted once (a range holding both ends keeps one copy)."""
    costs, _ = layer_costs(job)
    table = _table_params(job)
    master = 0.0 if job.config.precision == "fp32" else 4.0
    total = sum(2 * c.param_bytes + c.state_bytes for c in costs)
    return total - 2 * table * dtype_bytes(job) - table * (master + ADAM_BYTES)


def search(job: Job, knobs: Knobs, tolerance: float | None = None) -> tuple[Problem, Solution]:
    S, dp = _stages(job, knobs)
    M = job.accumulation(dp)
    costs, overhead = layer_costs(job)
    inflight = tuple(M if knobs.schedule == "gpipe" else min(S - s, M) for s in range(S))
    table = _table_params(job)
    db = dtype_bytes(job)
    master = 0.0 if job.config.precision == "fp32" else 4.0
    prob = Problem(tuple(costs), S, inflight, gpu_pool(job).capacity_bytes, knobs.prefetch_packs, overhead,
                   knobs.balance_tolerance if tolerance is None else tolerance,
                   ("gpu",) if unified(job) else MODES,
                   shared_param_bytes=table * db, shared_state_bytes=table * (master + ADAM_BYTES))
    return prob, solve(prob)


def _describe(job: Job, st: StagePlan) -> str:
    names = job.trace.layers
    return f"{names[st.first].name}..{names[st.last].name}"


def cpu_bytes(em: Emitter, ctx: Ctx, job: Job) -> dict[str, float]:
    """DRAM the plan keeps (by purpose), for the feasibility check and ``info``."""
    master = 0.0 if job.config.precision == "fp32" else 4.0
    out = {"param32": 0.0, "optim": 0.0, "grad32": 0.0, "swap_home16": 0.0, "bounce": 0.0, "naive16": 0.0}
    for st in ctx.stages:
        if st.mode == "gpu":
            continue
        p = em.stage_params(st)
        out["param32"] += master * p
        out["optim"] += ADAM_BYTES * p
        out["grad32"] += GRAD32_BYTES * p
        if st.mode == "swap":
            out["swap_home16"] += sum(em.pack_home_bytes(st.index, u, t) for u, t in st.packs)
        else:
            # per GPU BOUNCE_BUFFERS of a layer's 1/dp share, on dp GPUs
            out["bounce"] += BOUNCE_BUFFERS * max(em.layer_bytes(st.index, x) for x in range(st.first, st.last + 1))
    if not ctx.active_cpu_mm and not ctx.unified:
        out["naive16"] = ctx.dp * sum(em.stage_bytes(st) for st in ctx.stages)
    return out


def plan(job: Job, knobs: Knobs) -> Plan:
    knobs.validate()
    S, dp = _stages(job, knobs)
    M = job.accumulation(dp)
    uni = unified(job)
    topo = build_topology(job.hw)
    notes: list[str] = []
    prob, sol = search(job, knobs)
    relaxed = False
    if sol.peak_bytes > prob.capacity * (1 + 1e-12):
        prob2, sol2 = search(job, knobs, tolerance=math.inf)
        worst = max(sol2.stages, key=lambda st: st.mem_bytes)
        if sol2.peak_bytes > prob.capacity * (1 + 1e-12):
            g = f"gpu{worst.index}"
            raise PlanInfeasible(NAME, topo.pool_of[g], worst.mem_bytes, prob.capacity,
                                 f"the minimal working set of stage {worst.index} ({_describe(job, worst)}, "
                                 f"mode {worst.mode}, {prob.inflight[worst.index]} micro-batch(es) of activations "
                                 f"in flight) in the best partition")
        sol, relaxed = sol2, True
        notes.append(f"no partition within balance_tolerance={knobs.balance_tolerance:g} fits the GPU; "
                     f"the tolerance was dropped (bottleneck {sol.bottleneck_s / sol.t_star:.2f}x the balanced one)")
    db = dtype_bytes(job)
    ctx = Ctx(sol.stages, dp, M, gpipe(S, M) if knobs.schedule == "gpipe" else one_f_one_b(S, M),
              knobs.prefetch_packs, knobs.schedule == "gpipe", job.model.tied_embeddings, _table_params(job),
              db, knobs.active_cpu_mm, uni)
    b = PlanBuilder(NAME, knobs, job)
    em = Emitter(b, job, ctx)
    master = 0.0 if job.config.precision == "fp32" else 4.0

    # -- memory: DRAM check before anything is simulated ---------------------------------------------
    dram = cpu_bytes(em, ctx, job)
    if not uni:
        cap = topo.pools[topo.pool_of["cpu"]].capacity_bytes
        need = sum(dram.values())
        if need > cap:
            raise PlanInfeasible(NAME, topo.pool_of["cpu"], need, cap,
                                 "the CPU-side model states (fp32 master, Adam m/v, fp32 gradients, swapped "
                                 "16-bit weights" + (", redundant 16-bit copies" if dram["naive16"] else "") + ")")

    # -- streams and persistent tensors -------------------------------------------------------------
    cpu_opt = any(st.mode != "gpu" for st in sol.stages)
    for r in range(dp):
        for st in sol.stages:
            g = ctx.gpu(r, st.index)
            for kind in ("compute", "h2d", "d2h"):
                b.stream(f"{g}.{kind}", g, kind)
            b.stream(f"{g}.fsend", g, "copy")
            b.stream(f"{g}.bsend", g, "copy")
            if st.mode != "gpu":
                b.stream(f"cpu.adam{g}", "cpu", "optim")
            ws = max(job.trace.layers[x].peak_transient_bytes for x in range(st.first, st.last + 1))
            b.tensor(f"ws.{g}", ws, "buffer", home=g, persistent=True)
            if st.mode != "swap":
                b.tensor(f"p16.{g}", em.stage_bytes(st), "param16", home=g, persistent=True)
                b.tensor(f"g16.{g}", em.stage_bytes(st), "grad", home=g, persistent=True)
            if st.mode == "gpu":
                p = em.stage_params(st)
                if master:
                    b.tensor(f"m32.{g}", master * p, "param32", home=g, persistent=True)
                b.tensor(f"adam.{g}", ADAM_BYTES * p, "optim", home=g, persistent=True)
            if not ctx.active_cpu_mm and not uni:
                b.tensor(f"naive16.{g}", em.stage_bytes(st), "param16", home="cpu", persistent=True)
    for st in sol.stages:
        s = st.index
        if dp > 1:
            b.stream(f"dp{s}", ctx.gpu(0, s), "comm")
        if st.mode == "gpu":
            continue
        p = em.stage_params(st)
        if master:
            b.tensor(f"m32.s{s}", master * p, "param32", home="cpu", persistent=True)
        b.tensor(f"adam.s{s}", ADAM_BYTES * p, "optim", home="cpu", persistent=True)
        b.tensor(f"gr32.s{s}", GRAD32_BYTES * p, "grad32", home="cpu", persistent=True)
        if st.mode == "swap":
            for k, (u, t) in enumerate(st.packs):
                b.tensor(f"home.s{s}.p{k}", em.pack_home_bytes(s, u, t), "param16", home="cpu", persistent=True)
    if job.model.tied_embeddings and S > 1:
        for r in range(dp):
            b.stream(f"tie{r}", ctx.gpu(r, 0), "comm")

    em.run()

    # -- notes and info -----------------------------------------------------------------------------
    modes = [st.mode for st in sol.stages]
    swapped = sum(st.last - st.first + 1 for st in sol.stages if st.mode == "swap")
    notes.insert(0, f"{S} pipeline stage(s) x {dp} data-parallel replica(s), {knobs.schedule}, {M} micro-batch(es) "
                    f"per step; stage modes {', '.join(f'{m}={modes.count(m)}' for m in MODES if m in modes)}; "
                    f"{swapped} of {len(job.trace.layers)} layers swapped from DRAM")
    if not knobs.stages and job.n_gpus > S:
        notes.append(f"stages=auto: {S} stage(s) x {dp} data-parallel replica(s): "
                     + ("every stage fits on its GPU with fewer stages than GPUs"
                        if all(st.mode == "gpu" for st in sol.stages) else
                        f"the model has {len(job.trace.layers)} layers for {job.n_gpus} GPUs"))
    if uni:
        notes.append("unified memory: GPU and CPU share one pool, so moving anything to the CPU frees nothing; "
                     "everything stays GPU-side (no swapping, GPU Adam) and no CPU savings are reported")
    elif not cpu_opt:
        notes.append("every stage fits the GPU with its optimizer states: nothing is offloaded")
    saved = 0.0 if uni else dram["naive16"] if not ctx.active_cpu_mm else ctx.dp * sum(
        em.stage_bytes(st) for st in sol.stages)
    partition = [{
        "stage": st.index, "gpus": [ctx.gpu(r, st.index) for r in range(dp)],
        "layers": [st.first, st.last], "names": _describe(job, st), "mode": st.mode,
        "packs": [[u, t] for u, t in st.packs] if st.mode == "swap" else [],
        "est_time_s": st.time_s, "est_gpu_bytes": st.mem_bytes,
    } for st in sol.stages]
    info = {
        "stages": S, "dp": dp, "accumulation": M, "schedule": knobs.schedule, "partition": partition,
        "t_star_s": sol.t_star, "time_bound_s": sol.bound, "bottleneck_s": sol.bottleneck_s,
        "est_peak_gpu_bytes": sol.peak_bytes, "tolerance_dropped": relaxed,
        "cpu_bytes_saved": saved, "cpu_bytes": dram, "swapped_layers": swapped,
        "search_evaluations": sol.evaluations,
    }
    return b.build(steps=2, notes=notes, info=info)


POLICY = PolicyInfo(NAME, "pipeline over GPUs with layer packs swapped from CPU DRAM (Tiny-Pipe)", Knobs, plan,
                    __doc__ or "",
                    search_grid=lambda n: {"stages": (0, *pow2_divisors(n))})
