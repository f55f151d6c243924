"""Plan validation (static and at run time) and the JSON round trip.

Every error is a PlanError whose message is one line naming the task (or tensor, stream, field) and the
missing piece.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from engine_helpers import GB, WORKLOAD, compute, copy, hw, noop, one_link, place, plan, refs, run, tensor

from simulator import PLAN_SCHEMA, PLAN_VERSION, Plan, PlanError, Segment, StreamSpec, TaskSpec, validate_plan
from simulator.simulate import simulate_plan

STREAMS = [("gpu0.h2d", "gpu0", "h2d"), ("gpu0.compute", "gpu0", "compute"), ("cpu.optim", "cpu", "optim"),
           ("gpu0.comm", "gpu0", "comm")]
LOCATIONS = ("gpu0", "cpu")


def _error(p: Plan, locations: tuple[str, ...] | None = LOCATIONS) -> str:
    with pytest.raises(PlanError) as e:
        validate_plan(p, "plan", locations)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def _one(task: TaskSpec, tensors: tuple = ()) -> Plan:  # noqa: ANN001
    return plan([noop("first", "gpu0.h2d"), task], STREAMS, tensors=tensors)


def _good() -> Plan:
    """A plan using every field, valid on ``one_link``."""
    micro = [copy("h", "gpu0.h2d", "cpu", "gpu0", 1, deps=["c@1"], tags={"layer": 3, "phase": "fwd"}),
             compute("c", "gpu0.compute", 1e12, deps=["h"], hbm_gb=2, allocs=(place("act", "gpu0"),),
                     reads=(place("w", "cpu"),), frees=(place("act", "gpu0"),))]
    opt = [TaskSpec("o", "optimizer", "cpu.optim", refs(["c"]), params=1e9, tags={"phase": "optimizer"}),
           TaskSpec("m", "copy", "gpu0.h2d", refs(["o", "m^1"]), tensor=refs(["w"])[0], src="cpu", dst="gpu0",
                    alloc_dst=True),
           noop("f", "gpu0.h2d", deps=["m"], frees=(place("w", "gpu0"),)),
           TaskSpec("ar", "collective", "gpu0.comm", refs(["f"]), bytes=2 * GB, coll="all_reduce", ranks=("gpu0",))]
    return replace(plan([], STREAMS, tensors=[tensor("act", 2, scope="iteration", layer=3),
                                              tensor("w", 1, "param16", home="cpu", persistent=True)],
                        segments=[("micro", 3, micro), ("opt", 1, opt)], steps=2),
                   knobs={"k": 1}, metrics={"n_gpus": 1.0}, notes=("a note",),
                   info={"x": [1, 2]})


def test_the_reference_plan_is_valid_and_runs() -> None:
    p = _good()
    validate_plan(p, "plan", LOCATIONS)
    res = run(p, one_link(10), extrapolate=False)
    assert len(res.records) == 2 * (3 * 2 + 4)


# -- static validation --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("task", "needles"), [
    (noop("t", "gpu0.h2d", allocs=(place("nope", "gpu0"),)), ("'t'", "missing tensor 'nope'")),
    (noop("t", "gpu0.h2d", frees=(place("nope", "gpu0"),)), ("'t'", "missing tensor 'nope'")),
    (noop("t", "gpu0.h2d", reads=(place("nope", "gpu0"),)), ("'t'", "missing tensor 'nope'")),
    (TaskSpec("t", "copy", "gpu0.h2d", tensor=refs(["nope"])[0], src="cpu", dst="gpu0"), ("'t'", "'nope'")),
    (noop("t", "gpu0.nowhere"), ("'t'", "stream 'gpu0.nowhere'")),
    (noop("t", "gpu0.h2d", deps=["ghost"]), ("'t'", "missing task 'ghost'")),
    (noop("t", "gpu0.h2d", deps=["t"]), ("'t'", "itself")),
    (TaskSpec("t", "matmul", "gpu0.compute"), ("'t'", "op 'matmul'")),
    (TaskSpec("t", "copy", "gpu0.h2d", bytes=GB, dst="gpu0"), ("'t'", "'src' and 'dst'")),
    (TaskSpec("t", "copy", "gpu0.h2d", bytes=GB, src="cpu"), ("'t'", "'src' and 'dst'")),
    (TaskSpec("t", "copy", "gpu0.h2d", src="cpu", dst="gpu0"), ("'t'", "'bytes'")),
    (TaskSpec("t", "copy", "gpu0.h2d", bytes=-GB, src="cpu", dst="gpu0"), ("'t'", "bytes")),
    (TaskSpec("t", "copy", "gpu0.h2d", bytes=GB, src="cpu", dst="disk"), ("'t'", "'disk'")),
    (noop("t", "gpu0.h2d", allocs=(place("x", "hbm7"),)), ("'t'", "'hbm7'")),
    (compute("t", "gpu0.compute", -1.0), ("'t'", "flops")),
    (compute("t", "gpu0.compute", hbm_gb=-1.0), ("'t'", "hbm_bytes")),
    (TaskSpec("t", "optimizer", "cpu.optim"), ("'t'", "'params'")),
    (TaskSpec("t", "optimizer", "cpu.optim", params=-5.0), ("'t'", "'params'")),
    (TaskSpec("t", "collective", "gpu0.comm", bytes=GB, coll="broadcast", ranks=("gpu0",)), ("'t'", "'broadcast'")),
    (TaskSpec("t", "collective", "gpu0.comm", bytes=GB, coll="all_reduce"), ("'t'", "'ranks'")),
    (TaskSpec("t", "collective", "gpu0.comm", bytes=GB, coll="all_reduce", ranks=("gpu0", "gpu9")),
     ("'t'", "gpu9")),
    (TaskSpec("t", "collective", "gpu0.comm", bytes=-GB, coll="all_reduce", ranks=("gpu0",)), ("'t'", "bytes")),
    (TaskSpec("t", "copy", "gpu0.h2d", bytes=float("nan"), src="cpu", dst="gpu0"), ("'t'", "bytes")),
    (compute("t", "gpu0.compute", float("nan")), ("'t'", "flops")),
    (compute("t", "gpu0.compute", 1.0, tags={"phase": "act-offload"}), ("'t'", "tag 'phase'", "activation-offload")),
])
def test_a_bad_task_is_named_with_its_missing_piece(task: TaskSpec, needles: tuple[str, ...]) -> None:
    msg = _error(_one(task, tensors=(tensor("x", 1),)))
    for n in needles:
        assert n in msg, msg


def test_a_dependency_on_a_later_segment_needs_a_caret() -> None:
    segs = [("a", 1, [noop("t", "gpu0.h2d", deps=["u"])]), ("b", 1, [noop("u", "gpu0.h2d")])]
    msg = _error(plan([], STREAMS, segments=segs))
    assert "'t'" in msg and "'u'" in msg and "u^1" in msg
    validate_plan(plan([], STREAMS, segments=[("a", 1, [noop("t", "gpu0.h2d", deps=["u^1"])]), segs[1]]))


def test_looking_back_iterations_of_another_segment_is_an_error() -> None:
    segs = [("a", 2, [noop("u", "gpu0.h2d")]), ("b", 1, [noop("t", "gpu0.h2d", deps=["u@1"])])]
    msg = _error(plan([], STREAMS, segments=segs))
    assert "'t'" in msg and "u@1" in msg


@pytest.mark.parametrize(("tensor_spec", "needle"), [
    (tensor("x", -1), "bytes must be finite and >= 0"),
    (tensor("x", float("nan")), "bytes must be finite and >= 0"),
    (tensor("x", float("inf")), "bytes must be finite and >= 0"),
    (tensor("x", 1, kind="weights"), "kind 'weights'"),
    (tensor("x", 1, scope="epoch"), "scope 'epoch'"),
    (tensor("x", 1, scope="step", home="cpu"), "only global tensors"),
    (tensor("x", 1, home="disk"), "home 'disk'"),
])
def test_a_bad_tensor_is_named(tensor_spec: object, needle: str) -> None:
    msg = _error(plan([noop("t", "gpu0.h2d")], STREAMS, tensors=[tensor_spec]))  # type: ignore[list-item]
    assert "tensor 'x'" in msg and needle in msg, msg


def test_bad_streams_segments_and_steps() -> None:
    assert "stream 's'" in _error(plan([], [("s", "gpu0", "dma")], segments=[("m", 1, [])]))
    assert "device 'gpu5'" in _error(plan([], [("s", "gpu5", "h2d")], segments=[("m", 1, [])]))
    assert "repeat" in _error(plan([], STREAMS, segments=[("m", 0, [noop("t", "gpu0.h2d")])]))
    assert "'steps'" in _error(plan([noop("t", "gpu0.h2d")], STREAMS, steps=0))
    assert "duplicate task" in _error(plan([noop("t", "gpu0.h2d"), noop("t", "gpu0.h2d")], STREAMS))
    assert "duplicate tensor" in _error(plan([], STREAMS, tensors=[tensor("x", 1), tensor("x", 2)],
                                             segments=[("m", 1, [])]))
    assert "duplicate stream" in _error(plan([], [*STREAMS, STREAMS[0]], segments=[("m", 1, [])]))


def test_locations_are_checked_against_the_hardware_when_simulated() -> None:
    p = _one(TaskSpec("t", "copy", "gpu0.h2d", bytes=GB, src="cpu", dst="nvme"))
    validate_plan(p)  # no hardware given: locations are not known yet
    with pytest.raises(PlanError, match=r"task 't'.*'nvme'"):
        simulate_plan(p, hw(), topology=one_link(10))


# -- references ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["x@", "x^", "x@1@2", "x^a", "@1", ""])
def test_malformed_references(text: str) -> None:
    d = _one(noop("t", "gpu0.h2d")).to_dict()
    d["segments"][0]["tasks"][1]["deps"] = [text]
    with pytest.raises(PlanError, match="malformed reference") as e:
        Plan.from_dict(d)
    assert "'t'" in str(e.value)


# -- JSON ------------------------------------------------------------------------------------------------------
def test_to_dict_from_dict_round_trip() -> None:
    p = _good()
    d = p.to_dict()
    assert (d["schema"], d["version"]) == (PLAN_SCHEMA, PLAN_VERSION)
    q = Plan.from_dict(json.loads(json.dumps(d)))
    assert q == p
    assert q.to_dict() == d


def test_save_and_load(tmp_path: Path) -> None:
    p = _good()
    path = tmp_path / "plan.json"
    p.save(path)
    assert Plan.load(path) == p
    assert json.loads(path.read_text())["segments"][0]["tasks"][0]["deps"] == ["c@1"]


def test_defaults_are_left_out_of_the_json() -> None:
    d = _one(noop("t", "gpu0.h2d")).to_dict()
    assert d["segments"][0]["tasks"][1] == {"id": "t", "op": "noop", "stream": "gpu0.h2d"}


def test_malformed_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n "schema": "tiersim.plan",\n "version": 1,,\n "policy": "x"\n}\n')
    with pytest.raises(PlanError, match=r"bad\.json: line 3, column 15: malformed JSON") as e:
        Plan.load(path)
    assert "\n" not in str(e.value)


def test_a_missing_file_is_a_plan_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read plan"):
        Plan.load(tmp_path / "absent.json")


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("schema", "tiersim.result", "'schema' must be 'tiersim.plan'"),
    ("version", 99, "'version' is 99"),
    ("version", None, "'version' is None"),
])
def test_wrong_schema_or_version(field: str, value: object, needle: str) -> None:
    d = _good().to_dict()
    d[field] = value
    with pytest.raises(PlanError, match=needle):
        Plan.from_dict(d)


def test_missing_and_malformed_fields() -> None:
    d = _good().to_dict()
    del d["tensors"]
    with pytest.raises(PlanError, match="missing field 'tensors'"):
        Plan.from_dict(d)
    d = _good().to_dict()
    del d["segments"][0]["tasks"][0]["stream"]
    with pytest.raises(PlanError, match="missing field 'stream'"):
        Plan.from_dict(d)
    d = _good().to_dict()
    d["segments"][0]["tasks"][0]["bytes"] = "lots"
    with pytest.raises(PlanError, match="malformed plan"):
        Plan.from_dict(d)
    with pytest.raises(PlanError, match="JSON object"):
        Plan.from_dict([1, 2])  # type: ignore[arg-type]
    d = _good().to_dict()
    d["segments"][0]["tasks"][1]["allocs"] = [["act"]]
    with pytest.raises(PlanError, match=r"'c'.*\[tensor, location\] pairs"):
        Plan.from_dict(d)


# -- what the plan was made for: typed, complete, never guessed ------------------------------------------------
def _load_error(d: dict) -> str:
    with pytest.raises(PlanError) as e:
        Plan.from_dict(d, where="p.json")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("p.json")
    return msg


def _without(d: dict, *path: str) -> dict:
    node = d
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return d


def test_the_workload_and_hardware_load_as_typed_values() -> None:
    p = Plan.from_dict(json.loads(json.dumps(_good().to_dict())))
    assert p.workload == WORKLOAD and p.hardware == hw()
    assert p.workload.config.precision == "bf16" and p.workload.model.n_layers == 2


@pytest.mark.parametrize(("path", "needles"), [
    (("workload",), ("field 'workload' is missing", "re-create the plan")),
    (("hardware",), ("field 'hardware' is missing", "re-create the plan")),
    (("workload", "model"), ("field 'workload.model' is missing", "re-create the plan")),
    (("workload", "micro_batch"), ("field 'workload.micro_batch' is missing", "re-create the plan")),
    (("workload", "precision"), ("field 'workload.precision' is missing",)),
    (("workload", "provenance"), ("field 'workload.provenance' is missing",)),
    (("workload", "assumed"), ("field 'workload.assumed' is missing",)),
    (("workload", "model", "hidden"), ("'workload.model'", "missing field 'hidden'")),
])
def test_a_plan_missing_what_it_was_made_for_is_refused(path: tuple[str, ...], needles: tuple[str, ...]) -> None:
    msg = _load_error(_without(_good().to_dict(), *path))
    for needle in needles:
        assert needle in msg, (needle, msg)


@pytest.mark.parametrize(("change", "needles"), [
    ({"precision": "fp8"}, ("'workload'", "precision", "'fp8'")),
    ({"micro_batch": 0}, ("'workload'", "micro_batch")),
    ({"batch": 4}, ("'workload.batch' is not a workload field", "remove it")),
    ({"provenance": ""}, ("'workload.provenance'", "non-empty string")),
    ({"assumed": "none"}, ("'workload.assumed'", "list of strings")),
    ({"model": [1, 2]}, ("'workload.model'", "object of model dimensions")),
])
def test_a_malformed_workload_is_refused_with_its_field(change: dict, needles: tuple[str, ...]) -> None:
    d = _good().to_dict()
    d["workload"].update(change)
    msg = _load_error(d)
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_a_stale_parameter_count_is_refused_and_a_bad_hardware_names_its_field() -> None:
    d = _good().to_dict()
    d["workload"]["model"]["params"] += 1
    assert "'workload.model.params'" in _load_error(d)
    d = _good().to_dict()
    d["workload"] = []
    assert "field 'workload' must be an object" in _load_error(d)
    d = _good().to_dict()
    d["hardware"]["gpu"]["memory"] = -5
    msg = _load_error(d)
    assert "(embedded hardware)" in msg and "gpu.memory" in msg


# -- the run-time plan checker -----------------------------------------------------------------------------------
def _runtime_error(tasks: list[TaskSpec], tensors: list = ()) -> str:  # noqa: ANN001
    p = plan(tasks, STREAMS, tensors=tensors)
    validate_plan(p, "plan", LOCATIONS)  # statically fine
    with pytest.raises(PlanError) as e:
        simulate_plan(p, hw(), topology=one_link(10))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_reading_a_tensor_that_is_not_resident() -> None:
    msg = _runtime_error([compute("c", "gpu0.compute", 1e12, reads=(place("w", "gpu0"),))],
                         [tensor("w", 1, "param16", home="cpu")])
    assert "task 'c[s0.0]'" in msg and "'w'" in msg and "'gpu0'" in msg


def test_reading_a_tensor_after_it_was_freed() -> None:
    msg = _runtime_error([noop("a", "gpu0.h2d", allocs=(place("x", "gpu0"),)),
                          noop("f", "gpu0.h2d", frees=(place("x", "gpu0"),)),
                          compute("c", "gpu0.compute", 1e12, deps=["f"], reads=(place("x", "gpu0"),))],
                         [tensor("x", 1)])
    assert "task 'c[s0.0]'" in msg and "not there" in msg


def test_copying_a_tensor_from_where_it_is_not() -> None:
    msg = _runtime_error([TaskSpec("m", "copy", "gpu0.h2d", tensor=refs(["w"])[0], src="gpu0", dst="cpu")],
                         [tensor("w", 1, "param16", home="cpu")])
    assert "task 'm[s0.0]'" in msg and "'w'" in msg


def test_freeing_what_is_not_there_and_allocating_twice() -> None:
    msg = _runtime_error([noop("f", "gpu0.h2d", frees=(place("x", "gpu0"),))], [tensor("x", 1)])
    assert "task 'f[s0.0]'" in msg and "not resident" in msg
    msg = _runtime_error([noop("a", "gpu0.h2d", allocs=(place("x", "gpu0"),)),  # freed by c: no static leak
                          noop("b", "gpu0.h2d", allocs=(place("x", "gpu0"),)),
                          noop("c", "gpu0.h2d", frees=(place("x", "gpu0"),))], [tensor("x", 1)])
    assert "task 'b[s0.0]'" in msg and "already" in msg


def test_compute_on_a_location_that_is_not_a_gpu() -> None:
    p = plan([compute("c", "cpu.compute", 1e12)], [("cpu.compute", "cpu", "compute")])
    with pytest.raises(PlanError, match=r"task 'c\[s0\.0\]': compute on 'cpu'"):
        simulate_plan(p, hw(), topology=one_link(10))


def test_a_dependency_on_a_later_task_of_the_same_stream_deadlocks() -> None:
    msg = _runtime_error([noop("a", "gpu0.h2d", deps=["b"]), noop("b", "gpu0.h2d")])
    assert msg.startswith("deadlock") and "'a[s0.0]'" in msg and "'b[s0.0]'" in msg


def test_a_dependency_cycle_across_streams_deadlocks() -> None:
    msg = _runtime_error([noop("a", "gpu0.h2d", deps=["b"]), noop("b", "gpu0.compute", deps=["a"])])
    assert msg.startswith("deadlock")


def test_plans_compare_by_value() -> None:
    # StreamSpec and Segment are plain values: equal plans compare equal, a changed one does not
    p = _good()
    q = replace(p, streams=(*p.streams[:-1], StreamSpec("gpu0.comm", "gpu0", "copy")))
    assert q != p and Plan.from_dict(q.to_dict()) == q
    assert replace(p, segments=(*p.segments[:-1], Segment("opt", 2, p.segments[-1].tasks))) != p


def test_a_deps_string_or_fractional_repeat_is_rejected_not_coerced() -> None:
    from simulator import Plan, PlanError

    base = {**_good().to_dict(), "tensors": [], "streams": [{"id": "s", "device": "gpu0", "kind": "compute"}]}
    with pytest.raises(PlanError, match="expected a list of task ids"):
        Plan.from_dict({**base, "segments": [{"name": "m", "repeat": 1, "tasks": [
            {"id": "a", "op": "noop", "stream": "s"}, {"id": "b", "op": "noop", "stream": "s", "deps": "a"}]}]})
    with pytest.raises(PlanError, match="'repeat': expected a whole number"):
        Plan.from_dict({**base, "segments": [{"name": "m", "repeat": 2.5, "tasks": []}]})
