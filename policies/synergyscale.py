"""``synergyscale``: hierarchical offloading across peer GPUs, CPU DRAM and NVMe, with multi-stream chunking
and an automatic search of its parameters (SynergyScale; seed abstract only, see
../shared/reference/policies.md).

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
  Adam) and ``nvme`` (weights, master, m and v on the NVMe set, the gradients in DRAM; per step the
  optimizer swaps each layer's fp32 states in, runs CPU Adam and writes states and weights back,
  double-buffered).
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
  starts when the buffer ``buffers`` units back is freed (across micro-steps too). Gradient buckets are
  bounded the same way: a layer's backward waits until the bucket 3 layers back is reduced / offloaded
  (unbounded when every layer is resident and all buckets fit, as in plain data parallelism).
- With every layer resident the plan is exactly ``none`` at ZeRO stage 2 (stage 0 on one GPU); on
  several GPUs that is faster than ``none``'s default stage 0 (GPU Adam over 1/n of the states).
- Automatic selection (``auto``): a staged search over order x GPU/peer split x chunks x prefetch (the
  knobs left on auto) scored by an analytic list schedule of one rank (``synergyscale_model.estimate``);
  when the job is small enough (at most SIM_TASK_BUDGET simulated tasks in all) the fixed defaults and
  the best candidates are then simulated (a reduced plan: 1 and 2 micro-steps, extrapolated to the real
  accumulation; the real one when it is 1 or 2; 'streams' is only chosen there) and the fastest kept
  (the defaults on a tie, or within 0.2% when extrapolated). ``plan.info`` records the choice, the
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
  searched. The NVMe tier keeps its gradients in DRAM (fp32 by default), so DRAM, not NVMe, bounds the
  largest model: 70B does not fit one a100 preset (256 GB) with fp32 host gradients; the paper's 114B on
  one A100 implies a larger host or gradients kept elsewhere. CPU-side gradient accumulation is free.
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
- ``host_grad_bytes`` (float, 4): bytes per parameter of the host gradient buffer of the cpu and nvme
  tiers (4: fp32 as DeepSpeed's offload path; 2 keeps them in bf16/fp16 and lets bigger models fit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from policies.base import Job, KnobError, PlanInfeasible, PolicyInfo
from policies.builder import PlanBuilder
from policies.kit import Layout, workspace
from policies.synergyscale_model import (
    BUCKETS_IN_FLIGHT,
    FETCHED,
    TIERS,
    Choice,
    Ctx,
    Fractions,
    chunk_hbm,
    estimate,
    gpu_fixed_bytes,
    make_ctx,
    place,
    resident_buckets,
    tier_params,
)
from simulator import Plan, simulate_plan
from simulator.phase import Phase

NAME = "synergyscale"
DEFAULT_CHUNKS = 2
DEFAULT_STREAMS = 2
DEFAULT_PREFETCH = 2.0
DEFAULT_ORDER = "tail"
SEARCH_CHUNKS = (1, 2, 4, 8, 16)
SEARCH_PREFETCH = (1.0, 2.0, 4.0)
SEARCH_SHARES = (1.0, 0.75, 0.5, 0.25, 0.0)
SEARCH_STREAMS = (1, 2, 4)
SIM_TASK_BUDGET = 24_000   # tasks the search may simulate in all (the engine does ~15-20k tasks/s)
SIM_TOP = 3                # analytic best candidates simulated (besides the fixed defaults)


@dataclass(frozen=True)
class Knobs:
    auto: bool = True
    peer_fraction: str = "auto"
    cpu_fraction: str = "auto"
    nvme_fraction: str = "auto"
    chunks: int = 0
    streams: int = 0
    prefetch: float = 0.0
    order: str = "auto"
    offload_activations: bool = False
    host_grad_bytes: float = 4.0

    def fractions(self) -> Fractions:
        return Fractions(**{t: _fraction(getattr(self, f"{t}_fraction"), f"{t}_fraction") for t in FETCHED})

    def validate(self) -> None:
        fr = self.fractions()
        if sum(getattr(fr, t) or 0.0 for t in FETCHED) > 1.0 + 1e-9:
            raise KnobError(f"{NAME}: knobs 'peer_fraction' + 'cpu_fraction' + 'nvme_fraction' must not exceed 1")
        for name in ("chunks", "streams"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0 or v > 256:
                raise KnobError(f"{NAME}: knob '{name}' must be 0 (auto) or an integer 1..256, got {v!r}")
        if not (self.prefetch == 0 or 0.0 < self.prefetch <= 64):
            raise KnobError(f"{NAME}: knob 'prefetch' must be 0 (auto) or a number of layers in (0, 64], "
                            f"got {self.prefetch!r}")
        if self.host_grad_bytes not in (2.0, 4.0):
            raise KnobError(f"{NAME}: knob 'host_grad_bytes' must be 2 (bf16/fp16) or 4 (fp32), "
                            f"got {self.host_grad_bytes!r}")
        if self.order not in ("auto", "tail", "spread"):
            raise KnobError(f"{NAME}: knob 'order' must be one of auto, tail, spread, got {self.order!r}")


def _fraction(text: Any, name: str) -> float | None:
    if isinstance(text, str) and text.strip().lower() == "auto":
        return None
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise KnobError(f"{NAME}: knob '{name}' must be auto or a fraction in [0, 1], got {text!r}") from None
    if not 0.0 <= v <= 1.0:
        raise KnobError(f"{NAME}: knob '{name}' must be auto or a fraction in [0, 1], got {text!r}")
    return v


# -- search ------------------------------------------------------------------------------------------
def _make(ctx: Ctx, knobs: Knobs, fr: Fractions, order: str, share: float, c: int, s: int,
          pf: float) -> Choice:
    buffers = max(1, round(pf * c))
    tiers = place(ctx, NAME, order, share, c, buffers, knobs.offload_activations, fr)
    buckets = BUCKETS_IN_FLIGHT
    s = max(1, min(s, c))  # more streams than chunks would stay idle
    if not any(t in FETCHED for t in tiers):  # nothing to fetch: chunking and streams are moot
        c, s, buffers = 1, 1, 1
        buckets = resident_buckets(ctx)
    return Choice(tiers, c, s, buffers, order, share, knobs.offload_activations, buckets)


def fixed_choice(ctx: Ctx, knobs: Knobs) -> Choice:
    """The fixed defaults (auto=False): fill fastest tiers first, tail order, knobs or default values."""
    return _make(ctx, knobs, knobs.fractions(), knobs.order if knobs.order != "auto" else DEFAULT_ORDER, 1.0,
                 knobs.chunks or DEFAULT_CHUNKS, knobs.streams or DEFAULT_STREAMS,
                 knobs.prefetch or DEFAULT_PREFETCH)


def sim_tasks(ctx: Ctx, ch: Choice, micro_steps: int) -> int:
    """Tasks simulate_plan runs for ``ch`` with ``micro_steps`` per step (2 steps, the warm-up one with one
    micro-step), counted from the plan's structure without building it."""
    n = ctx.n
    L = ctx.layers
    micro = opt = 0
    for i, t in enumerate(ch.tiers):
        cc = ch.chunks if t in FETCHED else 1
        micro += n * cc * (2 + (L[i].recompute_flops > 0))
        if t in FETCHED:
            per_unit = {"peer": 1, "cpu": n + (ctx.sliced and 1), "nvme": n + (ctx.sliced and 1) + 2}[t]
            micro += 2 * cc * per_unit + (2 * n if ch.offload_activations else 0)
        micro += (n > 1) + (n if t in ("cpu", "nvme") else 0)
        opt += n if t in ("cpu", "nvme") else 0
        opt += 2 if t == "nvme" else 0
    opt += n + 1
    return micro * (micro_steps + 1) + 2 * opt


def search(ctx: Ctx, knobs: Knobs) -> tuple[Choice, dict[str, Any]]:
    fr = knobs.fractions()
    if not knobs.auto:
        return fixed_choice(ctx, knobs), {"search": "off (fixed defaults)", "candidates_evaluated": 1,
                                          "candidates_simulated": 0}
    try:
        default: Choice | None = fixed_choice(ctx, knobs)
    except PlanInfeasible:
        default = None  # the fixed defaults do not fit; the search may still find a chunking that does
    if default is not None and not any(t in FETCHED for t in default.tiers) and fr == Fractions():
        return default, {"search": "none needed (everything fits on the GPUs)", "candidates_evaluated": 1,
                         "candidates_simulated": 0}
    seen: dict[tuple, tuple[float, Choice]] = {}
    infeasible: list[PlanInfeasible] = []

    def ev(order: str, share: float, c: int, pf: float) -> tuple[float, Choice] | None:
        key = (order, share, c, pf)
        if key in seen:
            return seen[key]
        try:
            ch = _make(ctx, knobs, fr, order, share, c, 1, pf)
        except PlanInfeasible as e:
            infeasible.append(e)
            return None
        seen[key] = (estimate(ctx, ch).step_s, ch)
        return seen[key]

    orders = [knobs.order] if knobs.order != "auto" else ["tail", "spread"]
    shares = list(SEARCH_SHARES) if ctx.peer_ok and fr.peer is None else [1.0]
    chunk_opts = [knobs.chunks] if knobs.chunks else list(SEARCH_CHUNKS)
    pf_opts = [knobs.prefetch] if knobs.prefetch else list(SEARCH_PREFETCH)
    c0 = knobs.chunks or DEFAULT_CHUNKS
    p0 = knobs.prefetch or DEFAULT_PREFETCH
    stage_a = [ev(o, s, c0, p0) for o in orders for s in shares]
    feasible_a = [x for x in stage_a if x]
    if not feasible_a:  # the defaults do not fit: look for any chunking / prefetch that does
        feasible_a = [x for x in (ev(o, s, c, p) for o in orders for s in shares for c in chunk_opts
                                  for p in pf_opts) if x]
        if not feasible_a:
            raise min(infeasible, key=lambda e: e.need_bytes - e.capacity_bytes)
    best = min(feasible_a, key=lambda x: x[0])
    if any(t in FETCHED for t in best[1].tiers):
        bo, bs = best[1].order, best[1].gpu_share
        for c in chunk_opts:
            for p in pf_opts:
                x = ev(bo, bs, c, p)
                if x and x[0] < best[0]:
                    best = x
        bc, bp = best[1].chunks, best[1].buffers / best[1].chunks
        for o in orders:
            for s in shares:
                x = ev(o, s, bc, bp)
                if x and x[0] < best[0]:
                    best = x
    ranked = sorted({id(ch): (t, ch) for t, ch in seen.values()}.values(), key=lambda x: x[0])
    info: dict[str, Any] = {"candidates_evaluated": len(seen) + 1, "candidates_simulated": 0,
                            "estimate_step_s": best[0],
                            "default_estimate_step_s": estimate(ctx, default).step_s if default else None}
    chosen = replace(best[1], streams=knobs.streams or 1)
    # simulation refinement for jobs small enough
    pool: list[Choice] = [default or best[1]]
    for _, ch in ranked:
        if len(pool) > SIM_TOP:
            break
        if all(ch.tiers != q.tiers or ch.chunks != q.chunks or ch.buffers != q.buffers for q in pool):
            pool.append(ch)
    stream_opts = [knobs.streams] if knobs.streams else list(SEARCH_STREAMS)
    accum = ctx.job.accumulation(ctx.n)
    reps = [1, 2] if accum > 2 else [accum]
    todo: list[tuple[int, Choice]] = [(0, pool[0])]
    for k, ch in enumerate(pool[1:], start=1):
        todo += [(k, ch)] if ch.chunks == 1 else [(k, replace(ch, streams=s)) for s in stream_opts if s <= ch.chunks]
    budget = SIM_TASK_BUDGET
    runs: list[tuple[int, Choice]] = []
    for k, ch in todo:
        cost = sum(sim_tasks(ctx, ch, r) for r in reps)
        if cost > budget:
            break
        budget -= cost
        runs.append((k, ch))
    scored: list[tuple[float, int, Choice]] = []
    if len(runs) > 1 and runs[-1][0] > 0:
        for k, ch in runs:
            plan = build(ctx, knobs, ch, {})
            times = []
            for r in reps:
                res = simulate_plan(plan.with_repeats({"micro-steps": r}), ctx.job.hw)
                times.append(res.step_time_s if res.feasible else math.inf)
            info["candidates_simulated"] += 1
            scored.append((times[0] if len(times) == 1 else times[0] + (accum - 1) * (times[1] - times[0]), k, ch))
    if len(scored) > 1:
        t_def = scored[0][0]
        t_best, _, ch_best = min(scored, key=lambda x: (x[0], x[2].streams))
        tol = 0.0 if accum <= 2 else 2e-3  # extrapolated scores: keep the defaults unless clearly beaten
        keep_default = default is not None and not t_best < t_def * (1 - tol)
        chosen = scored[0][2] if keep_default else ch_best
        info["search"] = "analytic + simulated"
        info["simulated_step_s"] = t_def if keep_default else t_best
    else:
        info["search"] = "analytic"
    return chosen, info


# -- plan ----------------------------------------------------------------------------------------------
def plan(job: Job, knobs: Knobs) -> Plan:
    knobs.validate()
    ctx = make_ctx(job, knobs.host_grad_bytes)
    fr = knobs.fractions()
    if (fr.peer or 0) > 0 and not ctx.peer_ok:
        raise KnobError(f"{NAME}: knob 'peer_fraction' needs more than one GPU joined by NVLink; "
                        f"'{job.hw.name}' has {'no NVLink' if job.n_gpus > 1 else 'one GPU'} (use 0 or auto)")
    if (fr.nvme or 0) > 0 and not ctx.has_nvme:
        raise KnobError(f"{NAME}: knob 'nvme_fraction' needs NVMe drives; '{job.hw.name}' has none (use 0 or auto)")
    job.accumulation(ctx.n)  # a clear error for a global batch that does not divide
    choice, info = search(ctx, knobs)
    return build(ctx, knobs, choice, info)


def _summary(ctx: Ctx, ch: Choice) -> dict[str, Any]:
    L = ctx.layers
    n = ctx.n
    tp = tier_params(ctx, ch.tiers)
    total = sum(tp.values())
    tiers = {t: {"layers": sum(1 for x in ch.tiers if x == t), "params": tp[t], "fraction": tp[t] / total}
             for t in TIERS}
    gpu_states = sum(ctx.gpu_cost(i, t) for i, t in enumerate(ch.tiers) if t == "gpu")
    peer = sum(ctx.gpu_cost(i, t) for i, t in enumerate(ch.tiers) if t == "peer")
    fixed = gpu_fixed_bytes(ctx, ch.tiers, ch.chunks, ch.buffers, ch.offload_activations, ch.buckets)
    saved = 0.0  # net bytes per GPU taken out of the GPU's pool (unified: host-side states stay in it)
    for i, t in enumerate(ch.tiers):
        saved += ctx.gpu_cost(i, "gpu") - ctx.gpu_cost(i, t) - (ctx.host_cost(i, t) if ctx.unified else 0.0)
    return {
        "dp": n, "tiers": tiers, "layer_tiers": "".join(t[0] for t in ch.tiers),
        "gpu_state_bytes_per_gpu": gpu_states, "peer_bytes_per_gpu": peer,
        "gpu_spare_bytes_per_gpu": ctx.gpu_cap - fixed - gpu_states, "gpu_working_set_bytes": fixed,
        "host_state_bytes": sum(ctx.host_cost(i, t) for i, t in enumerate(ch.tiers)),
        "nvme_state_bytes": sum(ctx.nvme_cost(i, t) for i, t in enumerate(ch.tiers)),
        "gpu_bytes_saved_per_gpu": saved, "fetch": "sliced + NVLink all-gather" if ctx.sliced else "whole per GPU",
        "params": float(sum(ly.params for ly in L)),
    }


def build(ctx: Ctx, knobs: Knobs, ch: Choice, info: dict[str, Any]) -> Plan:
    job = ctx.job
    n = ctx.n
    L = ctx.layers
    nl = len(L)
    gpus = [f"gpu{r}" for r in range(n)]
    tiers = ch.tiers
    c, S, D = ch.chunks, max(1, min(ch.streams, ch.chunks)), ch.buffers
    fetched = [t in FETCHED for t in tiers]
    host_layers = [i for i, t in enumerate(tiers) if t in ("cpu", "nvme")]
    nvme_layers = [i for i, t in enumerate(tiers) if t == "nvme"]
    accum = job.accumulation(n)
    act_off = ch.offload_activations
    b = PlanBuilder(NAME, knobs, job)

    def cs(g: str, k: int) -> str:
        j = k % S
        return f"{g}.compute" if j == 0 else f"{g}.compute{j}"

    for g in gpus:
        for j in range(S):
            b.stream(cs(g, j), g, "compute")
        b.stream(f"{g}.h2d", g, "h2d")
        b.stream(f"{g}.d2h", g, "d2h")
    if host_layers:
        for r in range(n):
            b.stream(f"cpu.adam{r}", "cpu", "optim")
    if n > 1:
        b.stream("dp.param", "gpu0", "comm")
        b.stream("dp.grad", "gpu0", "comm")
    if nvme_layers:
        b.stream("nvme.rd", "nvme", "io")
        b.stream("nvme.wr", "nvme", "io")
        b.stream("cpu.stage", "cpu", "copy")

    # persistent model states
    def tsum(tier: str, attr: str) -> float:
        return float(sum(getattr(L[i], attr) for i, t in enumerate(tiers) if t == tier))

    div = n if n > 1 else 1
    per_gpu = {
        ("p16", "param16"): tsum("gpu", "param_bytes") + tsum("peer", "param_bytes") / n,
        ("grad", "grad"): (tsum("gpu", "grad_bytes") + tsum("peer", "grad_bytes")) / div,
        ("m32", "param32"): (tsum("gpu", "master_bytes") + tsum("peer", "master_bytes")) / div,
        ("opt", "optim"): (tsum("gpu", "optimizer_bytes") + tsum("peer", "optimizer_bytes")) / div,
    }
    for g in gpus:
        for (name, kind), nbytes in per_gpu.items():
            if nbytes > 0:
                b.tensor(f"{name}.{g}", nbytes, kind, home=g, persistent=True)
    host = {("p16.cpu", "param16"): tsum("cpu", "param_bytes"), ("m32.cpu", "param32"): tsum("cpu", "master_bytes"),
            ("opt.cpu", "optim"): tsum("cpu", "optimizer_bytes"),
            ("g32.cpu", "grad32"): ctx.host_grad_bytes * (tsum("cpu", "params") + tsum("nvme", "params"))}
    for (name, kind), nbytes in host.items():
        if nbytes > 0:
            b.tensor(name, nbytes, kind, home="cpu", persistent=True)
    nv = {("p16.nvme", "param16"): tsum("nvme", "param_bytes"), ("m32.nvme", "param32"): tsum("nvme", "master_bytes"),
          ("opt.nvme", "optim"): tsum("nvme", "optimizer_bytes")}
    for (name, kind), nbytes in nv.items():
        if nbytes > 0:
            b.tensor(name, nbytes, kind, home="nvme", persistent=True)
    workspace(b, job, Layout(n, 1))

    # per micro-step tensors
    def bucket(i: int) -> bool:
        return n > 1 or tiers[i] != "gpu"

    for g in gpus:
        for i, ly in enumerate(L):
            b.tensor(f"act{i}.{g}", ly.activation_bytes, "activation", scope="iteration", layer=i)
            if bucket(i):
                b.tensor(f"gb{i}.{g}", ly.grad_bytes, "grad", scope="iteration", layer=i)
            if fetched[i]:
                for k in range(c):
                    for p in "fb":
                        b.tensor(f"p{p}{i}_{k}.{g}", ly.param_bytes / c, "param16", scope="iteration", layer=i)
    for i in nvme_layers:
        for k in range(c):
            for p in "fb":
                b.tensor(f"s{p}{i}_{k}", L[i].param_bytes / c, "buffer", scope="iteration", layer=i)
        b.tensor(f"sw{i}", L[i].master_bytes + L[i].optimizer_bytes, "buffer", scope="step", layer=i)

    b.segment("micro-steps", accum)
    # ---- fetches, in consumption order
    units = [("f", i, k) for i in range(nl) if fetched[i] for k in range(c)]
    units += [("b", i, k) for i in reversed(range(nl)) if fetched[i] for k in range(c)]
    U = len(units)

    def cons(u: tuple[str, int, int], g: str) -> str:
        p, i, k = u
        return f"{'fw' if p == 'f' else 'bw'}{i}_{k}.{g}"

    def gate(ui: int, g: str) -> list[str]:
        if ui >= D:
            return [cons(units[ui - D], g)]
        if U - D + ui >= 0:
            return [cons(units[U - D + ui], g) + "@1"]
        return []

    ready: dict[tuple[str, int, int], dict[str, str]] = {}
    for ui, u in enumerate(units):
        p, i, k = u
        tier = tiers[i]
        ly = L[i]
        cb = ly.param_bytes / c
        tag = {"layer": i, "phase": Phase.PARAM_UPLOAD, "use": "fwd" if p == "f" else "bwd", "chunk": k, "tier": tier}
        pre_all: list[str] = []
        pre_rank: dict[str, list[str]] = {g: [] for g in gpus}
        if p == "f" and k == 0:
            if tier == "peer":
                pre_all = [f"gopt.{g}^1" for g in gpus]
            elif tier == "cpu":
                for r, g in enumerate(gpus):
                    pre_rank[g] = [f"adam{i}.r{r}^1"] if ctx.sliced else [f"adam{i}.r{q}^1" for q in range(n)]
            else:
                pre_all = [f"swo{i}^1"]
        if act_off and p == "b" and k == 0:
            for g in gpus:
                b.task(f"ai{i}.{g}", "copy", f"{g}.h2d", [f"ao{i}.{g}"], tensor=f"act{i}.{g}", src="cpu", dst=g,
                       alloc_dst=True, free_src=True, tags={"layer": i, "phase": Phase.ACTIVATION_RELOAD})
        gates_all = [d for g in gpus for d in gate(ui, g)]
        if tier == "peer":
            t = b.task(f"ag{p}{i}_{k}", "collective", "dp.param", gates_all + pre_all, coll="all_gather", bytes=cb,
                       ranks=tuple(gpus), allocs=[(f"p{p}{i}_{k}.{g}", g) for g in gpus], tags=tag)
            ready[u] = dict.fromkeys(gpus, t)
            continue
        rd = None
        if tier == "nvme":
            rd = b.task(f"rd{p}{i}_{k}", "copy", "nvme.rd", gates_all + pre_all, src="nvme", dst="cpu", bytes=cb,
                        allocs=[(f"s{p}{i}_{k}", "cpu")], tags=tag)
        ups = {}
        for g in gpus:
            deps = [rd] if rd else gate(ui, g) + pre_rank[g]
            ups[g] = b.task(f"up{p}{i}_{k}.{g}", "copy", f"{g}.h2d", deps, src="cpu", dst=g,
                            bytes=cb / n if ctx.sliced else cb, allocs=[(f"p{p}{i}_{k}.{g}", g)], tags=tag)
        if ctx.sliced:
            t = b.task(f"ag{p}{i}_{k}", "collective", "dp.param", list(ups.values()), coll="all_gather", bytes=cb,
                       ranks=tuple(gpus), tags=tag)
            ready[u] = dict.fromkeys(gpus, t)
        else:
            ready[u] = ups
        if rd:
            b.task(f"fs{p}{i}_{k}", "free", "cpu.stage", list(ups.values()), frees=[(f"s{p}{i}_{k}", "cpu")], tags=tag)

    # ---- compute, in program order
    first_gpu = next((i for i, t in enumerate(tiers) if t == "gpu"), None)
    gpu_ready = {g: (["agg^1"] if n > 1 else [f"gopt.{g}^1"]) for g in gpus}
    prev: dict[str, tuple[str, str]] = {}  # gpu -> (task that completes the previous layer, its stream)

    def after(g: str, stream: str) -> list[str]:
        pv = prev.get(g)
        return [pv[0]] if pv and pv[1] != stream else []

    for i, ly in enumerate(L):
        for r, g in enumerate(gpus):
            tag = {"layer": i, "phase": Phase.FWD, "rank": r}
            if not fetched[i]:
                st = cs(g, 0)
                deps = (gpu_ready[g] if i == first_gpu else []) + after(g, st)
                prev[g] = (b.task(f"fw{i}.{g}", "compute", st, deps, flops=ly.fwd_flops, hbm_bytes=ly.fwd_hbm_bytes,
                                  allocs=[(f"act{i}.{g}", g)], tags=tag), st)
            else:
                pv = prev.get(g)
                for k in range(c):
                    st = cs(g, k)
                    deps = [ready[("f", i, k)][g]] + ([pv[0]] if pv and pv[1] != st else [])
                    if k == c - 1:
                        deps += [f"fw{i}_{j}.{g}" for j in range(k) if cs(g, j) != st]
                    b.task(f"fw{i}_{k}.{g}", "compute", st, deps, flops=ly.fwd_flops / c,
                           hbm_bytes=chunk_hbm(ly.fwd_hbm_bytes, ly.output_bytes, c),
                           allocs=[(f"act{i}.{g}", g)] if k == 0 else [], frees=[(f"pf{i}_{k}.{g}", g)],
                           tags={**tag, "chunk": k})
                prev[g] = (f"fw{i}_{c - 1}.{g}", cs(g, c - 1))
                if act_off:
                    b.task(f"ao{i}.{g}", "copy", f"{g}.d2h", [prev[g][0]], tensor=f"act{i}.{g}", src=g, dst="cpu",
                           alloc_dst=True, free_src=True,
                           tags={"layer": i, "phase": Phase.ACTIVATION_OFFLOAD, "rank": r})
    last_red = None
    blay = [i for i in reversed(range(nl)) if bucket(i)]
    bpos = {i: j for j, i in enumerate(blay)}
    B = ch.buckets

    def bucket_gate(i: int, g: str) -> list[str]:
        """The task freeing the gradient bucket B layers back (bounded buckets in flight)."""
        if not bucket(i):
            return []
        j = bpos[i]
        q, suffix = (j - B, "") if j >= B else (len(blay) - B + j, "@1")
        if q < 0:
            return []
        o = blay[q]
        return [(f"gd{o}.{g}" if tiers[o] in ("cpu", "nvme") else f"red{o}") + suffix]

    for i in reversed(range(nl)):
        ly = L[i]
        rc = ly.recompute_flops > 0
        for r, g in enumerate(gpus):
            if not fetched[i]:
                st = cs(g, 0)
                deps = after(g, st)
                if rc:
                    b.task(f"rc{i}.{g}", "compute", st, deps, flops=ly.recompute_flops, hbm_bytes=ly.fwd_hbm_bytes,
                           tags={"layer": i, "phase": Phase.RECOMPUTE, "rank": r})
                    deps = []
                prev[g] = (b.task(f"bw{i}.{g}", "compute", st, deps + bucket_gate(i, g), flops=ly.bwd_flops,
                                  hbm_bytes=ly.bwd_hbm_bytes,
                                  allocs=[(f"gb{i}.{g}", g)] if bucket(i) else [], frees=[(f"act{i}.{g}", g)],
                                  tags={"layer": i, "phase": Phase.BWD, "rank": r}), st)
                continue
            pv = prev.get(g)
            for k in range(c):
                st = cs(g, k)
                extra = ([pv[0]] if pv and pv[1] != st else []) + ([f"ai{i}.{g}"] if act_off else [])
                deps = [ready[("b", i, k)][g]] + extra
                if rc:
                    b.task(f"rc{i}_{k}.{g}", "compute", st, deps, flops=ly.recompute_flops / c,
                           hbm_bytes=chunk_hbm(ly.fwd_hbm_bytes, ly.output_bytes, c),
                           tags={"layer": i, "phase": Phase.RECOMPUTE, "rank": r, "chunk": k})
                    deps = []
                if k == c - 1:
                    deps += [f"bw{i}_{j}.{g}" for j in range(k) if cs(g, j) != st]
                if k == 0:
                    deps += bucket_gate(i, g)
                b.task(f"bw{i}_{k}.{g}", "compute", st, deps, flops=ly.bwd_flops / c,
                       hbm_bytes=chunk_hbm(ly.bwd_hbm_bytes, ly.output_bytes, c),
                       allocs=[(f"gb{i}.{g}", g)] if k == 0 else [],
                       frees=[(f"pb{i}_{k}.{g}", g)] + ([(f"act{i}.{g}", g)] if k == c - 1 else []),
                       tags={"layer": i, "phase": Phase.BWD, "rank": r, "chunk": k})
            prev[g] = (f"bw{i}_{c - 1}.{g}", cs(g, c - 1))
        done = {g: prev[g][0] for g in gpus}
        red = None
        if n > 1:
            red = last_red = b.task(f"red{i}", "collective", "dp.grad", list(done.values()), coll="reduce_scatter",
                                    bytes=ly.grad_bytes, ranks=tuple(gpus),
                                    frees=[(f"gb{i}.{g}", g) for g in gpus] if tiers[i] in ("gpu", "peer") else [],
                                    tags={"layer": i, "phase": Phase.GRAD_REDUCE})
        if tiers[i] in ("cpu", "nvme"):
            for r, g in enumerate(gpus):
                b.task(f"gd{i}.{g}", "copy", f"{g}.d2h", [red or done[g]], src=g, dst="cpu",
                       bytes=ly.params / n * ctx.grad_bytes_per_param(i), frees=[(f"gb{i}.{g}", g)],
                       tags={"layer": i, "phase": Phase.GRAD_OFFLOAD, "rank": r})

    # ---- optimizer
    b.segment("optimizer", 1)
    tp = tier_params(ctx, tiers)
    gpu_params = (tp["gpu"] + tp["peer"]) / n if n > 1 else tp["gpu"]
    if gpu_params > 0:
        for r, g in enumerate(gpus):
            b.task(f"gopt.{g}", "optimizer", cs(g, 0), [last_red] if last_red else [prev[g][0]], params=gpu_params,
                   tags={"phase": Phase.OPTIMIZER, "rank": r, "tier": "gpu+peer"})
        if n > 1 and tp["gpu"] > 0:
            b.task("agg", "collective", "dp.param", [f"gopt.{g}" for g in gpus], coll="all_gather",
                   bytes=tsum("gpu", "param_bytes"), ranks=tuple(gpus), tags={"phase": Phase.PARAM_GATHER})
    nv_order = [i for i in reversed(range(nl)) if tiers[i] == "nvme"]
    for i in reversed(host_layers):
        ly = L[i]
        nvme = tiers[i] == "nvme"
        if nvme:
            j = nv_order.index(i)
            b.task(f"swi{i}", "copy", "nvme.rd", [f"swo{nv_order[j - 2]}"] if j >= 2 else [], src="nvme", dst="cpu",
                   bytes=ly.master_bytes + ly.optimizer_bytes, allocs=[(f"sw{i}", "cpu")],
                   tags={"layer": i, "phase": Phase.OPTIMIZER_SWAP_IN})
        for r, g in enumerate(gpus):
            b.task(f"adam{i}.r{r}", "optimizer", f"cpu.adam{r}", [f"gd{i}.{g}"] + ([f"swi{i}"] if nvme else []),
                   params=ly.params / n, tags={"layer": i, "phase": Phase.OPTIMIZER, "rank": r})
        if nvme:
            b.task(f"swo{i}", "copy", "nvme.wr", [f"adam{i}.r{r}" for r in range(n)], src="cpu", dst="nvme",
                   bytes=ly.master_bytes + ly.optimizer_bytes + ly.param_bytes, frees=[(f"sw{i}", "cpu")],
                   tags={"layer": i, "phase": Phase.OPTIMIZER_SWAP_OUT})

    summary = _summary(ctx, ch)
    t = summary["tiers"]
    notes = [f"data parallel over {n} GPU(s), {accum} micro-step(s) per step; parameters by tier: "
             + ", ".join(f"{k} {v['fraction']:.0%} ({v['layers']} layers)" for k, v in t.items() if v["layers"])
             + f"; {c} chunk(s) per fetched layer on {S} stream(s), {D} chunk buffer(s), order {ch.order}"]
    if ctx.unified:
        notes.append("unified memory: GPU and CPU share one pool, so CPU placement frees nothing (never chosen "
                     "by auto; reported as no saving); only NVMe is a real extra tier")
    if job.model.tied_embeddings and tiers[0] == "gpu" and any(fetched):
        notes.append("tied embeddings: the embedding stays on the GPU (the head's matmul reads it)")
    full_info = {"accumulation": accum, **summary, "chosen": ch.params(), **info}
    return b.build(steps=2, notes=notes, info=full_info)


POLICY = PolicyInfo(NAME, "hierarchical offloading over peer GPUs, CPU and NVMe with multi-stream chunking and "
                          "an automatic parameter search", Knobs, plan, __doc__ or "",
                    search_grid=lambda n: {"auto": (True,), "offload_activations": (False, True)})
