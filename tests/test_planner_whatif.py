"""What-if grids (planner.whatif, tiersim whatif): parsing, the grid, no change == plan, sensitivity."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from hardware_models import HardwareInputError
from planner.job import JobRequest
from planner.search import search
from planner.whatif import Axis, Best, outcome_binding, parse_vary, scenario_grid, whatif
from tiersim.cli import main

SMALL = JobRequest(global_batch=4, seq_len=512)
SMALL_FLAGS = ["--global-batch", "4", "--seq-len", "512"]
POLICIES = ["none", "zero-offload"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The commands cache evaluations on disk by default: keep this suite's cache out of the home directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_parse_vary_splits_path_and_values() -> None:
    assert parse_vary("host.dram=512GB, 1TB,2TB") == Axis("host.dram", ("512GB", "1TB", "2TB"))
    assert parse_vary("pcie.gen=5") == Axis("pcie.gen", ("5",))


@pytest.mark.parametrize("text", ["host.dram", "=1TB", "pcie.gen=", "pcie.gen=4,,5", "pcie.gen=4,4"])
def test_parse_vary_rejects_malformed_text(text: str) -> None:
    with pytest.raises(HardwareInputError, match="--vary"):
        parse_vary(text)


def test_grid_is_the_cartesian_product_first_axis_slowest() -> None:
    axes = [Axis("host.dram", ("512GB", "1TB")), Axis("pcie.gen", ("4", "5")), Axis("nvme.count", ("1",))]
    assert scenario_grid(axes) == [
        {"host.dram": "512GB", "pcie.gen": "4", "nvme.count": "1"},
        {"host.dram": "512GB", "pcie.gen": "5", "nvme.count": "1"},
        {"host.dram": "1TB", "pcie.gen": "4", "nvme.count": "1"},
        {"host.dram": "1TB", "pcie.gen": "5", "nvme.count": "1"},
    ]
    assert scenario_grid([]) == [{}]


def _same_best(a: dict, b: dict) -> None:
    for key in ("best_policy", "feasible", "knobs", "micro_batch", "checkpointing", "tokens_per_s", "tflops_per_gpu",
                "step_time_s"):
        assert a[key] == b[key], key


def test_whatif_without_changes_equals_plan() -> None:
    plan = search("a100", "gpt2", request=SMALL, policies=POLICIES)
    assert plan.best is not None
    out = whatif("a100", "gpt2", [], request=SMALL, policies=POLICIES)
    b = out.base
    assert (b.policy, b.knobs, b.micro_batch, b.checkpointing) == (
        plan.best.policy, plan.best.knobs, plan.best.micro_batch, plan.best.checkpointing)
    assert (b.tokens_per_s, b.tflops_per_gpu, b.step_time_s) == (
        plan.best.tokens_per_s, plan.best.tflops_per_gpu, plan.best.step_time_s)
    assert len(out.scenarios) == 1 and out.scenarios[0].changes == {} and out.scenarios[0].best == b
    assert out.sensitivity == [] and out.n_searches == 1


def test_whatif_cli_without_changes_equals_plan_and_is_reproducible(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["whatif", "--hw", "a100", "--model", "gpt2", "--policies", "none,zero-offload", *SMALL_FLAGS, "--json"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    d = json.loads(first)
    plan = search("a100", "gpt2", request=SMALL, policies=POLICIES).best
    assert plan is not None
    assert d["kind"] == "tiersim.whatif" and d["hardware"] == "a100" and d["model"] == "gpt2"
    assert d["base"]["best_policy"] == plan.policy and d["base"]["tokens_per_s"] == plan.tokens_per_s
    assert d["base"]["knobs"] == plan.knobs
    assert main(argv) == 0
    assert capsys.readouterr().out == first  # byte for byte


def test_whatif_without_changes_equals_the_plan_command(capsys: pytest.CaptureFixture[str]) -> None:
    job = ["--hw", "a100", "--model", "gpt2", "--set", "host.dram=512GB", "--policies", "none,zero-offload",
           *SMALL_FLAGS, "--json"]
    assert main(["plan", *job]) == 0
    plan = json.loads(capsys.readouterr().out)["best"]
    assert main(["whatif", *job, "--no-cache"]) == 0  # computed afresh, not read from the plan's cache
    base = json.loads(capsys.readouterr().out)["base"]
    assert (base["best_policy"], base["knobs"], base["tokens_per_s"], base["tflops_per_gpu"], base["step_time_s"]) == (
        plan["policy"], plan["knobs"], plan["tokens_per_s"], plan["tflops_per_gpu"], plan["step_time_s"])
    assert (base["micro_batch"], base["checkpointing"]) == (plan["request"]["micro_batch"],
                                                            plan["request"]["checkpointing"])


def test_value_equal_to_the_base_is_no_change() -> None:
    out = whatif("a100", "gpt2", [Axis("pcie.gen", ("4",))], request=SMALL, policies=["none"])
    assert out.n_searches == 1  # the scenario is the base machine: planned once
    assert out.scenarios[0].best == out.base
    assert out.sensitivity == []
    assert out.notes == ["pcie.gen=4 is the base's value (no change)"]


def test_sensitivity_names_the_change_that_makes_the_job_feasible(capsys: pytest.CaptureFixture[str]) -> None:
    # opt-1.3b with everything on an 8 GB GPU does not fit; 80 GB does; the DRAM size changes nothing for `none`
    argv = ["whatif", "--hw", "a100", "--model", "opt-1.3b", "--set", "gpu.memory=8GB", "--policies", "none",
            "--vary", "gpu.memory=8GB,80GB", "--vary", "host.dram=128GB", *SMALL_FLAGS, "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["base"]["feasible"] is False and d["base"]["binding"] == "gpu0"
    assert [s["changes"] for s in d["scenarios"]] == [{"gpu.memory": "8GB", "host.dram": "128GB"},
                                                      {"gpu.memory": "80GB", "host.dram": "128GB"}]
    assert [s["feasible"] for s in d["scenarios"]] == [False, True]
    by_change = {s["change"]: s for s in d["sensitivity"]}
    assert set(by_change) == {"gpu.memory=80GB", "host.dram=128GB"}  # gpu.memory=8GB is the base's value
    assert by_change["gpu.memory=80GB"]["makes_feasible"] is True
    assert by_change["gpu.memory=80GB"]["tokens_per_s"] > 0 and by_change["gpu.memory=80GB"]["gain"] is None
    assert by_change["host.dram=128GB"]["makes_feasible"] is False
    assert d["sensitivity"][0]["change"] == "gpu.memory=80GB"  # feasibility-making changes first
    for s in d["sensitivity"]:
        assert set(s) >= {"change", "base_tokens_per_s", "tokens_per_s", "gain", "makes_feasible"}
    for s in d["scenarios"]:
        assert set(s) >= {"changes", "best_policy", "feasible", "tokens_per_s", "tflops_per_gpu"}


def test_gain_is_relative_to_the_base(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["whatif", "--hw", "a100", "--model", "gpt2", "--policies", "none",
            "--vary", "gpu.peak_flops.bf16=624TFLOPS", *SMALL_FLAGS, "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    (s,) = d["sensitivity"]
    assert s["gain"] == pytest.approx(s["tokens_per_s"] / s["base_tokens_per_s"] - 1)
    assert s["gain"] > 0  # twice the FLOP/s never slows `none` down


@pytest.mark.parametrize(("vary", "needle"), [
    (["host.dramx=1TB"], "host.dramx"),
    (["pcie.gen=7"], "pcie.gen"),
    (["nvme.count=1,four"], "nvme.count"),
    (["host.dram"], "--vary"),
    (["pcie.gen=4,,5"], "pcie.gen"),
    (["pcie.gen=4", "pcie.gen=5"], "pcie.gen"),
])
def test_bad_vary_is_one_line_naming_the_path(vary: list[str], needle: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["whatif", "--hw", "a100", "--model", "gpt2"]
    for v in vary:
        argv += ["--vary", v]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_human_table_lists_scenarios_and_sensitivity(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["whatif", "--hw", "a100", "--model", "gpt2", "--policies", "none", "--vary", "pcie.gen=4,5", *SMALL_FLAGS]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "best policy" in out and "sensitivity" in out and "pcie.gen=5" in out
    assert "pcie.gen=4 is the base's value" in out


def test_progress_goes_to_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["whatif", "--hw", "a100", "--model", "gpt2", "--policies", "none", "--vary", "pcie.gen=5", *SMALL_FLAGS,
            "--json"]
    assert main(argv) == 0
    quiet = capsys.readouterr()
    assert main([*argv, "--progress"]) == 0
    loud = capsys.readouterr()
    assert loud.out == quiet.out  # stdout is the same with or without progress
    assert "[1/2] planning base (no change)" in loud.err and "[2/2] pcie.gen=5: none" in loud.err
    assert "planning" not in quiet.err


def _outcome(rejected: dict[str, int], evaluated: list[tuple[str, str | None]], cut: str | None = None) -> Any:
    """A stand-in for an infeasible SearchOutcome: what Best.of reads from one."""
    evs = [SimpleNamespace(feasible=False, reason=r, binding=b) for r, b in evaluated]
    return SimpleNamespace(best=None, rejected=rejected, evaluated=evs, cut_short=cut, n_candidates=len(evs),
                           n_simulated=0)


def test_binding_is_the_pool_most_candidates_overflow() -> None:
    o = _outcome({"oom: gpu0": 2, "policy: cpu memory": 1, "knobs: invalid": 3},
                 [("oom: gpu0", "gpu0"), ("oom: gpu0", "gpu0"), ("policy: cpu memory", "cpu"),
                  ("knobs: invalid", None), ("knobs: invalid", None), ("knobs: invalid", None)])
    b = Best.of(o)
    assert (b.feasible, b.binding, b.cut_short) == (False, "gpu0", None)
    assert b.verdict() == "infeasible (gpu0)"


def test_a_search_cut_by_its_bounds_proves_nothing() -> None:
    skipped = _outcome({"oom: gpu0": 1, "skipped: max candidates": 5},
                       [("oom: gpu0", "gpu0")] + [("skipped: max candidates", None)] * 5)
    assert Best.of(skipped).binding == "budget" and Best.of(skipped).cut_short == "5 candidates skipped: max candidates"
    assert Best.of(skipped).verdict() == "not settled (budget)"
    timed = _outcome({"oom: gpu0": 1}, [("oom: gpu0", "gpu0")], cut="wall-time budget reached while simulating")
    assert Best.of(timed).binding == "budget" and "wall-time" in Best.of(timed).cut_short
    stopped = _outcome({"oom: gpu0": 1, "skipped: first feasible found": 4}, [("oom: gpu0", "gpu0")])
    assert Best.of(stopped).cut_short is None  # stopping at the first feasible plan is what was asked
    assert outcome_binding(_outcome({}, [])) is None


def test_roomy_bounds_give_the_unbounded_answer() -> None:
    axes = [Axis("pcie.gen", ("5",))]
    free = whatif("a100", "gpt2", axes, request=SMALL, policies=["none"])
    roomy = whatif("a100", "gpt2", axes, request=SMALL, policies=["none"], max_candidates=1000)
    assert roomy.to_dict() == free.to_dict()


def test_machines_planned_in_parallel_give_the_serial_answers() -> None:
    """workers > 1 plans the machines in worker processes (planner.whatif.best_within_each): every scenario's
    answer, the sensitivity and the order are those of the serial loop; progress names every machine."""
    axes = [Axis("gpu.memory", ("8GB", "80GB")), Axis("pcie.gen", ("4", "5"))]
    serial = whatif("a100", "opt-1.3b", axes, request=SMALL, policies=POLICIES, hw_overrides=["gpu.memory=8GB"])
    lines: list[str] = []
    parallel = whatif("a100", "opt-1.3b", axes, request=SMALL, policies=POLICIES, hw_overrides=["gpu.memory=8GB"],
                      workers=2, progress=lines.append)
    assert parallel.to_dict() == serial.to_dict()
    assert serial.n_searches == parallel.n_searches == 4
    assert sum("planning" in ln for ln in lines) == 4 and sum(ln.startswith("[") and ": " in ln
                                                              and "planning" not in ln for ln in lines) == 4
    assert len({(s.best.policy, s.best.tokens_per_s) for s in parallel.scenarios}) > 1  # the grid really differs


def test_parallel_machines_keep_the_budget() -> None:
    """A budget too small for any search: the parallel what-if still answers within it (each machine's search
    gets its share and stops there), each machine says the budget cut it."""
    import time

    axes = [Axis("pcie.gen", ("3", "4", "5"))]
    t0 = time.perf_counter()
    out = whatif("a100x8", "70b", axes, budget_s=3.0, workers=2)
    wall = time.perf_counter() - t0
    assert wall < 3.0 * 1.25 + 2.0  # + starting and stopping the worker processes
    assert all(s.best.cut_short for s in out.scenarios)
