"""``tinypipe.plan``: the decided pipeline, the DRAM check, the plan's streams, persistent tensors and tasks, and
what the plan reports of itself (notes and ``info``)."""

from __future__ import annotations

from typing import Any

from hardware_models import build_topology
from policies import kit
from policies.base import Job, PlanInfeasible, unified
from policies.builder import PlanBuilder
from policies.tinypipe.emit import Ev, Key, Recorder
from policies.tinypipe.packing import MODES
from policies.tinypipe.pipeline import (
    ADAM_BYTES,
    BOUNCE_BUFFERS,
    GRAD32_BYTES,
    NAME,
    Knobs,
    Pipeline,
    decide,
    master_bytes,
)
from policies.tinypipe.tasks import OptimizerSegment, StageRun
from simulator import Plan
from simulator.phase import Phase
from simulator.rank_template import RankTemplate

PIPE_STREAMS = (("fsend", "copy"), ("bsend", "copy"))   # activations to the next stage, gradients back
CPU_STREAMS = (("adam", "optim"),)                       # a CPU-optimised stage's Adam, per GPU rank


def plan(job: Job, knobs: Knobs) -> Plan:
    knobs.validate()
    pipe = decide(job, knobs)
    dram = dram_bytes(pipe, job)
    if not pipe.unified:
        check_dram(job, dram)
    pipe.template = template_of(job, pipe)
    b = PlanBuilder(NAME, knobs, job, template=pipe.template)
    declare_gpu_side(b, pipe, master_bytes(job))
    declare_cpu_side(b, pipe, master_bytes(job))
    rec = Recorder(b, pipe.schedule)
    final_bwd: dict[Key, Ev] = {}
    final_d2h: dict[Key, Ev] = {}
    for r in pipe.replicas():
        for st in pipe.stages if pipe.gpipe else ():   # GPipe: all M micro-batches' activations, allocated once
            g = pipe.gpu(r, st.index)
            rec.tensor(f"stash.{g}", sum(pipe.layers[x].activation_bytes for x in range(st.first, st.last + 1))
                       * pipe.M, "activation", "step")
            rec.at(0, 0).task(f"stalloc.{g}", "alloc", f"{g}.compute", allocs=[(f"stash.{g}", g)],
                              tags={"stage": st.index, "rank": r, "phase": Phase.ACTIVATION_STASH})
    for r in pipe.replicas():
        for st in pipe.stages:
            StageRun(rec, pipe, r, st, final_bwd, final_d2h).run()
    OptimizerSegment(rec, pipe, final_bwd, final_d2h).run()
    rec.emit()
    return b.build(steps=2, notes=notes(job, knobs, pipe), info=info(pipe, knobs, dram))


def template_of(job: Job, pipe: Pipeline) -> RankTemplate | None:
    """Where the job asks for one (``kit.templated``), a rank template of the pipeline replicas
    (``simulator.rank_template``, a rank of ``S`` GPUs): replica 0's tasks, and each stage's data-parallel
    collectives with their dependencies on replica 0's. Not with a swapping stage: every replica reads the
    stage's packs from one 16-bit home in DRAM, a tensor no one replica's tasks stand for (the full plan is not
    symmetric either)."""
    if not kit.templated(job) or pipe.dp < 2 or any(st.mode == "swap" for st in pipe.stages):
        return None
    return RankTemplate(pipe.dp, width=pipe.S)


def dram_bytes(pipe: Pipeline, job: Job) -> dict[str, float]:
    """DRAM the plan keeps, by purpose: per CPU-optimised stage its fp32 master, Adam m and v and fp32 gradient
    accumulator; swapped packs' 16-bit homes; resident stages' bounce buffers (per GPU ``BOUNCE_BUFFERS`` of a
    layer's 1/dp share, on dp GPUs); without active CPU memory management, every GPU's own 16-bit stage copy."""
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
            out["bounce"] += BOUNCE_BUFFERS * max(pipe.layer_bytes(x) for x in range(st.first, st.last + 1))
    if not pipe.active_cpu_mm and not pipe.unified:
        out["naive16"] = pipe.dp * sum(pipe.stage_bytes(st) for st in pipe.stages)
    return out


def check_dram(job: Job, dram: dict[str, float]) -> None:
    """PlanInfeasible when the CPU-side model states overflow DRAM (before anything is simulated)."""
    topo = build_topology(job.hw)
    cap = topo.pools[topo.pool_of["cpu"]].capacity_bytes
    need = sum(dram.values())
    if need > cap:
        raise PlanInfeasible(NAME, topo.pool_of["cpu"], need, cap,
                             "the CPU-side model states (fp32 master, Adam m/v, fp32 gradients, swapped "
                             "16-bit weights" + (", redundant 16-bit copies" if dram["naive16"] else "") + ")")


def declare_gpu_side(b: PlanBuilder, pipe: Pipeline, master: float) -> None:
    """Per GPU: its streams (the kit's compute, h2d, d2h and the pipeline's sends), workspace, the stage's
    resident weights, gradients and (``gpu`` mode) states."""
    for r in pipe.replicas():
        for st in pipe.stages:
            g = pipe.gpu(r, st.index)
            kit.gpu_streams(b, [g], extra=PIPE_STREAMS)
            if st.mode != "gpu":
                kit.cpu_streams(b, [pipe.rank(r, st.index)], CPU_STREAMS)
            ws = max(pipe.layers[x].peak_transient_bytes for x in range(st.first, st.last + 1))
            b.tensor(f"ws.{g}", ws, "buffer", home=g, persistent=True)
            if st.mode != "swap":
                b.tensor(f"p16.{g}", pipe.stage_bytes(st), "param16", home=g, persistent=True)
                b.tensor(f"g16.{g}", pipe.stage_bytes(st), "grad", home=g, persistent=True)
            if st.mode == "gpu":
                if master:
                    b.tensor(f"m32.{g}", master * pipe.stage_params(st), "param32", home=g, persistent=True)
                b.tensor(f"adam.{g}", ADAM_BYTES * pipe.stage_params(st), "optim", home=g, persistent=True)
            if not pipe.active_cpu_mm and not pipe.unified:
                b.tensor(f"naive16.{g}", pipe.stage_bytes(st), "param16", home="cpu", persistent=True)


def declare_cpu_side(b: PlanBuilder, pipe: Pipeline, master: float) -> None:
    """Per stage: its data-parallel stream, and the CPU-side states and pack homes of a CPU optimizer."""
    for st in pipe.stages:
        s = st.index
        if pipe.dp > 1:
            b.stream(f"dp{s}", pipe.gpu(0, s), "comm")
        if st.mode == "gpu":
            continue
        p = pipe.stage_params(st)
        if master:
            b.tensor(f"m32.s{s}", master * p, "param32", home="cpu", persistent=True)
        b.tensor(f"adam.s{s}", ADAM_BYTES * p, "optim", home="cpu", persistent=True)
        b.tensor(f"gr32.s{s}", GRAD32_BYTES * p, "grad32", home="cpu", persistent=True)
        for k, (u, t) in enumerate(st.packs if st.mode == "swap" else ()):
            b.tensor(f"home.s{s}.p{k}", pipe.pack_home_bytes(s, u, t), "param16", home="cpu", persistent=True)
    if pipe.tied and pipe.S > 1:
        for r in pipe.replicas():
            b.stream(f"tie{r}", pipe.gpu(r, 0), "comm")


def notes(job: Job, knobs: Knobs, pipe: Pipeline) -> list[str]:
    modes = [st.mode for st in pipe.stages]
    out = [f"{pipe.S} pipeline stage(s) x {pipe.dp} data-parallel replica(s), {knobs.schedule}, {pipe.M} "
           f"micro-batch(es) per step; stage modes {', '.join(f'{m}={modes.count(m)}' for m in MODES if m in modes)}; "
           f"{swapped_layers(pipe)} of {len(job.trace.layers)} layers swapped from DRAM", *pipe.notes]
    all_gpu = all(m == "gpu" for m in modes)
    if not knobs.stages and job.n_gpus > pipe.S:
        out.append(f"stages=auto: {pipe.S} stage(s) x {pipe.dp} data-parallel replica(s): "
                   + ("every stage fits on its GPU with fewer stages than GPUs" if all_gpu else
                      f"the model has {len(job.trace.layers)} layers for {job.n_gpus} GPUs"))
    if unified(job):
        out.append("unified memory: GPU and CPU share one pool, so moving anything to the CPU frees nothing; "
                   "everything stays GPU-side (no swapping, GPU Adam) and no CPU savings are reported")
    elif all_gpu:
        out.append("every stage fits the GPU with its optimizer states: nothing is offloaded")
    return out


def swapped_layers(pipe: Pipeline) -> int:
    return sum(st.last - st.first + 1 for st in pipe.stages if st.mode == "swap")


def info(pipe: Pipeline, knobs: Knobs, dram: dict[str, float]) -> dict[str, Any]:
    sol = pipe.solution
    if pipe.unified:
        saved = 0.0
    else:
        saved = dram["naive16"] if not pipe.active_cpu_mm else pipe.dp * sum(pipe.stage_bytes(st) for st in sol.stages)
    partition = [{
        "stage": st.index, "gpus": [pipe.gpu(r, st.index) for r in range(pipe.dp)], "layers": [st.first, st.last],
        "names": f"{pipe.layers[st.first].name}..{pipe.layers[st.last].name}", "mode": st.mode,
        "packs": [[u, t] for u, t in st.packs] if st.mode == "swap" else [],
        "est_time_s": st.time_s, "est_gpu_bytes": st.mem_bytes,
    } for st in sol.stages]
    return {
        "stages": pipe.S, "dp": pipe.dp, "accumulation": pipe.M, "schedule": knobs.schedule,
        "partition": partition, "t_star_s": sol.t_star, "time_bound_s": sol.bound,
        "bottleneck_s": sol.bottleneck_s, "est_peak_gpu_bytes": sol.peak_bytes,
        "tolerance_dropped": pipe.tolerance_dropped, "cpu_bytes_saved": saved, "cpu_bytes": dram,
        "swapped_layers": swapped_layers(pipe), "search_evaluations": sol.evaluations,
    }
