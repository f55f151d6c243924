"""The analytic screen (planner.screen) is a lower bound of the plan's time bound, and the screened search
(plans built lazily in screen order) picks the same best as the exhaustive one.

screen <= plan bound is checked on every candidate of small spaces (every policy and grid knob,
micro-batches, checkpointing, one and eight GPUs, a unified machine, a falling efficiency curve);
plan bound <= simulated is tests/test_planner_bounds.py's, and a few simulations here close the chain.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware_models import Curve, HardwareSpec, build_topology
from planner.bounds import memory_lower_bound, plan_bounds, resource_work
from planner.candidates import enumerate_candidates
from planner.job import JobRequest, make_job, make_plan, resolve_hardware
from planner.memory_screens import least_peak
from planner.screen import MEMORY_SLACK, SCREEN_SLACK, Screener, compute_screen, memory_screen, monotone_curve
from planner.screen_terms import TERMS, Links, least_bottleneck
from planner.search import SCREENED_OUT, plan_summary, search
from policies import POLICIES, Job, KnobError, PlanInfeasible, kit
from policies.tinypipe.packing import MODES, LayerCost, Model, Problem, solve
from simulator import Plan, simulate_plan
from workloads import load_model

SWEEP = [
    # hardware, overrides, model, request (micro-batch and checkpointing are swept)
    ("a100", (), "gpt2", JobRequest(seq_len=256, global_batch=4)),
    ("a100x8", (), "gpt2", JobRequest(seq_len=256, global_batch=8)),
    ("dgx-spark", (), "gpt2", JobRequest(seq_len=256, global_batch=4)),
]


def _falling_curve(hw: HardwareSpec) -> HardwareSpec:
    """The same machine with an efficiency curve that falls for big kernels (splitting one is cheaper)."""
    curve = Curve(((1e6, 0.3), (1e9, 0.8), (1e12, 0.4)))
    return dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, gemm_efficiency=curve))


def _candidate_plans(hw: HardwareSpec, model: str, base: JobRequest):  # noqa: ANN202
    m = load_model(model)
    job0, _ = make_job(hw, m, dataclasses.replace(base, micro_batch=1, checkpointing="none"))
    for c in enumerate_candidates(list(POLICIES), hw.gpu.count, job0.global_batch):
        req = dataclasses.replace(base, micro_batch=c.micro_batch, checkpointing=c.checkpointing)
        job, _ = make_job(hw, m, req)
        try:
            plan = make_plan(job, c.policy, c.knob_dict)
        except (PlanInfeasible, KnobError):
            continue
        yield c, job, plan


@pytest.mark.parametrize(("hw", "sets", "model", "request_"), SWEEP, ids=[c[0] for c in SWEEP])
def test_screen_never_exceeds_the_plan_bound(hw: str, sets: tuple[str, ...], model: str,
                                             request_: JobRequest) -> None:
    spec = resolve_hardware(hw, sets)
    topo = build_topology(spec)
    screener = Screener()
    n = 0
    for c, job, plan in _candidate_plans(spec, model, request_):
        screen = screener.time(job, c.policy, c.knob_dict).time_s
        bound = plan_bounds(plan, job.hw, topo).time_s
        assert 0 < screen <= bound, (c.label(), screen, bound)
        n += 1
    assert n >= 20


def test_screen_is_tight_for_a_compute_bound_plan() -> None:
    """One GPU, everything resident: the plan's bound is its SM work, which the screen is, less the launch
    overheads and HBM floors it leaves out (a sizeable share for a model as small as gpt2)."""
    job, _ = make_job("a100", "gpt2", JobRequest(seq_len=256, micro_batch=4, global_batch=8, checkpointing="full"))
    plan = make_plan(job, "none", {})
    bound = plan_bounds(plan, job.hw)
    screen = Screener().time(job, "none").time_s
    assert bound.time_resource == "gpu0.sm"
    assert 0.75 * bound.time_s <= screen <= bound.time_s
    r = simulate_plan(plan, job.hw)
    assert screen <= bound.time_s <= r.step_time_s


def test_recomputation_is_charged_only_to_policies_that_honour_checkpointing() -> None:
    job, _ = make_job("a100", "gpt2", JobRequest(seq_len=256, micro_batch=2, global_batch=4, checkpointing="full"))
    sc = Screener()
    assert sc.time(job, "none").time_s > sc.time(job, "lazytrain").time_s  # LazyTrain decides per layer
    assert compute_screen(job, True) > compute_screen(job, False)


def test_a_falling_efficiency_curve_falls_back_to_the_top_efficiency() -> None:
    spec = _falling_curve(resolve_hardware("a100x8", ()))
    assert not monotone_curve(spec) and monotone_curve(resolve_hardware("a100x8", ()))
    topo = build_topology(spec)
    n = 0
    for c, job, plan in _candidate_plans(spec, "gpt2", JobRequest(seq_len=128, global_batch=8)):
        screen = Screener().time(job, c.policy, c.knob_dict).time_s
        assert 0 < screen <= plan_bounds(plan, job.hw, topo).time_s, c.label()
        n += 1
    assert n >= 10


def test_screen_slack_is_tiny() -> None:
    assert 0 < SCREEN_SLACK <= 1e-5


EXACT = [
    ("a100", "gpt2", JobRequest(seq_len=256, global_batch=2), tuple(POLICIES)),
    ("a100x8", "gpt2", JobRequest(seq_len=256, global_batch=8, checkpointing="full"), ("none", "zero-offload")),
]


@pytest.mark.parametrize(("hw", "model", "request_", "policies"), EXACT, ids=[f"{c[0]}-{len(c[3])}p" for c in EXACT])
def test_screened_search_picks_the_exhaustive_best(hw: str, model: str, request_: JobRequest,
                                                    policies: tuple[str, ...]) -> None:
    screened = search(hw, model, request=request_, policies=policies)
    exhaustive = search(hw, model, request=request_, policies=policies, prune=False)
    assert screened.best is not None and exhaustive.best is not None
    assert screened.best.index == exhaustive.best.index
    assert screened.best.step_time_s == exhaustive.best.step_time_s
    assert screened.n_simulated <= exhaustive.n_simulated
    assert screened.cut_short is None
    # what the screen left unbuilt could not have won: its screen is above the best step
    screener = Screener()
    spec = resolve_hardware(hw, ())
    best_s = screened.best.step_time_s
    assert best_s is not None
    for e in screened.evaluated:
        if e.reason == SCREENED_OUT:
            job, _ = make_job(spec, model, e.request)
            assert screener.time(job, e.policy, e.knobs).time_s >= best_s


def test_screened_search_builds_fewer_plans_than_it_has_candidates() -> None:
    out = search("a100", "gpt2", request=JobRequest(seq_len=256, global_batch=8))
    assert out.rejected.get(SCREENED_OUT, 0) > out.n_candidates // 3, out.rejected
    assert out.best is not None


def test_a_capped_screened_search_says_it_was_cut() -> None:
    kw = {"request": JobRequest(seq_len=512, global_batch=8)}
    assert search("a100", "gpt2", **kw).n_simulated >= 2  # type: ignore[arg-type]
    out = search("a100", "gpt2", max_candidates=1, **kw)  # type: ignore[arg-type]
    assert out.n_simulated == 1 and out.best is not None
    assert out.cut_short is not None and "maximum of 1" in out.cut_short
    assert out.rejected.get("skipped: max candidates", 0) >= 1


MEMORY = [
    ("a100x8", (), JobRequest(seq_len=256, global_batch=16)),
    ("a100", ("gpu.memory=1.3GB",), JobRequest(seq_len=512, global_batch=4)),
    ("dgx-spark", (), JobRequest(seq_len=256, global_batch=4)),
]


@pytest.mark.parametrize(("hw", "sets", "request_"), MEMORY, ids=[c[0] for c in MEMORY])
def test_memory_screen_never_exceeds_the_plan_memory_bound(hw: str, sets: tuple[str, ...],
                                                           request_: JobRequest) -> None:
    """ZeRO-Offload over tp, micro-batch and checkpointing: the screen <= the plan's GPU memory bound, and a
    candidate the screen rejects is one whose plan the policy or the memory bound rejects too."""
    spec = resolve_hardware(hw, sets)
    topo = build_topology(spec)
    pool = topo.pool_of["gpu0"]
    cap = topo.pools[pool].capacity_bytes
    m = load_model("gpt2")
    n = rejected = 0
    for tp in (1, 2, 4, 8):
        if spec.gpu.count % tp:
            continue
        for mb in (1, 2):
            for ck in ("none", "selective", "full"):
                job, _ = make_job(spec, m, dataclasses.replace(request_, micro_batch=mb, checkpointing=ck))
                got = memory_screen(job, "zero-offload", {"tp": tp})
                try:
                    plan = make_plan(job, "zero-offload", {"tp": tp})
                except KnobError:
                    assert got is None  # a tp the model's heads refuse: the plan says why, not the screen
                    continue
                except PlanInfeasible:
                    continue  # the policy's own verdict (the fp16 parameters alone)
                assert got is not None
                bound = max(v for p, v in memory_lower_bound(plan, topo).items() if topo.pools[p].kind in
                            ("hbm", "unified") or p == pool)
                assert got[0] <= bound * (1 + 1e-12), (tp, mb, ck, got[0], bound)
                n += 1
                if got[0] > cap:
                    rejected += 1
                    assert plan_summary(job, next(enumerate_candidates(["zero-offload"], spec.gpu.count,
                                                                       job.global_batch, micro_batch=mb,
                                                                       checkpointing=ck, knobs=[f"tp={tp}"])),
                                        topo)[0].reason == "bound: gpu memory"
    assert n >= 6
    assert rejected >= 1 or cap > 10e9  # the tight GPU rejects some on the screen alone
    assert memory_screen(job, "lazytrain", {}) is None  # its MILP decides residency: no screen
    assert memory_screen(job, "zero-offload", {"tp": 3}) is None  # the policy refuses it: its plan says why
    assert memory_screen(job, "tinypipe", {"stages": 3}) is None


def _own_figure(policy: str, job: Job, plan: Plan) -> float:
    """The plan's own record of what its GPU holds (the figure its policy checked against the capacity)."""
    if policy == "tinypipe":
        return float(plan.info["est_peak_gpu_bytes"])
    if policy == "none":
        return kit.gpu_held_bytes(job, plan.info["model_state_bytes_per_gpu"].values())
    return 0.0


SCREENED = ("zero-offload", "none", "tinypipe")
MEMORY_SWEEP = [
    ("a100", ("gpu.memory=1.3GB",), "gpt2", JobRequest(seq_len=512, global_batch=4)),
    ("a100x8", ("gpu.memory=1.1GB",), "gpt2", JobRequest(seq_len=512, global_batch=16)),
    ("dgx-spark", ("host.dram=23.3GB",), "gpt2", JobRequest(seq_len=512, global_batch=4)),
]


@pytest.mark.parametrize(("hw", "sets", "model", "request_"), MEMORY_SWEEP,
                         ids=[f"{c[0]}-{c[2]}-{len(c[1])}" for c in MEMORY_SWEEP])
def test_every_memory_screen_is_sound(hw: str, sets: tuple[str, ...], model: str, request_: JobRequest) -> None:
    """Every policy with a memory screen, over its search grid, micro-batches and checkpointing: the screen never
    exceeds what the plan holds (its memory bound, or the policy's own figure of it), and a candidate it rejects
    is one whose plan the policy rejects for the GPU, or the memory bound does."""
    spec = resolve_hardware(hw, sets)
    topo = build_topology(spec)
    pool = topo.pool_of["gpu0"]
    threshold = topo.pools[pool].capacity_bytes * (1 + MEMORY_SLACK)
    m = load_model(model)
    job0, _ = make_job(spec, m, dataclasses.replace(request_, micro_batch=1, checkpointing="none"))
    seen: dict[str, list[int]] = {p: [0, 0] for p in SCREENED}
    for c in enumerate_candidates(list(SCREENED), spec.gpu.count, job0.global_batch):
        if c.micro_batch > 2 or c.checkpointing == "selective":
            continue
        job, _ = make_job(spec, m, dataclasses.replace(request_, micro_batch=c.micro_batch,
                                                       checkpointing=c.checkpointing))
        got = memory_screen(job, c.policy, c.knob_dict)
        summary, plan = plan_summary(job, c, topo)
        if summary.reason == "knobs: invalid":
            continue
        assert got is not None or c.knob_dict.get("stages") == 0, c.label()  # auto stages may need a solve
        if got is None:
            continue
        seen[c.policy][0] += 1
        if plan is not None:
            bound = max(summary.bound_memory_bytes[p] for p in summary.bound_memory_bytes
                        if topo.pools[p].kind in ("hbm", "unified") or p == pool)
            assert got[0] <= max(bound, _own_figure(c.policy, job, plan)) * (1 + 1e-12), (c.label(), got, bound)
        if got[0] > threshold:
            seen[c.policy][1] += 1
            assert summary.reason in ("policy: gpu memory", "policy: unified memory", "bound: gpu memory",
                                      "bound: unified memory"), (c.label(), summary.reason, got)
    assert all(n >= 4 for n, _ in seen.values()), seen
    if sets and "host.dram" not in sets[0]:
        assert all(r >= 1 for _, r in seen.values()), seen  # the tight GPU: every screen rejects some


def test_screened_search_with_memory_screens_picks_the_exhaustive_best() -> None:
    kw = {"request": JobRequest(seq_len=512, global_batch=4), "hw_overrides": ("gpu.memory=1.3GB",),
          "policies": ("none", "tinypipe", "zero-offload")}
    screened = search("a100", "gpt2", **kw)  # type: ignore[arg-type]
    exhaustive = search("a100", "gpt2", prune=False, **kw)  # type: ignore[arg-type]
    assert screened.rejected.get("screen: gpu memory", 0) > 0, screened.rejected
    assert screened.best is not None and exhaustive.best is not None
    assert (screened.best.index, screened.best.step_time_s) == (exhaustive.best.index, exhaustive.best.step_time_s)



def test_screened_search_does_not_depend_on_workers_or_a_far_deadline() -> None:
    """Worker processes build the next plans speculatively; the outcome is the sequential one."""
    kw = {"request": JobRequest(seq_len=512, global_batch=8), "policies": ("none", "zero-offload", "lazytrain")}
    one = search("a100", "gpt2", **kw)  # type: ignore[arg-type]
    two = search("a100", "gpt2", workers=2, **kw)  # type: ignore[arg-type]
    far = search("a100", "gpt2", budget_s=600.0, **kw)  # type: ignore[arg-type]
    assert one.n_simulated >= 2 and one.rejected.get(SCREENED_OUT, 0) > 0
    assert two.to_dict() == one.to_dict() == far.to_dict()


@st.composite
def _packing_problems(draw):  # noqa: ANN001, ANN202
    n = draw(st.integers(1, 8))
    S = draw(st.integers(1, min(3, n)))
    layers = tuple(LayerCost(compute_s=draw(st.integers(1, 20)), swap_s=draw(st.integers(0, 30)),
                             param_bytes=draw(st.integers(1, 12)), state_bytes=draw(st.integers(0, 60)),
                             act_bytes=draw(st.integers(0, 4)), transient_bytes=draw(st.integers(0, 6)))
                   for _ in range(n))
    shared = draw(st.integers(0, int(min(layers[0].param_bytes, layers[-1].param_bytes)))) if n > 1 else 0
    inflight = tuple(draw(st.sampled_from([S - s, 4])) for s in range(S))
    return Problem(layers, S, inflight, capacity=draw(st.integers(10, 200)), prefetch=draw(st.integers(0, 2)),
                   tolerance=draw(st.sampled_from([0.0, 0.05])),
                   modes=draw(st.sampled_from([MODES, ("gpu",), ("resident", "swap"), ("swap",)])),
                   shared_param_bytes=shared, stash=draw(st.booleans()),
                   max_pack_layers=draw(st.sampled_from([1, 2, 16])))


@settings(max_examples=80, deadline=None)
@given(_packing_problems(), st.sampled_from([1.0, 1.3, 2.0]))
def test_tinypipe_memory_screen_is_the_packing_search_verdict(prob: Problem, above: float) -> None:
    """At or above the capacity, the one-sweep screen says "over" exactly when the packing search with its tolerance
    dropped (the policy's retry before PlanInfeasible) finds no partition within the limit; below, its figure is at
    most that search's peak."""
    limit = prob.capacity * above * (1 + MEMORY_SLACK)
    figure, over = least_peak(Model(prob), limit)
    peak = solve(dataclasses.replace(prob, tolerance=math.inf)).peak_bytes
    assert over == (peak > limit), (figure, peak, limit)
    assert figure <= peak


TERM_SWEEP = [
    ("a100x8", (), "gpt2", JobRequest(seq_len=256, global_batch=16)),
    ("a100", (), "gpt2", JobRequest(seq_len=256, global_batch=4)),
    ("dgx-spark", (), "gpt2", JobRequest(seq_len=256, global_batch=4)),
    # memory tight enough that tinypipe's stages swap and its partitions are bounded by memory
    ("a100x8", ("gpu.memory=1.1GB",), "gpt2", JobRequest(seq_len=512, global_batch=16)),
    ("a100", ("gpu.memory=1.3GB",), "gpt2", JobRequest(seq_len=512, global_batch=4)),
]
ZERO_OFFLOAD_KNOBS = [
    {}, {"tp": 1}, {"tp": 2}, {"tp": 8}, {"delayed_update": True},
    {"upload_bytes_per_param": 4.0, "grad_offload_bytes_per_param": 4.0, "tp": 2},
    {"grad_offload_bytes_per_param": 4.0, "cpu_grad_bytes": 2.0},
]


@pytest.mark.parametrize(("hw", "sets", "model", "request_"), TERM_SWEEP,
                         ids=[c[0] + "-tight" * bool(c[1]) for c in TERM_SWEEP])
def test_every_policy_term_is_below_its_resource_work(hw: str, sets: tuple[str, ...], model: str,
                                                      request_: JobRequest) -> None:
    """Each term of planner.screen_terms is at most the work of the resource it names in the plan (so at most
    the plan bound), over knobs, micro-batches and checkpointing; and the screen with the terms stays <= bound."""
    spec = resolve_hardware(hw, sets)
    topo = build_topology(spec)
    links = Links(topo)
    n = 0
    for policy, grid in TERM_GRIDS.items():
        for knobs in grid:
            for mb in (1, 2):
                for ckpt in ("none", "full"):
                    job, _ = make_job(spec, model, dataclasses.replace(request_, micro_batch=mb, checkpointing=ckpt))
                    try:
                        plan = make_plan(job, policy, knobs)
                    except (PlanInfeasible, KnobError):
                        continue
                    work = resource_work(plan, job.hw, topo)
                    bound = plan_bounds(plan, job.hw, topo).time_s
                    for t, r in TERMS[policy](job, knobs, links):
                        # an SM term bounds the busiest GPU's SMs (which one the plan decides)
                        got = max(w for k, w in work.items() if k.endswith(".sm")) if r.startswith("gpu.sm") \
                            else work.get(r, 0.0)
                        assert t <= got * (1 + 1e-9), (policy, knobs, mb, ckpt, r, t, got)
                    screen = Screener().time(job, policy, knobs)
                    assert screen.time_s <= bound, (policy, knobs, mb, ckpt)
                    n += 1
    assert n >= 10


TERM_GRIDS = {
    "zero-offload": ZERO_OFFLOAD_KNOBS,
    "zero-infinity": [{"param_device": pd, "optimizer_device": od, "offload_checkpoints": oc}
                      for pd in ("cpu", "nvme") for od in ("cpu", "nvme") for oc in (False, True)]
    + [{"offload_checkpoints": True, "tile_factor": 4}, {"param_device": "nvme", "tile_factor": 2, "cpu_prefetch": 0},
       {"offload_checkpoints": True, "cpu_grad_buffer": "always", "grad_bytes_per_param": 4.0}],
    "tinypipe": [{"stages": st} for st in (0, 1, 2, 4, 8)] + [{"stages": 2, "schedule": "gpipe"},
                                                              {"stages": 4, "prefetch_packs": 0}],
}


def test_zero_offload_link_term_is_tight_on_70b() -> None:
    """70b on a100x8 at tp=8: the plan's bound is the switch uplinks' gradient traffic, which the term is."""
    job, _ = make_job("a100x8", "70b", JobRequest(micro_batch=1, checkpointing="none"))
    knobs = {"tp": 8}
    screen = Screener().time(job, "zero-offload", knobs)
    bound = plan_bounds(make_plan(job, "zero-offload", knobs), job.hw)
    assert screen.resource == bound.time_resource.replace("sw0", screen.resource.split(".")[0]) or \
        screen.resource.endswith(bound.time_resource.split(".", 1)[1])
    assert 0.999 * bound.time_s <= screen.time_s <= bound.time_s


@pytest.mark.parametrize("param_device", ["cpu", "nvme"])
def test_zero_infinity_link_term_on_70b(param_device: str) -> None:
    """70b on a100x8 with offloaded checkpoints: the plan is bound by the switch uplinks' duplex budget; the term
    (checkpoints down and up, parameter fetches) is below that and well above the compute screen."""
    job, _ = make_job("a100x8", "70b", JobRequest(micro_batch=1, checkpointing="none"))
    knobs = {"param_device": param_device, "optimizer_device": "nvme", "offload_checkpoints": True}
    topo = build_topology(job.hw)
    plan = make_plan(job, "zero-infinity", knobs)
    work = resource_work(plan, job.hw, topo)
    for t, r in TERMS["zero-infinity"](job, knobs, Links(topo)):
        assert t <= work[r] * (1 + 1e-9), (r, t, work[r])
    screen = Screener().time(job, "zero-infinity", knobs).time_s
    assert compute_screen(job, False) * 1.3 < screen <= plan_bounds(plan, job.hw, topo).time_s


@pytest.mark.parametrize("stages", [0, 2, 8])
def test_tinypipe_pipeline_term_on_70b(stages: int) -> None:
    """70b on a100x8: the stages must be cut where the GPU's memory allows, so the busiest stage does more than
    the average GPU (the compute screen); the term stays below the plan's busiest GPU and its bound."""
    job, _ = make_job("a100x8", "70b", JobRequest(micro_batch=1, checkpointing="none"))
    knobs = {"stages": stages}
    topo = build_topology(job.hw)
    plan = make_plan(job, "tinypipe", knobs)
    work = resource_work(plan, job.hw, topo)
    [(t, r)] = TERMS["tinypipe"](job, knobs, Links(topo))
    assert r.startswith("gpu.sm")
    assert compute_screen(job, False) * 1.15 < t <= max(w for k, w in work.items() if k.endswith(".sm"))
    assert t <= plan_bounds(plan, job.hw, topo).time_s


def test_least_bottleneck_is_the_min_max_partition() -> None:
    floors = [1.0, 5.0, 2.0, 2.0, 3.0, 1.0]
    assert least_bottleneck(floors, 1, lambda i, j, s: True) == 14.0
    assert least_bottleneck(floors, 2, lambda i, j, s: True) == 8.0  # [1, 5, 2] [2, 3, 1]
    assert least_bottleneck(floors, 3, lambda i, j, s: True) == 6.0  # [1, 5] [2, 2] [3, 1]
    assert least_bottleneck(floors, 3, lambda i, j, s: j - i < 2) == 6.0  # at most two layers a stage
    assert least_bottleneck(floors, 2, lambda i, j, s: j - i < 3) == 8.0  # at most three: [1, 5, 2] [2, 3, 1]
    assert least_bottleneck(floors, 2, lambda i, j, s: j - i < 2) is None
