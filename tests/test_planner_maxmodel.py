"""Largest trainable model (planner.maxmodel, tiersim max-model): families, exact bisection, binding."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.job import JobRequest, resolve_hardware
from planner.maxmodel import (
    check_model,
    largest_true,
    max_model,
    preset_scaler,
    resolve_preset,
    screen_model,
    shape_model,
    shape_scaler,
)
from tiersim.cli import main
from workloads import WorkloadInputError, load_model

SMALL = JobRequest(global_batch=2, seq_len=512)
SMALL_FLAGS = ["--global-batch", "2", "--seq-len", "512"]
TINY_GPU = ["gpu.memory=8GB"]  # a small GPU keeps the largest model (and each simulation) small


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The commands cache evaluations on disk by default: keep this suite's cache out of the home directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@given(threshold=st.integers(0, 300), start=st.integers(1, 300), hi_cap=st.integers(1, 300))
def test_largest_true_is_exact_on_any_threshold(threshold: int, start: int, hi_cap: int) -> None:
    calls: list[int] = []

    def ok(n: int) -> bool:
        calls.append(n)
        return n <= threshold

    good, bad = largest_true(ok, lo=1, start=start, hi_cap=hi_cap)
    if threshold < 1:
        assert (good, bad) == (None, 1)
    elif threshold >= hi_cap:
        assert (good, bad) == (hi_cap, None)
    else:
        assert (good, bad) == (threshold, threshold + 1)
        assert good in calls and bad in calls  # both ends were really evaluated
    assert len(calls) <= 4 * max(hi_cap, 2).bit_length() + 2


def test_shapes_reproduce_published_models() -> None:
    assert shape_model("gpt", 12288, 96).params() == load_model("gpt3-175b").params()
    assert shape_model("llama", 4096, 32).params() == load_model("llama2-7b").params()


def test_width_scaling_keeps_the_preset_at_its_own_width() -> None:
    base = load_model("llama3-8b")
    scaler = preset_scaler("llama3-8b", "width")
    same = scaler.build(base.n_kv_heads)
    assert (same.hidden, same.n_heads, same.n_kv_heads, same.ffn, same.n_layers) == (
        base.hidden, base.n_heads, base.n_kv_heads, base.ffn, base.n_layers)
    wider = scaler.build(base.n_kv_heads + 1)
    assert wider.hidden == base.hidden + 512 and wider.head_dim == base.head_dim and wider.ffn % 256 == 0
    assert wider.params() > base.params()
    layers = preset_scaler("70b", "layers")
    assert layers.start == 80 and layers.build(3).n_layers == 3 and layers.build(3).hidden == 8192


def test_family_prefix_picks_the_first_preset() -> None:
    assert resolve_preset("llama3").name == "llama3-8b"
    assert resolve_preset("70b").name == "llama2-70b"
    with pytest.raises(WorkloadInputError, match="family"):
        resolve_preset("bert")


def test_answer_is_feasible_and_one_layer_more_is_not() -> None:
    hw = resolve_hardware("a100", TINY_GPU)
    scaler = shape_scaler("gpt", 1024)
    out = max_model(hw, scaler, "none", request=SMALL)
    assert out.largest is not None and out.first_infeasible is not None
    n = out.largest.n
    assert out.first_infeasible.n == n + 1
    assert out.largest.model.n_layers == n and out.largest.feasible and not out.first_infeasible.feasible
    # checked again from scratch, outside the bisection
    assert check_model(hw, scaler.build(n), "none", request=SMALL).feasible
    again = check_model(hw, scaler.build(n + 1), "none", request=SMALL)
    assert not again.feasible and again.binding == "gpu0" == out.binding
    assert 1 < n < 64  # 8 GB holds a few dozen 12.6M-parameter layers at 16 B/param, not hundreds
    unscreened = max_model(hw, scaler, "none", request=SMALL, screen=False)  # every probe a full search
    assert unscreened.largest is not None and unscreened.largest.n == n and unscreened.binding == out.binding


def test_screen_rejection_agrees_with_a_search() -> None:
    hw = resolve_hardware("a100", TINY_GPU)
    scaler = shape_scaler("gpt", 1024)
    for n, fits in ((4, True), (400, False)):
        sc = screen_model(hw, scaler.build(n), "zero-offload", request=SMALL, n=n)
        full = check_model(hw, scaler.build(n), "zero-offload", request=SMALL)
        assert full.feasible is sc.passes is fits, n
        if not fits:
            assert sc.binding == full.binding == "gpu0" and sc.n_planned == full.best.n_candidates
    # a pass is only a maybe: 200 layers survive the plan-level checks, although `tiersim max-model` with these
    # settings finds 150 layers zero-offload's largest (the OOM above that shows only in the simulation)
    assert screen_model(hw, scaler.build(200), "zero-offload", request=SMALL).passes


def test_step_time_limit_binds_as_time() -> None:
    hw = resolve_hardware("a100", TINY_GPU)
    scaler = shape_scaler("gpt", 1024)
    four = check_model(hw, scaler.build(4), "none", request=SMALL, max_step_time_s=1e9)
    assert four.feasible and four.best.step_time_s is not None
    limit = four.best.step_time_s * 1.0001
    out = max_model(hw, scaler, "none", request=SMALL, max_step_time_s=limit)
    assert out.largest is not None and out.first_infeasible is not None
    assert out.largest.best.step_time_s <= limit
    assert out.binding == "time" and out.first_infeasible.best.feasible  # it fits, only too slow
    assert out.first_infeasible.n == out.largest.n + 1


def test_nothing_fits_reports_the_smallest() -> None:
    out = max_model("a100", shape_scaler("gpt", 8192), "none", request=SMALL, hw_overrides=["gpu.memory=2GB"])
    assert out.largest is None and out.first_infeasible is not None and out.first_infeasible.n == 1
    assert out.binding == "gpu0"


def test_cli_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["max-model", "--hw", "a100", "--set", TINY_GPU[0], "--policy", "none", "--shape", "gpt", "--hidden",
            "1024", *SMALL_FLAGS, "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "tiersim.max_model" and d["dimension"] == "layers"
    (r,) = d["results"]
    assert r["policy"] == "none" and r["binding"] == "gpu0"
    assert r["first_infeasible"]["n_layers"] == r["largest"]["n_layers"] + 1
    assert r["params"] == shape_model("gpt", 1024, r["largest"]["n_layers"]).params()
    assert main(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert f"{r['largest']['n_layers']}" in out and "gpu0" in out and "binding one step larger" in out


@pytest.mark.parametrize(("args", "needle"), [
    (["--shape", "gpt"], "--hidden"),
    (["--shape", "gpt", "--hidden", "1000"], "hidden"),
    (["--family", "bert"], "family"),
    (["--family", "7b", "--hidden", "4096"], "--hidden"),
    (["--shape", "gpt", "--hidden", "1024", "--scale", "width"], "--scale"),
    (["--shape", "gpt", "--hidden", "1024", "--policy", "nope"], "--policy"),
    (["--shape", "gpt", "--hidden", "1024", "--max-step-time", "soon"], "--max-step-time"),
    (["--shape", "gpt", "--hidden", "1024", "--budget", "-3"], "--budget"),
    (["--family", "mixtral-8x7b"], "mixture"),
])
def test_bad_input_is_one_line(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["max-model", "--hw", "a100", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_limit_reached_is_reported_not_exceeded(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["max-model", "--hw", "a100", "--set", TINY_GPU[0], "--policy", "none", "--shape", "gpt", "--hidden",
            "1024", "--limit", "8", *SMALL_FLAGS, "--json"]
    assert main(argv) == 0
    (r,) = json.loads(capsys.readouterr().out)["results"]
    assert r["cap_reached"] is True and r["largest"]["n_layers"] == 8 and r["first_infeasible"] is None
    assert max(c["n"] for c in r["checks"]) == 8
