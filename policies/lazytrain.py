"""``lazytrain``: a MILP over per-layer checkpointing and activation placement on a layer-streaming executor.

The paper's idea (LazyTrain, seed abstract; ../shared/reference/policies.md): an optimisation layer over
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

The MILP (``policies/lazytrain_milp.py`` has the exact algebra), per micro-step and per GPU:
- variables: binary ``x[i,(mode,place)]``, one per layer, mode keep|ckpt (embedding and head: keep only),
  place gpu|cpu|nvme (cpu only where it is a separate pool, nvme only where the hardware has drives);
  continuous ``e[w] >= 0`` per window; ``W`` (workspace); ``t``, ``u[i]`` (staging);
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
Times: the roofline of ``simulator.engine.compute_seconds`` (+ launch overhead), bandwidths and routes
from the topology. Capacities lose a 1 MiB safety margin. ``plan.info["milp"]`` has the solver's status,
objective, dual bound, MIP gap and solve time; ``plan.info["lazytrain"]`` the schedule, the estimate,
the pools' need, every tiering tried and the heuristics' objectives.

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

from dataclasses import dataclass
from typing import Any, Literal

from policies.base import Job, KnobError, PlanInfeasible, PolicyInfo
from policies.builder import PlanBuilder
from policies.lazytrain_costs import Costs, Tiering, build_costs, tierings
from policies.lazytrain_milp import (
    NODE_LIMIT,
    TIME_LIMIT_S,
    Evaluation,
    MilpResult,
    evaluate,
    heuristic,
    min_pool_need,
    solve_milp,
)
from simulator import Plan
from simulator.phase import Phase

NAME = "lazytrain"
HEURISTICS = ("keep_all", "checkpoint_all", "offload_all")


@dataclass(frozen=True)
class Knobs:
    strategy: Literal["milp", "keep_all", "checkpoint_all", "offload_all"] = "milp"
    time_limit_s: float = TIME_LIMIT_S
    node_limit: int = NODE_LIMIT
    mip_rel_gap: float = 1e-4
    prefetch_depth: int = 1
    optimizer_8bit: bool = False
    param_home: Literal["auto", "gpu", "cpu", "nvme"] = "auto"
    optimizer_home: Literal["auto", "gpu", "cpu", "nvme"] = "auto"
    cpu_grad_bytes: float = 4.0
    tiering_rule: Literal["least_offload", "fastest_estimate"] = "least_offload"

    def validate(self) -> None:
        if self.strategy not in ("milp", *HEURISTICS):
            raise KnobError(f"{NAME}: knob 'strategy' must be one of milp, {', '.join(HEURISTICS)}")
        if not self.time_limit_s > 0:
            raise KnobError(f"{NAME}: knob 'time_limit_s' must be > 0 seconds, got {self.time_limit_s}")
        if isinstance(self.node_limit, bool) or not isinstance(self.node_limit, int) or self.node_limit < 1:
            raise KnobError(f"{NAME}: knob 'node_limit' must be an integer >= 1, got {self.node_limit}")
        if not 0 <= self.mip_rel_gap < 1:
            raise KnobError(f"{NAME}: knob 'mip_rel_gap' must be in [0, 1), got {self.mip_rel_gap}")
        if isinstance(self.prefetch_depth, bool) or not isinstance(self.prefetch_depth, int) \
                or self.prefetch_depth < 1:
            raise KnobError(f"{NAME}: knob 'prefetch_depth' must be an integer >= 1, got {self.prefetch_depth}")
        for k in ("param_home", "optimizer_home"):
            if getattr(self, k) not in ("auto", "gpu", "cpu", "nvme"):
                raise KnobError(f"{NAME}: knob '{k}' must be one of auto, gpu, cpu, nvme")
        if self.param_home in ("cpu", "nvme") and self.optimizer_home == "gpu":
            raise KnobError(f"{NAME}: knob 'optimizer_home' cannot be gpu when 'param_home' is "
                            f"{self.param_home} (streamed parameters use the CPU optimizer)")
        if self.cpu_grad_bytes not in (2.0, 4.0):
            raise KnobError(f"{NAME}: knob 'cpu_grad_bytes' must be 2 or 4")
        if self.tiering_rule not in ("least_offload", "fastest_estimate"):
            raise KnobError(f"{NAME}: knob 'tiering_rule' must be least_offload or fastest_estimate")


@dataclass(frozen=True)
class Schedule:
    costs: Costs
    choice: tuple[int, ...]
    evaluation: Evaluation
    milp: MilpResult | None
    estimate_s: float
    accumulation: int
    candidates: tuple[dict[str, Any], ...]

    @property
    def tiering(self) -> Tiering:
        return self.costs.tiering


def _costs(job: Job, knobs: Knobs, t: Tiering) -> Costs:
    return build_costs(job, t, prefetch_depth=knobs.prefetch_depth, optimizer_8bit=knobs.optimizer_8bit,
                       cpu_grad_bytes=knobs.cpu_grad_bytes)


def schedule(job: Job, knobs: Knobs) -> Schedule:
    """Pick the tiering and the per-layer choices (the MILP or a heuristic) with the least estimated step."""
    knobs.validate()
    accum = job.accumulation(job.n_gpus)
    options = tierings(job, knobs.param_home, knobs.optimizer_home)
    if not options:
        raise KnobError(f"{NAME}: param_home={knobs.param_home}, optimizer_home={knobs.optimizer_home} is not "
                        f"possible on {job.hw.name} (no NVMe, or a unified machine whose CPU tier is the GPU's "
                        f"pool); use auto")
    least = knobs.tiering_rule == "least_offload"
    cands = sorted(((c.lower_bound_s(accum), i, c) for i, c in enumerate(_costs(job, knobs, t) for t in options)),
                   key=lambda x: ((x[2].tiering.level if least else 0), x[0], x[1]))
    best: Schedule | None = None
    log: list[dict[str, Any]] = []
    failed: list[tuple[Costs, MilpResult | Evaluation | None]] = []
    for lb, _, c in cands:
        rec: dict[str, Any] = {"tiering": str(c.tiering), "lower_bound_s": lb}
        log.append(rec)
        if best is not None and least and c.tiering.level > best.tiering.level:
            rec["result"] = f"skipped: level {best.tiering.level} fits and offloads less"
            continue
        if best is not None and lb >= best.estimate_s:
            rec["result"] = "skipped: its lower bound is above the best estimate"
            continue
        inst = c.instance
        if any(inst.fixed_bytes.get(k, 0.0) > cap for k, cap in inst.capacity.items()):
            rec["result"] = "does not fit: fixed bytes exceed a pool"
            failed.append((c, None))
            continue
        r: MilpResult | None = None
        if knobs.strategy == "milp":
            cutoff = None if best is None else (best.estimate_s - lb) / accum
            r = solve_milp(inst, time_limit_s=knobs.time_limit_s, mip_rel_gap=knobs.mip_rel_gap, cutoff_s=cutoff,
                           node_limit=knobs.node_limit)
            rec["milp"] = r.to_dict()
            if r.choice is None:
                if cutoff is not None and r.status_code == 2:
                    rec["result"] = "cannot beat the best estimate (MILP with that cutoff is infeasible)"
                    continue
                rec["result"] = f"no solution ({r.status})"
                failed.append((c, r))
                continue
            choice = r.choice
        else:
            choice = tuple(heuristic(inst, knobs.strategy))
        ev = evaluate(inst, choice)
        if not ev.feasible:
            rec["result"] = "does not fit"
            failed.append((c, ev))
            continue
        est = c.estimate_s(accum, ev.pure_objective)
        rec.update(result="feasible", estimate_s=est, objective_s=ev.objective)
        if best is None or est < best.estimate_s:
            best = Schedule(c, choice, ev, r, est, accum, ())
    if best is None:
        raise _infeasible(knobs, failed)
    return Schedule(best.costs, best.choice, best.evaluation, best.milp, best.estimate_s, accum, tuple(log))


def _infeasible(knobs: Knobs, failed: list[tuple[Costs, MilpResult | Evaluation | None]]) -> PlanInfeasible:
    """The verdict for the tiering closest to fitting: its most overfull pool and by how much."""
    worst: list[tuple[float, str, float, float, str]] = []
    for c, why in failed:
        inst = c.instance
        over: list[tuple[float, str, float, float, str]] = []
        for k, cap in inst.capacity.items():
            fixed = inst.fixed_bytes.get(k, 0.0)
            if fixed > cap:
                need, what = fixed, "model states and the parameter window alone"
            elif isinstance(why, Evaluation):
                need, what = why.need[k], f"the {knobs.strategy} schedule"
            else:
                need, what = min_pool_need(inst, k, time_limit_s=knobs.time_limit_s,
                                           node_limit=knobs.node_limit), \
                    "model states, workspace and the least activation memory of any schedule"
            over.append((need - cap, k, need, cap, f"{what} ({c.tiering})"))
        worst.append(max(over))
    _, pool, need, cap, what = min(worst)
    return PlanInfeasible(NAME, pool, need, cap, what)


# -- emission ----------------------------------------------------------------------------------------------
def plan(job: Job, knobs: Knobs) -> Plan:
    s = schedule(job, knobs)
    return emit(job, knobs, s)


def emit(job: Job, knobs: Knobs, s: Schedule) -> Plan:
    c = s.costs
    inst = c.instance
    tier = s.tiering
    level = tier.level
    layers = job.trace.layers
    nl = len(layers)
    n = c.n
    db = c.db
    gpus = [f"gpu{r}" for r in range(n)]
    depth = min(knobs.prefetch_depth, nl - 1)
    tail_from = nl - 1 - depth
    unit = c.unit_params
    p_total = float(sum(layer.params for layer in layers))
    opts = [inst.options[i][o] for i, o in enumerate(s.choice)]
    tied = job.model.tied_embeddings and nl > 1
    b = PlanBuilder(NAME, knobs, job)

    # streams
    for g in gpus:
        b.stream(f"{g}.compute", g, "compute")
        b.stream(f"{g}.h2d", g, "h2d")
        b.stream(f"{g}.d2h", g, "d2h")
        b.stream(f"{g}.act_out", g, "d2h")
        b.stream(f"{g}.act_in", g, "h2d")
    nvme_io = level >= 2 and "nvme" in (tier.optim, tier.params if level == 3 else "")
    for r in range(n):
        if level >= 2:
            b.stream(f"cpu.adam{r}", "cpu", "optim")
        if nvme_io:
            b.stream(f"nvme.io{r}", "nvme", "io")
    if n > 1:
        b.stream("dp.param", gpus[0], "comm")
        b.stream("dp.grad", gpus[0], "comm")

    # tensors
    for g in gpus:
        if level == 1:
            b.tensor(f"param16.{g}", p_total * db, "param16", home=g, persistent=True)
            b.tensor(f"grad.{g}", p_total * db, "grad", home=g, persistent=True)
            if c.master_bpp:
                b.tensor(f"param32.{g}", p_total * c.master_bpp, "param32", home=g, persistent=True)
            b.tensor(f"optim.{g}", p_total * c.optim_bpp, "optim", home=g, persistent=True)
        elif level == 2:
            b.tensor(f"param16.{g}", p_total * db, "param16", home=g, persistent=True)
        b.tensor(f"ws.{g}", s.evaluation.workspace, "buffer", home=g, persistent=True)
        for i in range(nl):
            kind = "checkpoint" if opts[i].mode == "ckpt" else "activation"
            b.tensor(f"act{i}.{g}", c.act_bytes[i][opts[i].mode], kind, scope="iteration", layer=i)
            if level >= 2:
                b.tensor(f"gb{i}.{g}", unit[i] * db, "grad", scope="iteration", layer=i)
            if level == 3:
                b.tensor(f"pgf{i}.{g}", unit[i] * db, "param16", scope="iteration", layer=i)
                if i < tail_from:
                    b.tensor(f"pgb{i}.{g}", unit[i] * db, "param16", scope="iteration", layer=i)
                if n > 1:
                    b.tensor(f"psf{i}.{g}", unit[i] * db / n, "buffer", scope="iteration", layer=i)
                    if i < tail_from:
                        b.tensor(f"psb{i}.{g}", unit[i] * db / n, "buffer", scope="iteration", layer=i)
    if level == 3:
        for i, layer in enumerate(layers):
            b.tensor(f"p16.{i}", layer.params * db, "param16", home=tier.params, layer=i, persistent=True)
    if level >= 2:
        for r in range(n):
            b.tensor(f"grad32.r{r}", p_total * knobs.cpu_grad_bytes / n, "grad32", home="cpu", persistent=True)
            if c.master_bpp:
                b.tensor(f"param32.r{r}", p_total * c.master_bpp / n, "param32", home=tier.optim, persistent=True)
            b.tensor(f"optim.r{r}", p_total * c.optim_bpp / n, "optim", home=tier.optim, persistent=True)
            if tier.optim == "nvme":
                for i, layer in enumerate(layers):
                    b.tensor(f"ostage{i}.r{r}", layer.params / n * (c.master_bpp + c.optim_bpp), "buffer",
                             scope="step", layer=i)

    off = [i for i in range(nl) if opts[i].place != "gpu"]
    before2 = {off[k]: off[k - 2] for k in range(2, len(off))}
    after2 = {off[k]: off[k + 2] for k in range(len(off) - 2)}

    def fresh(i: int, r: int) -> list[str]:
        """What makes the home copy of layer i's parameters current (the previous step's update)."""
        src = [i, 0] if tied and i == nl - 1 else [i]
        task = "adam" if tier.params == "cpu" else "pw"
        return [f"{task}{j}.r{r}^1" for j in src]

    def upload(i: int, phase: str, window: dict[str, list[str]]) -> dict[str, str]:
        """Tasks that bring layer i's parameters to every GPU; returns gpu -> task its use waits for."""
        pg, ps = f"pg{phase}{i}", f"ps{phase}{i}"
        tags = {"layer": i, "phase": Phase.PARAM_UPLOAD, "use": "fwd" if phase == "f" else "bwd"}
        ready = {}
        for r, g in enumerate(gpus):
            b.task(f"up{phase}{i}.{g}", "copy", f"{g}.h2d", window[g] + fresh(i, r), src=tier.params, dst=g,
                   bytes=unit[i] * db / n, allocs=[(f"{ps if n > 1 else pg}.{g}", g)],
                   tags={**tags, "rank": r})
            ready[g] = f"up{phase}{i}.{g}"
        if n > 1:
            t = b.task(f"ag{phase}{i}", "collective", "dp.param", list(ready.values()), coll="all_gather",
                       bytes=unit[i] * db, ranks=tuple(gpus), allocs=[(f"{pg}.{g}", g) for g in gpus],
                       frees=[(f"{ps}.{g}", g) for g in gpus], tags={"layer": i, "phase": Phase.PARAM_GATHER})
            ready = {g: t for g in gpus}
        return ready

    b.segment("micro-steps", s.accumulation)
    # forward
    for i, layer in enumerate(layers):
        ready: dict[str, str] = {}
        if level == 3:
            win = {g: ([f"fwd{i - depth - 1}.{g}"] if i - depth - 1 >= 0 else [f"bwd{depth - i}.{g}@1"])
                   for g in gpus}
            ready = upload(i, "f", win)
        for r, g in enumerate(gpus):
            if level == 1:
                deps = [f"opt.{g}^1"]
            elif level == 2:
                deps = [f"ag{i}^1"] if n > 1 else [f"up{i}.{g}^1"]
            else:
                deps = [ready[g]]
            if i in before2:
                deps.append(f"out{before2[i]}.{g}")
            frees = [(f"pgf{i}.{g}", g)] if level == 3 and i < tail_from else []
            b.task(f"fwd{i}.{g}", "compute", f"{g}.compute", deps, flops=layer.fwd_flops,
                   hbm_bytes=layer.fwd_hbm_bytes, allocs=[(f"act{i}.{g}", g)], frees=frees,
                   tags={"layer": i, "phase": Phase.FWD, "rank": r})
            if opts[i].place != "gpu":
                b.task(f"out{i}.{g}", "copy", f"{g}.act_out", [f"fwd{i}.{g}"], tensor=f"act{i}.{g}", src=g,
                       dst=opts[i].place, alloc_dst=True, free_src=True,
                       tags={"layer": i, "phase": Phase.ACTIVATION_OFFLOAD, "rank": r})
    # backward, last layer first
    for i in reversed(range(nl)):
        layer = layers[i]
        ready = {}
        if level == 3 and i < tail_from:
            ready = upload(i, "b", {g: [f"bwd{i + depth + 1}.{g}"] for g in gpus})
        for r, g in enumerate(gpus):
            pdeps = [ready[g]] if ready else []
            adeps: list[str] = []
            if opts[i].place != "gpu":
                in_deps = [f"out{i}.{g}"] + ([f"bwd{after2[i]}.{g}"] if i in after2 else [])
                b.task(f"in{i}.{g}", "copy", f"{g}.act_in", in_deps, tensor=f"act{i}.{g}", src=opts[i].place,
                       dst=g, alloc_dst=True, free_src=True,
                       tags={"layer": i, "phase": Phase.ACTIVATION_RELOAD, "rank": r})
                adeps = [f"in{i}.{g}"]
            deps = pdeps + adeps
            if opts[i].mode == "ckpt":
                b.task(f"rc{i}.{g}", "compute", f"{g}.compute", deps, flops=layer.fwd_flops,
                       hbm_bytes=layer.fwd_hbm_bytes, tags={"layer": i, "phase": Phase.RECOMPUTE, "rank": r})
                deps = []
            allocs = []
            if level >= 2:
                allocs = [(f"gb{i}.{g}", g)]
                deps.append(f"d2h{i + 2}.{g}" if i + 2 < nl else f"d2h{i + 2 - nl}.{g}@1")
            frees = [(f"act{i}.{g}", g)]
            if level == 3:
                frees.append((f"pgb{i}.{g}" if i < tail_from else f"pgf{i}.{g}", g))
            b.task(f"bwd{i}.{g}", "compute", f"{g}.compute", deps, flops=layer.bwd_flops,
                   hbm_bytes=layer.bwd_hbm_bytes, allocs=allocs, frees=frees,
                   tags={"layer": i, "phase": Phase.BWD, "rank": r})
        _emit_grads(b, gpus, level, i, layer.params * db, unit[i] * db)

    # optimizer
    b.segment("optimizer", 1)
    if level == 1:
        for r, g in enumerate(gpus):
            b.task(f"opt.{g}", "optimizer", f"{g}.compute", ["red0" if n > 1 else f"bwd0.{g}"], params=p_total,
                   tags={"phase": Phase.OPTIMIZER, "rank": r})
    else:
        _emit_cpu_optimizer(b, job, c, tier, gpus)

    ev = s.evaluation
    counts: dict[str, int] = {}
    for o in opts:
        counts[str(o)] = counts.get(str(o), 0) + 1
    notes = [f"LazyTrain over {n} data-parallel GPU(s), {s.accumulation} micro-step(s) per step; tiering "
             f"{tier} (level {level}); activations: "
             + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())),
             f"{'MILP' if s.milp else knobs.strategy}: recompute {ev.recompute_s:.4g} s + exposed transfer "
             f"{ev.exposed_s:.4g} s per micro-step (estimated step {s.estimate_s:.4g} s)"]
    if job.config.checkpointing != "none":
        notes.append(f"the workload's checkpointing={job.config.checkpointing} is not used: the MILP decides "
                     "per layer")
    if knobs.optimizer_8bit:
        notes.append("ASSUMPTION: 8-bit Adam states (1 B each for m and v + an fp32 scale per 2048 elements)")
    if tier.params == "gpu" and tier.optim == "gpu" and not off:
        notes.append("everything fits on the GPU: nothing is offloaded")
    cut = sorted({f"{r['tiering']}: {r['milp']['limit_hit']}" for r in s.candidates
                  if r.get("milp", {}).get("limit_hit")})
    if cut:
        notes.append("MILP stopped by a limit (" + "; ".join(cut) + "): the schedule may not be optimal"
                     + ("; the wall-clock safety net depends on the machine's load, so this plan may not "
                        "reproduce" if any(c.endswith(": time") for c in cut) else ""))
    return b.build(steps=2, notes=notes, info=_info(job, knobs, s, opts))


def _emit_grads(b: PlanBuilder, gpus: list[str], level: int, i: int, layer_bytes: float, unit_bytes: float) -> None:
    n = len(gpus)
    if level == 1:
        if n > 1:
            b.task(f"red{i}", "collective", "dp.grad", [f"bwd{i}.{g}" for g in gpus], coll="all_reduce",
                   bytes=layer_bytes, ranks=tuple(gpus), tags={"layer": i, "phase": Phase.GRAD_REDUCE})
        return
    red = None
    if n > 1:
        red = b.task(f"rs{i}", "collective", "dp.grad", [f"bwd{i}.{g}" for g in gpus], coll="reduce_scatter",
                     bytes=unit_bytes, ranks=tuple(gpus), tags={"layer": i, "phase": Phase.GRAD_REDUCE})
    for r, g in enumerate(gpus):
        b.task(f"d2h{i}.{g}", "copy", f"{g}.d2h", [red or f"bwd{i}.{g}"], src=g, dst="cpu", bytes=unit_bytes / n,
               frees=[(f"gb{i}.{g}", g)], tags={"layer": i, "phase": Phase.GRAD_OFFLOAD, "rank": r})


def _emit_cpu_optimizer(b: PlanBuilder, job: Job, c: Costs, tier: Tiering, gpus: list[str]) -> None:
    layers = job.trace.layers
    nl = len(layers)
    n = len(gpus)
    db = c.db
    states_bpp = c.master_bpp + c.optim_bpp

    def read(i: int, r: int) -> None:
        b.task(f"or{i}.r{r}", "copy", f"nvme.io{r}", [f"ow{i - 2}.r{r}"] if i >= 2 else [], src="nvme", dst="cpu",
               bytes=layers[i].params / n * states_bpp, allocs=[(f"ostage{i}.r{r}", "cpu")],
               tags={"layer": i, "phase": Phase.OPTIMIZER_SWAP_IN, "rank": r})

    for r in range(n):
        if tier.optim == "nvme":
            for i in range(min(2, nl)):
                read(i, r)
    for i, layer in enumerate(layers):
        for r, g in enumerate(gpus):
            deps = [f"d2h{i}.{g}"] + ([f"or{i}.r{r}"] if tier.optim == "nvme" else [])
            b.task(f"adam{i}.r{r}", "optimizer", f"cpu.adam{r}", deps, params=layer.params / n,
                   tags={"layer": i, "phase": Phase.OPTIMIZER, "rank": r})
            if tier.optim == "nvme":
                b.task(f"ow{i}.r{r}", "copy", f"nvme.io{r}", [f"adam{i}.r{r}"], src="cpu", dst="nvme",
                       bytes=layer.params / n * states_bpp, frees=[(f"ostage{i}.r{r}", "cpu")],
                       tags={"layer": i, "phase": Phase.OPTIMIZER_SWAP_OUT, "rank": r})
            if tier.params == "nvme":
                b.task(f"pw{i}.r{r}", "copy", f"nvme.io{r}", [f"adam{i}.r{r}"], src="cpu", dst="nvme",
                       bytes=layer.params / n * db, tags={"layer": i, "phase": Phase.PARAM_SWAP_OUT, "rank": r})
            if tier.optim == "nvme" and i + 2 < nl:
                read(i + 2, r)
            if tier.params == "gpu":
                b.task(f"up{i}.{g}", "copy", f"{g}.h2d", [f"adam{i}.r{r}"], src="cpu", dst=g,
                       bytes=layer.params / n * db, tags={"layer": i, "phase": Phase.PARAM_UPLOAD, "rank": r})
        if tier.params == "gpu" and n > 1:
            b.task(f"ag{i}", "collective", "dp.param", [f"up{i}.{g}" for g in gpus], coll="all_gather",
                   bytes=layer.params * db, ranks=tuple(gpus), tags={"layer": i, "phase": Phase.PARAM_GATHER})


def _info(job: Job, knobs: Knobs, s: Schedule, opts: list[Any]) -> dict[str, Any]:
    inst = s.costs.instance
    ev = s.evaluation
    heur: dict[str, Any] = {}
    for h in HEURISTICS:
        e = evaluate(inst, heuristic(inst, h))
        heur[h] = {"feasible": e.feasible, "objective_s": e.objective, "pure_objective_s": e.pure_objective}
    milp_info: dict[str, Any]
    if s.milp is not None:
        milp_info = {**s.milp.to_dict(), "evaluated_objective_s": ev.objective,
                     "recompute_s": ev.recompute_s, "exposed_s": ev.exposed_s}
    else:
        milp_info = {"status": f"not run (strategy={knobs.strategy})"}
    return {
        "milp": milp_info,
        "lazytrain": {
            "tiering": {"params": s.tiering.params, "optimizer": s.tiering.optim, "level": s.tiering.level},
            "accumulation": s.accumulation,
            "choice": [str(o) for o in opts],
            "recompute_s_per_microstep": ev.recompute_s,
            "exposed_s_per_microstep": ev.exposed_s,
            "estimated_step_s": s.estimate_s,
            "workspace_bytes": ev.workspace,
            "staging_bytes": ev.staging,
            "pool_need_bytes": dict(ev.need),
            "pool_capacity_bytes": dict(inst.capacity),
            "fixed_gpu_bytes": dict(s.costs.fixed_gpu_parts),
            "candidates": list(s.candidates),
            "heuristics": heur,
        },
    }


POLICY = PolicyInfo(NAME, "MILP over per-layer checkpointing and GPU/CPU/NVMe activation placement on a "
                          "layer-streaming data-parallel executor", Knobs, plan, __doc__ or "",
                    search_grid=lambda n: {"strategy": ("milp",)},
                    fixed_checkpointing="full")
