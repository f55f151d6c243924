"""Rank templates (``simulator.rank_template``, issue 13): rank 0's tasks of a data-parallel plan simulate exactly
as the full plan, their names are the images the symmetry proof pairs, and a template cannot be mistaken for a
plan (saved, replayed, simulated rank by rank)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from planner.bounds import plan_bounds
from planner.job import JobRequest, make_job, make_plan, simulate_job
from policies.builder import PlanBuilder
from policies.kit import Layout
from policies.none import Knobs as NoneKnobs
from simulator import simulate_plan, validate_plan
from simulator.engine import plan_symmetry, run_plan
from simulator.errors import PlanError, TemplateRefused
from simulator.rank_template import RankTemplate, canonical, group_copies, image, names_a_rank
from simulator.symmetry import Symmetry
from tiersim.cli import main

CASES = [  # (hardware overrides, model, policy, knobs)
    (["gpu.count=2"], "7b", "zero-offload", {}),
    (["gpu.count=4"], "7b", "zero-offload", {"delayed_update": True}),
    (["gpu.count=8"], "7b", "zero-offload", {"upload_bytes_per_param": 4.0}),
    (["nodes=2", "gpu.count=4"], "7b", "zero-offload", {}),
    (["gpu.count=8"], "gpt2", "none", {"stage": 0}),
    (["gpu.count=4"], "gpt2", "none", {"stage": 1}),
    (["gpu.count=8"], "gpt2", "none", {"stage": 2}),
    (["gpu.count=8"], "7b", "none", {"stage": 3}),
    (["gpu.count=4"], "7b", "zero-infinity", {}),
    (["gpu.count=4"], "7b", "zero-infinity", {"param_device": "nvme", "optimizer_device": "nvme"}),
    (["nodes=2", "gpu.count=2"], "7b", "zero-infinity", {"optimizer_device": "nvme"}),
    (["gpu.count=4"], "7b", "lazytrain", {}),
    (["gpu.count=2", "host.dram=256GB"], "13b", "lazytrain", {}),
    (["gpu.count=8"], "7b", "zero-offload", {"tp": 2}),
    (["nodes=2", "gpu.count=4"], "7b", "zero-offload", {"tp": 4}),
    (["gpu.count=8"], "7b", "none", {"stage": 3, "tp": 2}),
    (["gpu.count=8"], "7b", "none", {"stage": 1, "tp": 4}),
    (["gpu.count=4"], "7b", "none", {"tp": 4}),  # one data-parallel rank: tensor parallel only
    # pipeline replicas (a rank of S GPUs): GPU Adam, CPU Adam with bounce buffers, GPipe's stash, a tied table
    (["nodes=4"], "70b", "tinypipe", {}),
    (["nodes=2"], "70b", "tinypipe", {"stages": 4}),
    (["gpu.count=4"], "7b", "tinypipe", {"stages": 2, "schedule": "gpipe"}),
    ([], "gpt2", "tinypipe", {"stages": 2}),
    # SynergyScale: peer and cpu tiers, activations offloaded, chunks on two streams; 70b on two nodes
    (["gpu.count=4"], "13b", "synergyscale", {"peer_fraction": "0.3", "cpu_fraction": "0.3",
                                              "offload_activations": True}),
    (["gpu.count=4"], "7b", "synergyscale", {"peer_fraction": "0.5", "chunks": 2, "streams": 2}),
    (["nodes=2"], "70b", "synergyscale", {}),
]


def _close(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two results' JSON differ beyond float summation order (1e-12 relative), ``sim.wall_s`` aside."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only one has it" for k in set(a) ^ set(b)]
        for k in set(a) & set(b):
            if f"{path}.{k}" != ".sim.wall_s":
                out += _close(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} != {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9) else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.parametrize(("sets", "model", "policy", "knobs"), CASES)
def test_template_simulates_as_the_full_plan(sets: list[str], model: str, policy: str, knobs: dict) -> None:
    job, _ = make_job("a100x8", model, hw_overrides=sets)
    full, tpl = make_plan(job, policy, knobs), make_plan(job, policy, knobs, template=True)
    assert full.template is None and tpl.template is not None
    n = tpl.template.ranks
    assert n * tpl.template.width == job.n_gpus and n > 1
    assert sum(len(s.tasks) for s in tpl.segments) < sum(len(s.tasks) for s in full.segments)
    a, b = simulate_plan(full, job.hw), simulate_plan(tpl, job.hw)
    assert a.sim.reduction == b.sim.reduction == f"{n} ranks simulated as 1 class of {n}"
    assert not _close(a.to_dict(), b.to_dict())
    key = lambda r: (r.uid, r.start)  # noqa: E731
    assert sorted(a.records, key=key) == sorted(b.records, key=key)  # every rank's record, tags and all
    assert a.hfu == b.hfu and a.peak_bytes == pytest.approx(b.peak_bytes, rel=1e-12)


@pytest.mark.parametrize(("sets", "model", "policy", "knobs"), CASES[:1] + CASES[3:5] + CASES[7:10] + CASES[11:])
def test_template_is_the_reduced_plan_and_its_images_the_proofs_pairing(sets: list[str], model: str, policy: str,
                                                                        knobs: dict) -> None:
    """The template's tasks and streams are what the proof keeps of the full plan (``Symmetry.reduce``), and
    rank r's names are the images of rank 0's by rule, as the proof pairs them task by task."""
    job, _ = make_job("a100x8", model, hw_overrides=sets)
    full, tpl = make_plan(job, policy, knobs), make_plan(job, policy, knobs, template=True)
    sym = plan_symmetry(full, job.hw)
    assert isinstance(sym, Symmetry)
    reduced = sym.reduce(full)
    assert [s.tasks for s in reduced.segments] == [s.tasks for s in tpl.segments]
    assert set(reduced.streams) <= set(tpl.streams)  # (the template also declares rank 0's idle streams)
    assert set(tpl.tensors) <= set(reduced.tensors)
    assert tpl.template is not None
    tp, width = tpl.template.tp, tpl.template.width
    for k in range(sym.n):
        # the proof's k-th owner is rank r (on GPUs r * width ...)
        r = int(sym.stream_maps[k]["gpu0.compute"][3:].split(".")[0]) // width
        for name, maps, stream in (("task", sym.task_maps, False), ("tensor", sym.tensor_maps, False),
                                   ("stream", sym.stream_maps, True), ("collective", sym.coll_maps, False)):
            for a, b in maps[k].items():
                assert image(a, r, tp=tp, stream=stream, width=width) == b, (name, a, b, r)


@pytest.mark.parametrize(("sets", "model", "policy", "knobs"), CASES)
def test_template_bounds_are_the_full_plans(sets: list[str], model: str, policy: str, knobs: dict) -> None:
    """The planner bounds a template as the full plan: the same step-time bound (and binding resource) and the same
    memory bound on every pool, through the template's symmetry (``planner.bounds``)."""
    job, _ = make_job("a100x8", model, hw_overrides=sets)
    a = plan_bounds(make_plan(job, policy, knobs), job.hw)
    b = plan_bounds(make_plan(job, policy, knobs, template=True), job.hw)
    assert b.time_s == pytest.approx(a.time_s, rel=1e-12) and b.time_resource == a.time_resource
    assert b.memory_bytes == pytest.approx(a.memory_bytes, rel=1e-12)


def test_names_images_and_groups() -> None:
    assert image("fwd3.gpu0", 5) == "fwd3.gpu5" and image("fwd3.gpu5", 5) == "fwd3.gpu0"
    assert image("fwd3.gpu2", 5) == "fwd3.gpu2"  # a third rank's name stays
    assert image("adam3.r0", 7) == "adam3.r7"  # layer 3's step: its first part is its own label
    assert image("cpu.adam0", 7, stream=True) == "cpu.adam7" and image("gpu0.h2d", 2, stream=True) == "gpu2.h2d"
    assert image("red4", 3) == "red4" and image("ag1.d0", 3) == "ag1.d0"  # tp = 1: one data-parallel group
    # tp = 4: rank 6 is position 2 of tensor-parallel group 1
    assert image("ag1.d0", 6, tp=4) == "ag1.d2" and image("tpf1a.k0", 6, tp=4) == "tpf1a.k1"
    assert image("dp0.grad", 6, tp=4, stream=True) == "dp2.grad" and image("tp0", 6, tp=4, stream=True) == "tp1"
    assert canonical("up2.gpu12") == "up2.gpu0" and canonical("ag1.d3") == "ag1.d0" and canonical("red4") == "red4"
    assert group_copies("tpb2.k0", ("k", "tp"), [1, 2]) == ["tpb2.k1", "tpb2.k2"]
    assert names_a_rank("param32.r0") and not names_a_rank("ag1.d0") and not names_a_rank("p16.3")
    with pytest.raises(ValueError, match="not a group collective"):
        group_copies("fwd1.gpu0", ("k", "tp"), [1])
    # pipeline replicas of 4 stages: replica 2 runs on gpu8..gpu11; its GPU block and replica 0's trade places
    assert image("f3.gpu1.m0F", 2, width=4) == "f3.gpu9.m0F" and image("f3.gpu9.m0F", 2, width=4) == "f3.gpu1.m0F"
    assert image("f3.gpu5.m0F", 2, width=4) == "f3.gpu5.m0F"  # replica 1's stays
    assert image("tie.r0", 2, width=4) == "tie.r2" and image("tie0", 2, width=4, stream=True) == "tie2"
    assert image("cpu.adam3", 2, width=4, stream=True) == "cpu.adam11" and image("ar5.s1", 2, width=4) == "ar5.s1"
    assert canonical("f3.gpu9.m0F", width=4) == "f3.gpu1.m0F" and canonical("tie.r3", width=4) == "tie.r0"
    with pytest.raises(ValueError, match="data parallel only"):
        RankTemplate(4, tp=2, width=4)


def test_synergyscale_whole_fetches_wait_for_every_rank_as_for_rank_0s() -> None:
    """Without NVLink a cpu tier's layer is fetched whole by every GPU, each upload waiting for every rank's CPU
    Adam of the previous step: a barrier, which the template keeps as rank 0's own wait."""
    job, _ = make_job("rtx4090x4", "7b")
    knobs = {"cpu_fraction": "0.5", "peer_fraction": "0"}
    full, tpl = make_plan(job, "synergyscale", knobs), make_plan(job, "synergyscale", knobs, template=True)
    assert tpl.template is not None and full.info["fetch"] == "whole per GPU" and "c" in full.info["layer_tiers"]
    up = {t.id: t for s in full.segments for t in s.tasks}["upf1_0.gpu0"]
    assert {"adam1.r0", "adam1.r3"} <= {d.id for d in up.deps}
    a, b = simulate_plan(full, job.hw), simulate_plan(tpl, job.hw)
    assert a.sim.reduction == b.sim.reduction == "4 ranks simulated as 1 class of 4"
    assert not _close(a.to_dict(), b.to_dict())


def test_template_is_not_a_plan_to_save_or_simulate_rank_by_rank() -> None:
    job, _ = make_job("a100x8", "gpt2", hw_overrides=["gpu.count=4"])
    tpl = make_plan(job, "none", template=True)
    with pytest.raises(PlanError, match="rank template of 4 ranks is not a plan to save"):
        tpl.to_dict()
    with pytest.raises(PlanError, match="rank template"):
        run_plan(tpl, job.hw)
    assert simulate_plan(tpl, job.hw, symmetric=False).sim.reduction == "4 ranks simulated as 1 class of 4"


def test_policies_and_jobs_without_templates_give_the_full_plan() -> None:
    job, _ = make_job("a100x8", "13b", hw_overrides=["gpu.count=4"])
    nvme = make_plan(job, "synergyscale", {"nvme_fraction": "0.3", "peer_fraction": "0"}, template=True)
    assert nvme.template is None and "n" in nvme.info["layer_tiers"]  # the NVMe tier's streams are the machine's
    # a swapping stage's CPU Adam waits for every replica's gradients: no replica's tasks stand for the others'
    swap, _ = make_job("a100x8", "70b", hw_overrides=["nodes=2"])
    plan = make_plan(swap, "tinypipe", {"stages": 4, "schedule": "gpipe"}, template=True)
    assert plan.template is None and {st["mode"] for st in plan.info["partition"]} == {"swap"}
    one, _ = make_job("a100x8", "70b")  # one pipeline of 8 stages: nothing to stand for
    assert make_plan(one, "tinypipe", template=True).template is None
    one, _ = make_job("a100x8", "gpt2", hw_overrides=["gpu.count=1"])
    assert make_plan(one, "none", template=True).template is None
    with pytest.raises(ValueError, match="two or more ranks"):
        Layout(1, template=True)


def test_uneven_machine_refuses_the_template_and_simulate_job_builds_the_full_plan() -> None:
    """Three GPUs of a100x8: two share a switch uplink, the third has one alone, so the ranks do not play one role;
    the proof refuses the full plan's symmetry too and simulates every rank."""
    job, _ = make_job("a100x8", "7b", hw_overrides=["gpu.count=3"])
    tpl = make_plan(job, "zero-offload", template=True)
    with pytest.raises(TemplateRefused, match="uplink"):
        simulate_plan(tpl, job.hw)
    plan, result = simulate_job(job, "zero-offload")
    assert plan.template is None and result.sim.reduction == ""
    with pytest.raises(TemplateRefused):
        plan_bounds(tpl, job.hw)
    assert result.step_time_s == simulate_plan(make_plan(job, "zero-offload"), job.hw).step_time_s


def test_builder_drops_only_other_ranks_copies() -> None:
    """A template's collectives name every rank's tasks; the builder drops the references to other ranks' copies
    of rank-0 tasks and keeps any other unknown reference, for the validation to name."""
    job, _ = make_job("a100x8", "gpt2", hw_overrides=["gpu.count=2"])
    lay = Layout(2, template=True)
    b = PlanBuilder("none", NoneKnobs(), job, template=lay.rank_template)
    b.stream("gpu0.compute", "gpu0", "compute")
    b.stream("dp.grad", "gpu0", "comm")
    b.segment("s", 1)
    b.task("fwd0.gpu0", "compute", "gpu0.compute", flops=1.0)
    b.task("red0", "collective", "dp.grad", ["fwd0.gpu0", "fwd0.gpu1"], coll="all_reduce", bytes=8.0,
           ranks=("gpu0", "gpu1"))
    b.task("bad", "collective", "dp.grad", ["fwd9.gpu1"], coll="all_reduce", bytes=8.0, ranks=("gpu0", "gpu1"))
    plan = b.build(steps=1)
    red, bad = plan.segments[0].tasks[1:]
    assert [d.id for d in red.deps] == ["fwd0.gpu0"]
    assert [d.id for d in bad.deps] == ["fwd9.gpu1"]
    with pytest.raises(PlanError, match="fwd9.gpu1"):
        validate_plan(plan)


def test_cli_simulate_writes_the_full_plan_and_answers_alike(tmp_path: Any, capsys: pytest.CaptureFixture) -> None:
    """``simulate`` simulates a template; with ``--plan-out`` it builds, writes and simulates the full plan, and
    the figures are the same."""
    args = ["simulate", "--hw", "a100x8", "--set", "gpu.count=4", "--model", "gpt2", "--policy", "zero-offload",
            "--json"]
    assert main(args) == 0
    a = json.loads(capsys.readouterr().out)
    out = tmp_path / "p.json"
    assert main([*args, "--plan-out", str(out)]) == 0
    b = json.loads(capsys.readouterr().out)
    assert not _close(a, b)
    saved = json.loads(out.read_text())
    assert {t["stream"] for s in saved["segments"] for t in s["tasks"]} >= {"gpu3.compute", "cpu.adam3"}


def test_search_with_templates_answers_as_with_full_plans() -> None:
    """The planner builds templates unless it keeps the best plan (to write or export it: the full plan); both
    searches rank every candidate alike, with the same bounds and simulated steps."""
    from planner.search import search

    kw = {"hw": "a100x8", "model": "gpt2", "request": JobRequest(seq_len=512), "hw_overrides": ("gpu.count=4",),
          "policies": ("none", "zero-offload")}
    tpl, full = search(**kw), search(**kw, keep_best_plan=True)  # type: ignore[arg-type]
    assert tpl.best is not None and full.best is not None and full.best.plan is not None
    assert full.best.plan.template is None
    assert tpl.best.index == full.best.index and tpl.best.step_time_s == full.best.step_time_s
    assert [(e.index, e.step_time_s) for e in tpl.ranked] == [(e.index, e.step_time_s) for e in full.ranked]
    def seen(e: Any) -> tuple:
        return e.index, e.feasible, e.reason, e.step_time_s, e.peak_bytes, e.bound_time_s, e.bound_resource

    assert [seen(e) for e in tpl.evaluated] == [seen(e) for e in full.evaluated]
    for a, b in zip(full.evaluated, tpl.evaluated, strict=True):
        assert b.bound_memory_bytes == pytest.approx(a.bound_memory_bytes, rel=1e-12)
