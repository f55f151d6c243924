"""planner.search and `tiersim plan`: exhaustive agreement, pruning, feasibility, cache, determinism, CLI."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

import planner.search as search_mod
from planner.cache import EvalCache
from planner.candidates import check_grids, enumerate_candidates
from planner.job import JobRequest
from planner.pareto import dominates, pareto_front
from planner.search import GPU_KINDS, SCREENED_OUT, search
from policies import get_policy
from simulator import Plan
from tiersim.cli import main, simulate_main

# a space small enough to simulate whole: gpt2 on one A100 squeezed to 4 GB, two policies (96 candidates)
# usable GPU memory ~2.27 GB (physical minus the A100's CUDA context and cuBLAS workspaces, ~0.46 GB)
SMALL = {"hw": "a100", "model": "gpt2", "request": JobRequest(seq_len=512), "hw_overrides": ("gpu.memory=2.73GB",),
         "policies": ("none", "zero-offload")}
# zero-infinity at micro-batch 4 with full checkpointing would be the fastest (0.96 s a step) but runs out of GPU
# memory in the simulation itself; lazytrain at micro-batch 2 is the best that fits (1.46 s). (zero-offload's GPU
# peak no longer depends on timing, kit.release_buckets: its policy check and bound are exact, so the earlier
# scenario, zero-offload at micro-batch 2 on gpt2 with 1.08 GB, is rejected before it is simulated.)
OOM_IN_SIM = {"hw": "a100", "model": "gpt2-xl", "request": JobRequest(seq_len=512),
              "hw_overrides": ("gpu.memory=1.5GB",), "policies": ("zero-infinity", "lazytrain")}


@pytest.fixture(scope="module")
def exhaustive() -> search_mod.SearchOutcome:
    return search(**SMALL, prune=False)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def pruned() -> search_mod.SearchOutcome:
    return search(**SMALL)  # type: ignore[arg-type]


def test_every_grid_knob_is_a_declared_knob() -> None:
    assert check_grids(1) == [] and check_grids(8) == []


def test_enumeration_is_deterministic_and_honours_fixed_flags() -> None:
    a = list(enumerate_candidates(["none", "lazytrain"], 8, 64))
    assert a == list(enumerate_candidates(["none", "lazytrain"], 8, 64))
    assert [c.index for c in a] == list(range(len(a)))
    assert {c.micro_batch for c in a} == {1, 2, 4, 8}
    assert {c.checkpointing for c in a if c.policy == "lazytrain"} == {get_policy("lazytrain").fixed_checkpointing}
    fixed = list(enumerate_candidates(["none"], 8, 64, micro_batch=2, checkpointing="selective"))
    assert {(c.micro_batch, c.checkpointing) for c in fixed} == {(2, "selective")}
    assert len({(c.policy, c.knobs, c.micro_batch, c.checkpointing) for c in a}) == len(a)


def test_best_equals_exhaustive_search(exhaustive: search_mod.SearchOutcome,
                                       pruned: search_mod.SearchOutcome) -> None:
    assert exhaustive.best is not None and pruned.best is not None
    assert pruned.best.index == exhaustive.best.index
    assert pruned.best.step_time_s == exhaustive.best.step_time_s
    # the exhaustive ranking's leader is what the pruned search ranks first; nothing ranked differs
    by_index = {e.index: e for e in exhaustive.evaluated}
    for e in pruned.ranked:
        assert e.step_time_s == by_index[e.index].step_time_s


def test_pruning_rejects_most_candidates_without_simulating_and_never_the_winner(
        exhaustive: search_mod.SearchOutcome, pruned: search_mod.SearchOutcome) -> None:
    assert pruned.n_candidates == exhaustive.n_candidates >= 90
    assert pruned.n_pruned / pruned.n_candidates >= 0.8
    # the time bound or the time screen (a lower bound of it, planner.screen) pruned some
    assert pruned.rejected.get("bound: slower than best", 0) + pruned.rejected.get(SCREENED_OUT, 0) > 0
    assert pruned.n_simulated + pruned.n_pruned == pruned.n_candidates
    winner = pruned.evaluated[exhaustive.best.index]  # type: ignore[union-attr]
    assert winner.simulated and winner.reason is None
    # every candidate the bound pruned as slower is, simulated, no better than the winner
    for e in pruned.evaluated:
        if e.reason in ("bound: slower than best", SCREENED_OUT):
            ex = exhaustive.evaluated[e.index]
            assert not ex.feasible or ex.step_time_s >= pruned.best.step_time_s  # type: ignore[union-attr,operator]


def test_an_auto_knob_and_its_explicit_twin_are_simulated_once(pruned: search_mod.SearchOutcome) -> None:
    # zero-offload's tp=auto resolves to 1 on one GPU: tp=1 builds the very same plan
    assert pruned.rejected.get("duplicate plan", 0) > 0
    twins = [e for e in pruned.evaluated if e.policy == "zero-offload" and e.knobs["tp"] == 1]
    assert twins and all(e.reason == "duplicate plan" or e.reason.startswith(("bound:", "policy:", "screen:"))
                         for e in twins)
    keys = [(e.policy, e.micro_batch, e.checkpointing, e.step_time_s, e.knobs.get("delayed_update"))
            for e in pruned.ranked]
    assert len(keys) == len(set(keys))


def test_best_is_never_infeasible() -> None:
    exhaustive = search(**OOM_IN_SIM, prune=False)  # type: ignore[arg-type]
    pruned = search(**OOM_IN_SIM)  # type: ignore[arg-type]
    ooms = [e for e in exhaustive.evaluated if e.reason and e.reason.startswith("oom:")]
    assert exhaustive.best is not None
    assert ooms and min(e.step_time_s for e in ooms) < exhaustive.best.step_time_s  # type: ignore[operator]
    assert pruned.best is not None and pruned.best.index == exhaustive.best.index
    for out in (exhaustive, pruned):
        assert out.best is not None and out.best.feasible and out.best.reason is None
        assert all(e.feasible and e.simulated for e in out.ranked)
        for pool, peak in out.best.peak_bytes.items():
            assert peak <= out.best.capacity_bytes[pool] * (1 + 1e-9)


def test_memory_objective_finds_the_smallest_gpu_peak(exhaustive: search_mod.SearchOutcome) -> None:
    out = search(**SMALL, objective="gpu_memory")  # type: ignore[arg-type]
    kinds = exhaustive.pool_kinds
    lowest = min(e.peak_of(GPU_KINDS, kinds) for e in exhaustive.ranked)
    assert out.best is not None and out.best.peak_of(GPU_KINDS, kinds) == lowest
    assert out.n_pruned / out.n_candidates >= 0.5


def test_tflops_objective_finds_the_highest_rate(exhaustive: search_mod.SearchOutcome) -> None:
    out = search(**SMALL, objective="tflops")  # type: ignore[arg-type]
    assert out.best is not None
    assert out.best.tflops_per_gpu == max(e.tflops_per_gpu for e in exhaustive.ranked)  # type: ignore[type-var]
    assert out.n_pruned / out.n_candidates >= 0.8


def test_no_feasible_candidate_gives_no_best() -> None:
    out = search("a100", "opt-1.3b", request=JobRequest(seq_len=512), hw_overrides=("gpu.memory=2GB",
                                                                                       "host.dram=24GB"),
                 policies=["none", "zero-offload"])
    assert out.best is None and out.ranked == [] and out.pareto == []
    assert sum(out.rejected.values()) == out.n_candidates


def test_results_do_not_depend_on_the_worker_count(pruned: search_mod.SearchOutcome) -> None:
    two = search(**SMALL, workers=2)  # type: ignore[arg-type]
    assert two.to_dict() == pruned.to_dict()


_REAL_SIM_TASK = search_mod._sim_task
_NEEDED = "TIERSIM_TEST_NEEDED_SIMULATIONS"


def _sim_slow_unless_needed(job, cand):  # noqa: ANN001, ANN202 - runs in a worker process
    """A simulation that the sequential rule does not need takes 5 minutes (a speculative one to stop)."""
    if str(cand.index) not in os.environ[_NEEDED].split(","):
        time.sleep(300)
    return _REAL_SIM_TASK(job, cand)


def test_speculative_simulations_are_stopped_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # cpu_memory: the first survivor is the answer, the second runs beside it speculatively and is pruned
    kw = {**SMALL, "objective": "cpu_memory", "hw_overrides": ()}
    serial = search(**kw)  # type: ignore[arg-type]
    needed = [e.index for e in serial.evaluated if e.simulated]
    monkeypatch.setenv(_NEEDED, ",".join(map(str, needed)))
    monkeypatch.setattr(search_mod, "_sim_task", _sim_slow_unless_needed)
    t0 = time.perf_counter()
    two = search(**kw, workers=2)  # type: ignore[arg-type]
    assert time.perf_counter() - t0 < 120  # not the 300 s of the speculative simulation
    assert two.n_extra_simulated >= 1 and two.to_dict() == serial.to_dict()
    assert multiprocessing.active_children() == []  # its worker process was ended


def test_cache_makes_a_repeat_free_of_simulations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kw = {**SMALL, "policies": ("zero-offload",)}
    cold = search(**kw, cache=EvalCache(tmp_path))  # type: ignore[arg-type]
    calls = {"plan": 0, "sim": 0}
    real_plan, real_sim = search_mod.make_plan, search_mod.simulate_plan

    def plan(*a, **k):  # noqa: ANN002, ANN003, ANN202
        calls["plan"] += 1
        return real_plan(*a, **k)

    def sim(*a, **k):  # noqa: ANN002, ANN003, ANN202
        calls["sim"] += 1
        return real_sim(*a, **k)

    monkeypatch.setattr(search_mod, "make_plan", plan)
    monkeypatch.setattr(search_mod, "simulate_plan", sim)
    warm_cache = EvalCache(tmp_path)
    warm = search(**kw, cache=warm_cache)  # type: ignore[arg-type]
    assert warm.to_dict() == cold.to_dict()
    assert calls == {"plan": 0, "sim": 0}
    # candidates the screen left unbuilt have no entry (their verdict depends on the best, not on them alone)
    unbuilt = cold.rejected.get(search_mod.SCREENED_OUT, 0)
    assert warm_cache.misses == unbuilt and warm_cache.hits == cold.n_candidates - unbuilt


def test_a_capped_search_says_it_was_cut_short(pruned: search_mod.SearchOutcome) -> None:
    out = search(**SMALL, max_candidates=1)  # type: ignore[arg-type]
    assert out.cut_short and "1 candidates" in out.cut_short
    assert out.n_simulated == 1 and out.rejected.get("skipped: max candidates", 0) >= 1


def test_first_feasible_stops_at_a_feasible_candidate() -> None:
    out = search(**SMALL, first_feasible=True)  # type: ignore[arg-type]
    assert out.best is not None and out.best.feasible and out.cut_short is None
    assert out.n_simulated <= 3
    assert out.rejected.get("skipped: first feasible found", 0) > 0


def test_first_feasible_capped_before_a_feasible_one_says_it_was_cut_short() -> None:
    oom_first = {**OOM_IN_SIM, "request": JobRequest(seq_len=512, micro_batch=4, checkpointing="full"),
                 "policies": ("zero-infinity",)}
    out = search(**oom_first, first_feasible=True, max_candidates=1)  # type: ignore[arg-type]
    # the first simulation runs out of memory; the rest are skipped, and the outcome says so
    assert out.n_simulated == 1 and out.best is None and out.rejected.get("oom: gpu0") == 1
    assert out.cut_short and out.rejected.get("skipped: max candidates", 0) > 0


def test_pareto_front_keeps_only_undominated_points() -> None:
    pts = [(1.0, 5.0), (2.0, 2.0), (3.0, 3.0), (2.0, 2.0), (0.5, 9.0)]
    front = pareto_front(pts, lambda p: p)
    assert front == [(1.0, 5.0), (2.0, 2.0), (0.5, 9.0)]
    assert dominates((2.0, 2.0), (3.0, 3.0)) and not dominates((2.0, 2.0), (2.0, 2.0))


# -- the command line ------------------------------------------------------------------------------------
ARGS = ["plan", "--hw", "a100", "--model", "gpt2", "--seq-len", "512", "--set", "gpu.memory=4GB",
        "--policies", "zero-offload", "--micro-batch", "2"]


def test_cli_output_is_reproducible_byte_for_byte_cold_and_warm(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    outs = []
    for extra in (["--no-cache"], ["--cache-dir", str(tmp_path)], ["--cache-dir", str(tmp_path)]):
        assert main([*ARGS, *extra]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2]
    text = outs[0]
    assert "Ranked" in text and "Rejected" in text and "Pareto front" in text and "Best: zero-offload" in text
    assert "fixed by flags: micro-batch 2" in text


def test_cli_json_and_plan_out_loadable_by_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "best.json"
    assert main([*ARGS, "--no-cache", "--json", "--plan-out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "tiersim.plan_search" and d["best"]["feasible"] is True
    assert d["n_candidates"] == sum(d["rejected"].values()) + len(d["ranked"])
    plan = Plan.load(out)
    assert plan.policy == d["best"]["policy"] and plan.workload.config.micro_batch == 2
    assert simulate_main(["--plan", str(out), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["step_time_s"] == pytest.approx(d["best"]["step_time_s"], rel=1e-9)


def test_cli_infeasible_job_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--hw", "a100", "--model", "opt-1.3b", "--seq-len", "512", "--set", "gpu.memory=2GB",
                 "--set", "host.dram=24GB", "--policies", "none", "--no-cache"])
    assert code == 3
    assert "No feasible candidate" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "needle"), [
    (["--budget", "soon"], "--budget"),
    (["--budget", "0s"], "--budget"),
    (["--policies", "fastest"], "unknown policy"),
    (["--top", "0"], "--top"),
    (["--max-candidates", "0"], "--max-candidates"),
    (["--plan-out", "/nonexistent-dir/x.json"], "--plan-out"),
])
def test_cli_bad_input_is_one_line(extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--hw", "a100", "--model", "gpt2", "--no-cache", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_cli_budget_parser_accepts_units() -> None:
    from tiersim.search_flags import parse_duration

    assert parse_duration("60s") == 60 and parse_duration("2m") == 120 and parse_duration("90") == 90
