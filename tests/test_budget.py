"""``--budget`` as a wall-clock promise (planner.deadline): the mechanism, driven by a fake clock, and one
generous real-time check that a search stuck in a long simulation still returns near its deadline."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

import planner.maxmodel as maxmodel_mod
import planner.search as search_mod
from planner.deadline import Deadline, run_bounded
from planner.job import JobRequest, resolve_hardware
from planner.maxmodel import max_model, shape_scaler
from planner.search import search
from planner.whatif import Axis, whatif
from tiersim.cli import main
from tiersim.search_flags import DEFAULT_BUDGETS, parse_budget

# gpt2 on one A100 squeezed to 4 GB, one policy: a few dozen candidates, each simulated in well under a second
SMALL = {"hw": "a100", "model": "gpt2", "request": JobRequest(seq_len=512), "hw_overrides": ("gpu.memory=2.73GB",),
         "policies": ("none",)}


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_deadline_left_expired_and_shares_follow_its_clock() -> None:
    clock = FakeClock()
    d = Deadline.after(100.0, clock)
    assert d.bounded and d.left() == 100.0 and not d.expired()
    half = d.share(2)
    assert half.left() == 50.0
    assert d.within(500.0).left() == 100.0  # a sub-deadline never ends after its parent
    assert d.share(4, floor_s=80.0).left() == 80.0
    clock.now += 60.0
    assert half.expired() and not d.expired() and d.left() == 40.0 and d.elapsed() == 60.0
    clock.now += 40.0
    assert d.expired() and d.left() == 0.0 and d.share(3).expired()
    free = Deadline.never()
    assert not free.bounded and free.left() == math.inf and not free.share(5).bounded
    assert free.within(3.0).bounded
    with pytest.raises(ValueError, match="more than zero"):
        Deadline.after(0.0)


def _square(x: int) -> int:
    return x * x


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_run_bounded_answers_or_stops_at_the_deadline() -> None:
    assert run_bounded(Deadline.never(), _square, 7) == (True, 49)  # no deadline: in this process
    clock = FakeClock()
    assert run_bounded(Deadline.after(5.0, clock), _square, 8) == (True, 64)  # in a worker, the clock frozen
    gone = Deadline.after(5.0, clock)
    clock.now += 10.0
    assert run_bounded(gone, _square, 9) == (False, None)  # expired before it starts: nothing runs


def test_a_deadline_that_is_not_reached_gives_the_unbounded_answer() -> None:
    free = search(**SMALL)  # type: ignore[arg-type]
    bounded = search(**SMALL, deadline=Deadline.after(10.0, FakeClock()))  # type: ignore[arg-type]
    assert free.cut_short is None and bounded.cut_short is None
    assert bounded.to_dict() == free.to_dict()  # worker processes, the same sequential rule


def test_a_deadline_reached_after_planning_stops_before_simulating(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    real = search_mod._survivors

    def survivors_then_time_is_up(s, cands):  # noqa: ANN001, ANN202
        clock.now += 1e6
        return real(s, cands)

    monkeypatch.setattr(search_mod, "_survivors", survivors_then_time_is_up)
    # the exhaustive search plans every candidate before it simulates
    out = search(**SMALL, deadline=Deadline.after(60.0, clock), prune=False)  # type: ignore[arg-type]
    assert out.best is None and out.n_simulated == 0
    assert out.cut_short is not None and "wall-time budget of 60 s reached while simulating" in out.cut_short
    assert out.rejected.get("skipped: budget", 0) >= 1


def test_a_deadline_reached_in_a_screened_search_stops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The screened search (plans built lazily in screen order) looks at the deadline before every plan
    and every simulation: time up after the first plan, nothing is simulated and the rest is skipped."""
    clock = FakeClock()
    real = search_mod._screen_plan

    def plan_then_time_is_up(s, run, c):  # noqa: ANN001, ANN202
        done = real(s, run, c)
        clock.now += 1e6
        return done

    monkeypatch.setattr(search_mod, "_screen_plan", plan_then_time_is_up)
    out = search(**SMALL, deadline=Deadline.after(60.0, clock))  # type: ignore[arg-type]
    assert out.best is None and out.n_simulated == 0
    assert out.cut_short is not None and "wall-time budget of 60 s reached while" in out.cut_short
    assert out.rejected.get("skipped: budget", 0) >= 1


def test_an_expired_deadline_builds_and_simulates_nothing() -> None:
    clock = FakeClock()
    d = Deadline.after(1.0, clock)
    clock.now += 2.0
    out = search(**SMALL, deadline=d)  # type: ignore[arg-type]
    assert out.best is None and out.n_simulated == 0
    assert out.rejected.get("skipped: budget", 0) >= 1 and "wall-time budget" in (out.cut_short or "")


def test_a_cut_bisection_reports_what_it_proved(monkeypatch: pytest.MonkeyPatch) -> None:
    hw = resolve_hardware("a100", ["gpu.memory=8GB"])
    scaler = shape_scaler("gpt", 1024)
    request = JobRequest(global_batch=2, seq_len=512)
    full = max_model(hw, scaler, "none", request=request, screen=False)
    assert full.largest is not None and full.cut_short is None
    clock = FakeClock()
    real = maxmodel_mod.check_model
    calls: list[int] = []

    def two_checks_then_time_is_up(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(kwargs["n"])
        if len(calls) == 2:
            clock.now += 1e6
        return real(*args, **kwargs)

    monkeypatch.setattr(maxmodel_mod, "check_model", two_checks_then_time_is_up)
    cut = max_model(hw, scaler, "none", request=request, screen=False, deadline=Deadline.after(60.0, clock))
    assert len(calls) == 2 and cut.cut_short is not None and "bisection" in cut.cut_short
    # what it reports is proven: a size that fits is at most the true answer, one that does not is above it
    if cut.largest is not None:
        assert cut.largest.feasible and cut.largest.n <= full.largest.n
    if cut.first_infeasible is not None:
        assert not cut.first_infeasible.feasible and cut.first_infeasible.n > full.largest.n
    assert cut.to_dict()["cut_short"] == cut.cut_short


def test_whatif_shares_one_deadline_and_says_what_it_could_not_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    real = search_mod.search
    searches: list[int] = []

    def one_search_then_time_is_up(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = real(*args, **kwargs)
        searches.append(1)
        clock.now += 1e6
        return out

    import planner.whatif as whatif_mod

    monkeypatch.setattr(whatif_mod, "search", one_search_then_time_is_up)
    out = whatif("a100", "gpt2", [Axis("pcie.gen", ("5",))], request=JobRequest(seq_len=512),
                 hw_overrides=["gpu.memory=2.73GB"], policies=["none"], deadline=Deadline.after(60.0, clock))
    assert out.base.feasible and out.base.cut_short is None  # the base was planned whole
    (scenario,) = out.scenarios
    assert not scenario.best.feasible and scenario.best.binding == "budget"  # said, never passed off as a pool


def _slow_simulation(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    time.sleep(120.0)
    raise AssertionError("the deadline should have stopped this simulation")


def test_a_long_simulation_does_not_carry_the_search_past_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one real-time check, generous for a loaded 2-core machine: a 120 s simulation, a 2 s budget."""
    monkeypatch.setattr(search_mod, "simulate_plan", _slow_simulation)  # inherited by the forked workers
    t0 = time.perf_counter()
    out = search(**SMALL, budget_s=2.0)  # type: ignore[arg-type]
    wall = time.perf_counter() - t0
    assert wall < 30.0, wall
    assert out.best is None and out.cut_short is not None and "wall-time budget of 2 s" in out.cut_short


def test_every_searching_command_has_a_default_budget_said_in_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command, default in DEFAULT_BUDGETS.items():
        try:
            main([command, "--help"])
        except SystemExit as e:  # argparse's own exit, where the CLI does not catch it
            assert e.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert f"(default {default}; 'none' for no limit)" in text, command
        assert parse_budget(default) is not None
    assert parse_budget("none") is None and parse_budget("2m") == 120.0


@pytest.mark.parametrize("argv", [
    ["plan", "--hw", "a100", "--model", "gpt2", "--workers", "1"],
    ["max-model", "--hw", "a100", "--policy", "none", "--shape", "gpt", "--hidden", "1024"],
])
def test_a_search_cut_before_any_answer_is_not_settled_not_infeasible(argv: list[str],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A cut is no proof of infeasibility: exit 4 (not settled) and a line that says so, never 3."""
    from tiersim.cli import main
    from tiersim.exit_codes import EXIT_CUT

    assert main([*argv, "--budget", "0.001s", "--no-cache"]) == EXIT_CUT == 4
    out = capsys.readouterr().out
    assert "NOT SETTLED" in out and "CUT SHORT" in out



def test_a_search_under_a_deadline_builds_each_plan_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a deadline plans are built and simulated in one worker process: a plan built there is simulated
    in the same task (when it is the next one simulated) or from the worker's scratch, never built again; the
    answer is the unbounded one, the best plan too when it is kept."""
    log = tmp_path / "built"
    real = search_mod.make_plan

    def logged(job, policy, knobs=()):  # noqa: ANN001, ANN202 - runs in the worker (forked after the patch)
        with log.open("a") as f:
            f.write(f"{policy} {sorted(dict(knobs).items())} {job.config.micro_batch} {job.config.checkpointing}\n")
        return real(job, policy, knobs)

    # four simulations: some simulated where they were built, some from the scratch
    space = {"hw": "a100", "model": "gpt2-xl", "request": JobRequest(seq_len=512),
             "hw_overrides": ("gpu.memory=1.5GB",), "policies": ("zero-infinity", "lazytrain")}
    free = search(**space, keep_best_plan=True)  # type: ignore[arg-type]
    monkeypatch.setattr(search_mod, "make_plan", logged)
    bounded = search(**space, keep_best_plan=True, deadline=Deadline.after(60.0, FakeClock()))  # type: ignore[arg-type]
    assert bounded.cut_short is None and bounded.to_dict() == free.to_dict()
    assert bounded.n_simulated >= 2
    built = log.read_text().splitlines()
    assert len(built) == len(set(built))  # no plan was built twice
    assert free.best is not None and bounded.best is not None and bounded.best.plan is not None
    assert bounded.best.plan.to_dict() == free.best.plan.to_dict()


def _first_search_overruns(monkeypatch: pytest.MonkeyPatch, module: object, clock: FakeClock,
                           seconds: float) -> list[int]:
    """Patch ``module.search`` so that its first call finds ``seconds`` gone by on ``clock`` (its share overrun)."""
    real = search_mod.search
    calls: list[int] = []

    def first_overruns(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        if len(calls) == 1:
            clock.now += seconds
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "search", first_overruns)
    return calls


def test_whatif_searches_a_machine_its_share_cut_again_with_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.whatif as whatif_mod

    kw = {"request": JobRequest(seq_len=512), "hw_overrides": ["gpu.memory=2.73GB"], "policies": ["none"]}
    free = whatif("a100", "gpt2", [Axis("pcie.gen", ("5",))], **kw)  # type: ignore[arg-type]
    clock = FakeClock()
    # the base's share of 60 s is 30 s (its exact search 22.5 s): 25 s pass in it, 35 s are left for the rest
    calls = _first_search_overruns(monkeypatch, whatif_mod, clock, 25.0)
    out = whatif("a100", "gpt2", [Axis("pcie.gen", ("5",))], deadline=Deadline.after(60.0, clock),  # type: ignore[arg-type]
                 **kw)
    assert len(calls) == 4  # base (cut), its first-feasible fallback, the scenario, the base again
    assert out.base.cut_short is None and out.to_dict() == free.to_dict()


def test_coverage_searches_a_cell_its_share_cut_again_with_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.coverage as coverage_mod
    import planner.whatif as whatif_mod
    from planner.coverage import coverage

    kw = {"request": JobRequest(seq_len=512), "policies": ["none", "zero-offload"],
          "hw_overrides": ["gpu.memory=2.73GB"]}
    free = coverage("a100", ["gpt2"], **kw)  # type: ignore[arg-type]
    clock = FakeClock()
    calls = _first_search_overruns(monkeypatch, whatif_mod, clock, 25.0)
    assert coverage_mod.best_within.__module__ == "planner.whatif"  # its searches are whatif's
    out = coverage("a100", ["gpt2"], deadline=Deadline.after(60.0, clock), **kw)  # type: ignore[arg-type]
    assert len(calls) == 4 and all(c.best.cut_short is None for c in out.cells)
    assert out.to_dict() == free.to_dict()
    # a cap on each cell is kept: no second pass
    clock = FakeClock()
    calls = _first_search_overruns(monkeypatch, whatif_mod, clock, 25.0)
    capped = coverage("a100", ["gpt2"], deadline=Deadline.after(60.0, clock), cell_budget_s=100.0, **kw)  # type: ignore[arg-type]
    assert len(calls) == 3 and capped.cells[0].best.cut_short is not None
