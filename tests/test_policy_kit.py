"""The policy kit (``policies.kit``): exact tasks of its mechanisms on a 2-layer model over 2 GPUs."""

from __future__ import annotations

import dataclasses

import pytest

from policies.base import Job, KnobError
from policies.builder import PlanBuilder
from policies.kit import (
    Grads,
    Layout,
    UseOrder,
    bucket_gate,
    check_tp,
    cpu_update_by_layer,
    declare_streams,
    emit_microstep,
    read_ahead,
    saved_activation_bytes,
    sliced_fetch,
    tags,
)
from simulator import TaskSpec
from simulator.phase import Phase
from tiersim.api import JobRequest, make_job
from workloads.model import load_model


def two_layer_job(checkpointing: str = "full", gpus: int = 2) -> Job:
    """gpt2 cut to 2 blocks (trace: embedding, block0, block1, head) on ``gpus`` A100s, one micro-step."""
    model = dataclasses.replace(load_model("gpt2"), n_layers=2)
    job, _ = make_job("a100x8", model, JobRequest(seq_len=128, global_batch=gpus, checkpointing=checkpointing),
                      hw_overrides=[f"gpu.count={gpus}"])
    return job


def tasks_of(b: PlanBuilder) -> list[TaskSpec]:
    return [t for _, _, tasks in b._segments for t in tasks]


def microstep(job: Job, lay: Layout, grads: Grads, *, gather: bool = False) -> PlanBuilder:
    b = PlanBuilder("kit-test", None, job)
    declare_streams(b, lay, cpu_adam=grads.offload)
    b.segment("micro-steps", 1)
    emit_microstep(b, job, lay, grads, gather_params=gather, param_ready={})
    return b


def brief(t: TaskSpec) -> tuple[str, list[str], str, str]:
    return t.id, [str(d) for d in t.deps], t.stream, str(t.tags["phase"])


def test_offload_microstep_emits_exactly_these_tasks_with_a_two_bucket_gate() -> None:
    job = two_layer_job()
    b = microstep(job, Layout(2), Grads(reduce="reduce_scatter", bucket=True, offload=True, buckets_in_flight=2))
    want: list[tuple[str, list[str], str, str]] = [
        (f"fwd{i}.gpu{r}", [], f"gpu{r}.compute", "fwd") for i in range(4) for r in range(2)]
    gate = {3: "d2h1.{g}@1", 2: "d2h0.{g}@1", 1: "d2h3.{g}", 0: "d2h2.{g}"}  # two buckets back, across steps
    # each bucket is released on the compute stream once its copy has drained: the one two back before a layer's
    # recomputation and backward, the last two after the micro-step's last backward (kit.release_buckets)
    released = {3: [], 2: [], 1: [3], 0: [2], None: [1, 0]}

    def releases(i: int | None) -> list[tuple[str, list[str], str, str]]:
        return [(f"gfree{o}.gpu{r}", [f"d2h{o}.gpu{r}"], f"gpu{r}.compute", "grad-release")
                for o in released[i] for r in range(2)]

    for i in (3, 2, 1, 0):
        want += releases(i)
        if i in (1, 2):  # blocks recompute under full checkpointing
            want += [(f"rc{i}.gpu{r}", [], f"gpu{r}.compute", "recompute") for r in range(2)]
        want += [(f"bwd{i}.gpu{r}", [gate[i].format(g=f"gpu{r}")], f"gpu{r}.compute", "bwd") for r in range(2)]
        want += [(f"red{i}.d0", [f"bwd{i}.gpu0", f"bwd{i}.gpu1"], "dp0.grad", "grad-reduce")]
        want += [(f"d2h{i}.gpu{r}", [f"red{i}.d0"], f"gpu{r}.d2h", "grad-offload") for r in range(2)]
    want += releases(None)
    assert [brief(t) for t in tasks_of(b)] == want
    d2h_frees = [t.frees for t in tasks_of(b) if t.id.startswith("d2h")]
    assert d2h_frees and not any(d2h_frees)  # a copy frees nothing: its bucket goes in the compute order
    assert list(b._streams) == ["gpu0.compute", "gpu0.h2d", "gpu0.d2h", "cpu.adam0", "gpu1.compute", "gpu1.h2d",
                                "gpu1.d2h", "cpu.adam1", "dp0.grad", "dp0.param"]


@pytest.mark.parametrize("buckets,gates", [
    (1, {3: "d2h0.gpu0@1", 2: "d2h3.gpu0", 1: "d2h2.gpu0", 0: "d2h1.gpu0"}),
    (3, {3: "d2h2.gpu0@1", 2: "d2h1.gpu0@1", 1: "d2h0.gpu0@1", 0: "d2h3.gpu0"}),
    (0, {3: None, 2: None, 1: None, 0: None}),
])
def test_the_bucket_gate_holds_each_backward_until_the_bucket_buckets_in_flight_back_has_drained(
        buckets: int, gates: dict[int, str | None]) -> None:
    job = two_layer_job(checkpointing="none")
    b = microstep(job, Layout(2), Grads(reduce="reduce_scatter", bucket=True, offload=True,
                                        buckets_in_flight=buckets))
    deps = {t.id: [str(d) for d in t.deps] for t in tasks_of(b)}
    for i, gate in gates.items():
        assert deps[f"bwd{i}.gpu0"] == ([gate] if gate else [])


def test_bucket_gate_over_a_subset_of_layers_and_with_fewer_buckets_than_the_window() -> None:
    order = [5, 3, 2]  # layers holding a bucket, backward order
    drained = "gd{}.gpu0".format
    assert bucket_gate(order, 5, 2, drained) == ["gd3.gpu0@1"]  # the previous micro-step's second-to-last
    assert bucket_gate(order, 3, 2, drained) == ["gd2.gpu0@1"]
    assert bucket_gate(order, 2, 2, drained) == ["gd5.gpu0"]
    assert bucket_gate([1, 0], 1, 3, drained) == []  # three back is two micro-steps back: not gated
    assert bucket_gate([1, 0], 0, 3, drained) == ["gd1.gpu0@1"]


def test_all_reduce_without_bucket_needs_no_release_and_a_single_rank_bucket_is_folded() -> None:
    job = two_layer_job(checkpointing="none")
    b = microstep(job, Layout(2), Grads(reduce="all_reduce", bucket=False, offload=False))
    red = [t for t in tasks_of(b) if t.tags["phase"] == Phase.GRAD_REDUCE]
    assert [(t.id, t.coll, t.frees) for t in red] == [(f"red{i}.d0", "all_reduce", ()) for i in (3, 2, 1, 0)]
    one = two_layer_job(checkpointing="none", gpus=1)
    b1 = microstep(one, Layout(1), Grads(reduce="reduce_scatter", bucket=True, offload=False))
    acc = [t for t in tasks_of(b1) if t.op == "free"]
    assert [(t.id, t.tags["phase"]) for t in acc] == [(f"acc{i}.gpu0", Phase.GRAD_ACCUMULATE) for i in (3, 2, 1, 0)]


def test_zero3_gathers_each_layer_one_layer_ahead_in_both_directions() -> None:
    job = two_layer_job(checkpointing="none")
    b = microstep(job, Layout(2), Grads(reduce="reduce_scatter", bucket=True, offload=False), gather=True)
    ag = {t.id: [str(d) for d in t.deps] for t in tasks_of(b) if t.tags["phase"] == Phase.PARAM_GATHER}
    assert ag == {"agf0.d0": [], "agf1.d0": [], "agf2.d0": ["fwd0.gpu0", "fwd0.gpu1"],
                  "agf3.d0": ["fwd1.gpu0", "fwd1.gpu1"], "agb3.d0": ["fwd3.gpu0", "fwd3.gpu1"],
                  "agb2.d0": ["fwd3.gpu0", "fwd3.gpu1"], "agb1.d0": ["bwd3.gpu0", "bwd3.gpu1"],
                  "agb0.d0": ["bwd2.gpu0", "bwd2.gpu1"]}
    with pytest.raises(ValueError, match="more than one data-parallel rank"):
        microstep(two_layer_job(gpus=1), Layout(1), Grads(reduce="reduce_scatter", bucket=True, offload=False),
                  gather=True)


def test_tensor_parallel_layout_groups_streams_and_syncs() -> None:
    lay = Layout(4, 2)
    assert (lay.dp, lay.tp_group(1), lay.dp_group(1), lay.tp_index(3)) == (2, ["gpu2", "gpu3"], ["gpu1", "gpu3"],
                                                                          (1, 1))
    assert (lay.dp_stream(1, "grad"), lay.dp_suffix(1)) == ("dp1.grad", ".d1")
    assert (Layout(4, flat_comm=True).dp_stream(0, "param"), Layout(4, flat_comm=True).dp_suffix(0)) == ("dp.param", "")
    job = two_layer_job(checkpointing="none", gpus=4)
    b = microstep(job, lay, Grads(reduce="all_reduce", bucket=False, offload=False))
    tp = [(t.id, [str(d) for d in t.deps], t.tags["phase"]) for t in tasks_of(b) if t.id.startswith("tpf1")]
    assert tp == [("tpf1a.k0", ["fwd1a.gpu0", "fwd1a.gpu1"], Phase.TP_FWD),
                  ("tpf1a.k1", ["fwd1a.gpu2", "fwd1a.gpu3"], Phase.TP_FWD),
                  ("tpf1.k0", ["fwd1.gpu0", "fwd1.gpu1", "tpf1a.k0"], Phase.TP_FWD),
                  ("tpf1.k1", ["fwd1.gpu2", "fwd1.gpu3", "tpf1a.k1"], Phase.TP_FWD)]
    fwd2 = {t.id: t for t in tasks_of(b) if t.id in ("fwd2a.gpu3", "fwd2.gpu3")}
    assert [str(d) for d in fwd2["fwd2a.gpu3"].deps] == ["tpf1.k1"]
    assert fwd2["fwd2a.gpu3"].flops + fwd2["fwd2.gpu3"].flops == pytest.approx(job.trace.layers[2].fwd_flops / 2)
    with pytest.raises(KnobError, match="must divide the GPU count"):
        check_tp(job, 3, "p")


def test_saved_activations_split_by_korthikanti_ratio() -> None:
    job = two_layer_job(checkpointing="none")
    assert saved_activation_bytes(job, 34.0, "block", 2) == pytest.approx(10 + 24 / 2)
    assert saved_activation_bytes(job, 34.0, "head", 2) == 34.0
    assert saved_activation_bytes(two_layer_job(), 34.0, "block", 2) == 34.0  # full checkpointing: the input


def test_cpu_update_by_layer_runs_adam_then_upload_then_gather_per_layer() -> None:
    job = two_layer_job(checkpointing="none")
    lay = Layout(2)
    b = PlanBuilder("kit-test", None, job)
    declare_streams(b, lay, cpu_adam=True)
    b.segment("optimizer", 1)
    cpu_update_by_layer(b, job, lay, upload_bytes_per_param=2.0, staged=False, first_deps={0: ["x"], 1: ["y"]})
    got = [brief(t) for t in tasks_of(b)][:5]
    assert got == [("adam0.r0", ["x"], "cpu.adam0", "optimizer"),
                   ("up0.gpu0", ["adam0.r0"], "gpu0.h2d", "param-upload"),
                   ("adam0.r1", ["y"], "cpu.adam1", "optimizer"),
                   ("up0.gpu1", ["adam0.r1"], "gpu1.h2d", "param-upload"),
                   ("ag0.d0", ["up0.gpu0", "up0.gpu1"], "dp0.param", "param-gather")]


def test_use_order_prefetch_window_reaches_into_the_previous_micro_step() -> None:
    uo = UseOrder(3, sfx=".last")
    assert uo.uses == [(0, "f"), (1, "f"), (2, "f"), (2, "b"), (1, "b"), (0, "b")]
    assert uo.window(4, 1, ["gpu0", "gpu1"]) == ["fwd2.last.gpu0", "fwd2.last.gpu1"]
    assert uo.window(5, 0, ["gpu0"]) == ["bwd1.last.gpu0"]
    assert uo.window(1, 2, ["gpu0"]) == ["bwd1.gpu0@1"]
    assert UseOrder(3, prev=lambda x: None).window(0, 0, ["gpu0"]) == []


def test_read_ahead_and_tags() -> None:
    assert [read_ahead(k, 2, "ow{}.r0") for k in range(4)] == [[], [], ["ow0.r0"], ["ow1.r0"]]
    assert tags(Phase.PARAM_UPLOAD, layer=3, rank=1, use="bwd", extra={"chunk": 0}) == {
        "phase": Phase.PARAM_UPLOAD, "layer": 3, "rank": 1, "use": "bwd", "chunk": 0}


def test_sliced_fetch_uploads_each_ranks_slice_then_gathers_the_layer() -> None:
    job = two_layer_job(checkpointing="none")
    b = PlanBuilder("kit-test", None, job)
    declare_streams(b, Layout(2, flat_comm=True), comm_order=("param", "grad"))
    b.segment("micro-steps", 1)
    ready = sliced_fetch(b, ["gpu0", "gpu1"], 1, "b", 5.0, 10.0, lambda r, g: [f"w{r}"], sfx=".last",
                         gather_deps=["bwd3.last.gpu0"])
    assert ready == {"gpu0": "agb1.last", "gpu1": "agb1.last"}
    up0, up1, ag = tasks_of(b)
    assert (up0.id, [str(d) for d in up0.deps], up0.stream, up0.src, up0.dst, up0.bytes) == (
        "upb1.last.gpu0", ["w0"], "gpu0.h2d", "cpu", "gpu0", 5.0)
    assert [(str(p.tensor), p.loc) for p in up1.allocs] == [("psb1.gpu1", "gpu1")]
    assert up1.tags == {"phase": Phase.PARAM_UPLOAD, "layer": 1, "rank": 1, "use": "bwd"}
    assert (ag.id, [str(d) for d in ag.deps], ag.stream, ag.coll, ag.bytes, ag.ranks) == (
        "agb1.last", ["upb1.last.gpu0", "upb1.last.gpu1", "bwd3.last.gpu0"], "dp.param", "all_gather", 10.0,
        ("gpu0", "gpu1"))
    assert [(str(p.tensor), p.loc) for p in ag.frees] == [("psb1.gpu0", "gpu0"), ("psb1.gpu1", "gpu1")]
    assert [(str(p.tensor), p.loc) for p in ag.allocs] == [("pgb1.gpu0", "gpu0"), ("pgb1.gpu1", "gpu1")]
    one = PlanBuilder("kit-test", None, job)
    one.segment("micro-steps", 1)
    assert sliced_fetch(one, ["gpu0"], 1, "f", 10.0, 10.0, lambda r, g: []) == {"gpu0": "upf1.gpu0"}
    assert [(str(p.tensor), p.loc) for p in tasks_of(one)[0].allocs] == [("pgf1.gpu0", "gpu0")]


def test_bucket_gate_names_the_previous_micro_step_as_the_policy_says() -> None:
    order = [5, 3, 2]
    current = "gd{}.last.gpu0".format  # this micro-step's ids carry a suffix; the previous one's do not
    assert bucket_gate(order, 2, 1, current, "gd{}.gpu0".format) == ["gd3.last.gpu0"]
    assert bucket_gate(order, 5, 1, current, "gd{}.gpu0".format) == ["gd2.gpu0"]
    assert bucket_gate(order, 5, 1, current, lambda o: None) == []  # no previous micro-step in this step
