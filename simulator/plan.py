"""The Plan: an explicit task graph that a policy emits and the simulator (or the torch runner) executes.

A plan is JSON, versioned (``schema`` = ``tiersim.plan``, ``version`` = PLAN_VERSION) and validated on load.

Structure
---------
- ``tensors``: every piece of memory the plan allocates (id, bytes, kind, layer, scope, home).
  ``home`` is a location ("gpu0", "cpu", "nvme", ...) where the tensor is resident when the run starts.
  ``scope`` says how often a tensor exists: ``global`` (once), ``step`` (one instance per training step) or
  ``iteration`` (one instance per iteration of a repeated segment, e.g. a micro-batch's activations).
- ``hardware`` and ``workload``: what the plan was made for, loaded as typed values (``HardwareSpec``
  through the hardware loader, :class:`~simulator.plan_workload.PlanWorkload`: model, batch geometry,
  precision); a plan file without either, or with an incomplete one, is refused.
- ``streams``: in-order queues (id, device location, kind). Tasks on one stream run in plan order, as CUDA
  streams do; ``deps`` cross streams.
- ``segments``: the body of one training step, as an ordered list of segments, each repeated ``repeat``
  times (e.g. ``micro-steps`` repeated once per gradient-accumulation micro-batch). The whole list runs
  ``steps`` times: all but the last are warm-up, the last is measured.
- A task's ``deps`` name other tasks. ``"x"`` is task ``x`` of the same iteration when ``x`` is in the same
  segment, or of the last iteration of an earlier segment of the same step. ``"x@k"`` is ``x`` ``k``
  iterations back in the same segment; ``"x^k"`` is ``x`` in the last iteration of its segment ``k`` steps
  back. References before the start of the run are dropped (they are satisfied by the initial state).
  Tensor references in ``allocs``/``frees``/``reads`` and a copy's ``tensor`` use the same syntax.

Ops
---
``compute`` (flops, hbm_bytes on a GPU), ``copy`` (bytes of ``tensor`` from ``src`` to ``dst`` location;
``alloc_dst``/``free_src`` make it a move), ``optimizer`` (``params`` updated on the stream's device),
``collective`` (``coll`` in all_gather | reduce_scatter | all_reduce of ``bytes`` over ``ranks``),
``alloc``/``free``/``noop`` (instantaneous). Every task may carry ``allocs`` (made when it starts),
``frees`` (made when it ends) and ``reads`` (tensors that must be resident where stated when it starts).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from hardware_models import HardwareSpec
from simulator.errors import PlanError
from simulator.phase import Phase
from simulator.plan_file import number_map, opt_text, opt_whole, read_plan_document, tags_of, text, text_list
from simulator.plan_workload import PlanWorkload, plan_hardware
from simulator.rank_template import RankTemplate

PLAN_SCHEMA = "tiersim.plan"
PLAN_VERSION = 1

TENSOR_KINDS = ("param16", "param32", "grad", "grad32", "optim", "activation", "checkpoint", "buffer")
SCOPES = ("global", "step", "iteration")
STREAM_KINDS = ("compute", "h2d", "d2h", "copy", "comm", "optim", "io")
OPS = ("compute", "copy", "optimizer", "collective", "alloc", "free", "noop")
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")

_REF = re.compile(r"^(?P<id>[^@^]+?)(?:@(?P<it>\d+))?(?:\^(?P<step>\d+))?$")


@dataclass(frozen=True)
class Ref:
    """A reference to a task or tensor: ``id``, ``iters_back`` iterations and ``steps_back`` steps back."""

    id: str
    iters_back: int = 0
    steps_back: int = 0

    @classmethod
    def parse(cls, text: str, where: str) -> Ref:
        if isinstance(text, str) and text and not ("@" in text or "^" in text or "\n" in text):
            # a plain id (what _REF matches as one), without the regex: plans hold millions; made as task_spec
            # makes a task (without the frozen dataclass's setattr per field), equal to cls(text)
            if cls is not Ref:
                return cls(text)
            r = object.__new__(Ref)
            d = r.__dict__
            d["id"], d["iters_back"], d["steps_back"] = text, 0, 0
            return r
        m = _REF.match(text) if isinstance(text, str) else None
        if not m:
            raise PlanError(f"{where}: malformed reference {text!r}; expected 'id', 'id@k' or 'id^k'")
        return cls(m["id"], int(m["it"] or 0), int(m["step"] or 0))

    def __str__(self) -> str:
        return self.id + (f"@{self.iters_back}" if self.iters_back else "") + (
            f"^{self.steps_back}" if self.steps_back else "")


@dataclass(frozen=True)
class Placement:
    """A tensor reference at a location (for allocs, frees and reads)."""

    tensor: Ref
    loc: str


@dataclass(frozen=True)
class TensorSpec:
    id: str
    bytes: float
    kind: str
    scope: str = "global"
    home: str | None = None
    layer: int | None = None
    persistent: bool = False  # may stay allocated at the end of a run without being a leak


@dataclass(frozen=True)
class StreamSpec:
    id: str
    device: str
    kind: str


@dataclass(frozen=True)
class TaskSpec:
    id: str
    op: str
    stream: str
    deps: tuple[Ref, ...] = ()
    flops: float = 0.0
    hbm_bytes: float = 0.0
    bytes: float = 0.0
    tensor: Ref | None = None
    src: str | None = None
    dst: str | None = None
    alloc_dst: bool = False
    free_src: bool = False
    params: float = 0.0
    coll: str | None = None
    ranks: tuple[str, ...] = ()
    allocs: tuple[Placement, ...] = ()
    frees: tuple[Placement, ...] = ()
    reads: tuple[Placement, ...] = ()
    tags: Mapping[str, Any] = field(default_factory=dict)


_SPEC_FIELDS = frozenset(f.name for f in fields(TaskSpec))
_SPEC_DEFAULTS = {f.name: f.default for f in fields(TaskSpec) if f.default is not MISSING}


def task_spec(id: str, op: str, stream: str, **kw: Any) -> TaskSpec:  # noqa: A002 - TaskSpec's own field name
    """``TaskSpec(id, op, stream, **kw)``, equal to it field for field, made without the frozen dataclass's
    ``object.__setattr__`` per field (twice as fast; a 1024-GPU plan has a quarter of a million tasks).
    An unknown field goes to the constructor, which refuses it."""
    if not _SPEC_FIELDS.issuperset(kw) or "id" in kw or "op" in kw or "stream" in kw:
        return TaskSpec(id, op, stream, **kw)
    t = object.__new__(TaskSpec)
    d = t.__dict__  # in field order, as the generated __init__ fills it
    d["id"], d["op"], d["stream"] = id, op, stream
    d.update(_SPEC_DEFAULTS)
    d["tags"] = {}
    d.update(kw)
    return t


@dataclass(frozen=True)
class Segment:
    name: str
    repeat: int
    tasks: tuple[TaskSpec, ...]


@dataclass(frozen=True)
class Plan:
    policy: str
    knobs: Mapping[str, Any]
    hardware: HardwareSpec
    workload: PlanWorkload
    tensors: tuple[TensorSpec, ...]
    streams: tuple[StreamSpec, ...]
    segments: tuple[Segment, ...]
    steps: int = 2
    metrics: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)
    # set: the tasks are rank 0's of a data-parallel plan of template.ranks ranks (simulator.rank_template)
    template: RankTemplate | None = None

    # -- derived views -------------------------------------------------------------------------------
    def tensor_map(self) -> dict[str, TensorSpec]:
        return {t.id: t for t in self.tensors}

    def stream_map(self) -> dict[str, StreamSpec]:
        return {s.id: s for s in self.streams}

    def task_segment(self) -> dict[str, int]:
        return {t.id: i for i, seg in enumerate(self.segments) for t in seg.tasks}

    def with_repeats(self, repeats: Mapping[str, int]) -> Plan:
        """The same plan with some segments' repeat counts changed (used for steady-state extrapolation)."""
        segs = tuple(Segment(s.name, repeats.get(s.name, s.repeat), s.tasks) for s in self.segments)
        return Plan(self.policy, self.knobs, self.hardware, self.workload, self.tensors, self.streams,
                    segs, self.steps, self.metrics, self.notes, self.info, self.template)

    # -- (de)serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        if self.template is not None:
            raise PlanError(f"a rank template of {self.template.ranks} ranks is not a plan to save or replay; "
                            "build the full plan (policies.job.make_plan without template)")
        return {
            "schema": PLAN_SCHEMA,
            "version": PLAN_VERSION,
            "policy": self.policy,
            "knobs": dict(self.knobs),
            "hardware": self.hardware.to_dict(),
            "workload": self.workload.to_dict(),
            "steps": self.steps,
            "metrics": dict(self.metrics),
            "notes": list(self.notes),
            "info": dict(self.info),
            "tensors": [_tensor_to_dict(t) for t in self.tensors],
            "streams": [{"id": s.id, "device": s.device, "kind": s.kind} for s in self.streams],
            "segments": [{"name": s.name, "repeat": s.repeat, "tasks": [_task_to_dict(t) for t in s.tasks]}
                         for s in self.segments],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "plan") -> Plan:
        if not isinstance(d, Mapping):
            raise PlanError(f"{where}: expected a JSON object at the top level")
        if d.get("schema") != PLAN_SCHEMA:
            raise PlanError(f"{where}: field 'schema' must be {PLAN_SCHEMA!r}, got {d.get('schema')!r}")
        if d.get("version") != PLAN_VERSION:
            raise PlanError(f"{where}: field 'version' is {d.get('version')!r}; this tiersim reads version "
                            f"{PLAN_VERSION} (re-create the plan with this version)")
        hardware = plan_hardware(d.get("hardware"), where)
        workload = PlanWorkload.from_dict(d.get("workload"), where)
        try:
            tensors = tuple(_tensor_from_dict(t, f"{where}: tensors[{i}]") for i, t in enumerate(d["tensors"]))
            streams = tuple(StreamSpec(*(text(s, k, f"{where}: streams[{i}]") for k in ("id", "device", "kind")))
                            for i, s in enumerate(d["streams"]))
            segments = tuple(
                Segment(s["name"], _whole(s["repeat"], f"{where}: segment {s.get('name')!r} field 'repeat'"),
                        tuple(_task_from_dict(t, f"{where}: segment {s['name']!r} task {j}")
                              for j, t in enumerate(s["tasks"])))
                for s in d["segments"])
            plan = cls(policy=str(d["policy"]), knobs=dict(d.get("knobs", {})),
                       hardware=hardware, workload=workload,
                       tensors=tensors, streams=streams, segments=segments,
                       steps=_whole(d.get("steps", 1), f"{where}: field 'steps'"),
                       metrics=number_map(d, "metrics", where), notes=text_list(d, "notes", where),
                       info=dict(d.get("info", {})))
        except KeyError as e:
            raise PlanError(f"{where}: missing field {e.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as e:
            if isinstance(e, PlanError):
                raise
            raise PlanError(f"{where}: malformed plan ({e})") from None
        validate_plan(plan, where)
        return plan

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        p = Path(path)
        return cls.from_dict(read_plan_document(p), where=str(p))  # through userfiles, bounds checked


def _whole(x: Any, where: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int | float) or int(x) != x:
        raise PlanError(f"{where}: expected a whole number, got {x!r}")
    return int(x)


def _str_list(x: Any, where: str) -> list[str]:
    if isinstance(x, str) or not isinstance(x, list | tuple) or not all(isinstance(v, str) for v in x):
        raise PlanError(f"{where}: expected a list of task ids, got {x!r}")
    return list(x)


def _placements(items: Iterable[Sequence[str]], where: str) -> tuple[Placement, ...]:
    out = []
    for it in items:
        if not (isinstance(it, Sequence) and len(it) == 2):
            raise PlanError(f"{where}: expected [tensor, location] pairs, got {it!r}")
        out.append(Placement(Ref.parse(it[0], where), str(it[1])))
    return tuple(out)


def _tensor_to_dict(t: TensorSpec) -> dict[str, Any]:
    d: dict[str, Any] = {"id": t.id, "bytes": t.bytes, "kind": t.kind}
    if t.scope != "global":
        d["scope"] = t.scope
    if t.home is not None:
        d["home"] = t.home
    if t.layer is not None:
        d["layer"] = t.layer
    if t.persistent:
        d["persistent"] = True
    return d


def _tensor_from_dict(d: Mapping[str, Any], where: str) -> TensorSpec:
    return TensorSpec(id=str(d["id"]), bytes=float(d["bytes"]), kind=str(d["kind"]),
                      scope=str(d.get("scope", "global")), home=opt_text(d, "home", where),
                      layer=opt_whole(d, "layer", where), persistent=bool(d.get("persistent", False)))


_TASK_DEFAULTS = TaskSpec("", "", "")


def _task_to_dict(t: TaskSpec) -> dict[str, Any]:
    d: dict[str, Any] = {"id": t.id, "op": t.op, "stream": t.stream}
    if t.deps:
        d["deps"] = [str(r) for r in t.deps]
    for name in ("flops", "hbm_bytes", "bytes", "src", "dst", "alloc_dst", "free_src", "params", "coll"):
        v = getattr(t, name)
        if v != getattr(_TASK_DEFAULTS, name):
            d[name] = v
    if t.tensor is not None:
        d["tensor"] = str(t.tensor)
    if t.ranks:
        d["ranks"] = list(t.ranks)
    for name in ("allocs", "frees", "reads"):
        v = getattr(t, name)
        if v:
            d[name] = [[str(p.tensor), p.loc] for p in v]
    if t.tags:
        d["tags"] = dict(t.tags)
    return d


def _task_from_dict(d: Mapping[str, Any], where: str) -> TaskSpec:
    tid = str(d["id"])
    where = f"{where} ({tid!r})"
    return TaskSpec(
        id=tid, op=str(d["op"]), stream=str(d["stream"]),
        deps=tuple(Ref.parse(x, where) for x in _str_list(d.get("deps", ()), f"{where} field 'deps'")),
        flops=float(d.get("flops", 0.0)), hbm_bytes=float(d.get("hbm_bytes", 0.0)),
        bytes=float(d.get("bytes", 0.0)),
        tensor=Ref.parse(d["tensor"], where) if d.get("tensor") is not None else None,
        src=opt_text(d, "src", where), dst=opt_text(d, "dst", where), alloc_dst=bool(d.get("alloc_dst", False)),
        free_src=bool(d.get("free_src", False)), params=float(d.get("params", 0.0)), coll=opt_text(d, "coll", where),
        ranks=text_list(d, "ranks", where),
        allocs=_placements(d.get("allocs", ()), where), frees=_placements(d.get("frees", ()), where),
        reads=_placements(d.get("reads", ()), where), tags=tags_of(d, where))


def _size(x: float) -> bool:
    """A finite, non-negative amount (NaN and inf fail; json.loads accepts both)."""
    return math.isfinite(x) and x >= 0


def validate_plan(plan: Plan, where: str = "plan", locations: Iterable[str] | None = None,
                  policies: Collection[str] | None = None) -> None:
    """Static checks: every referenced tensor, stream, dependency and location exists; sizes are sane; the
    plan has work to do (a segment with a task); with ``policies``, it names one of them.

    Raises PlanError with one line naming the task and the missing piece.
    """
    if isinstance(plan.steps, bool) or not isinstance(plan.steps, int) or plan.steps < 1:
        raise PlanError(f"{where}: field 'steps' must be a whole number >= 1, got {plan.steps!r}")
    tensors = plan.tensor_map()
    if len(tensors) != len(plan.tensors):
        raise PlanError(f"{where}: duplicate tensor ids")
    streams = plan.stream_map()
    if len(streams) != len(plan.streams):
        raise PlanError(f"{where}: duplicate stream ids")
    locs = frozenset(locations) if locations is not None else None
    for tensor in plan.tensors:
        _check_tensor(tensor, f"{where}: tensor {tensor.id!r}", locs)
    for s in plan.streams:
        if s.kind not in STREAM_KINDS:
            raise PlanError(f"{where}: stream {s.id!r}: kind {s.kind!r} is not one of {', '.join(STREAM_KINDS)}")
        if locs is not None and s.device not in locs:
            raise PlanError(f"{where}: stream {s.id!r}: device {s.device!r} is not a location of this hardware")
    seg_of = plan.task_segment()
    if len(seg_of) != sum(len(s.tasks) for s in plan.segments):
        raise PlanError(f"{where}: duplicate task ids")
    ctx = _TaskContext(tensors, frozenset(streams), seg_of, locs)
    for si, seg in enumerate(plan.segments):
        if seg.repeat < 1:
            raise PlanError(f"{where}: segment {seg.name!r}: repeat must be >= 1, got {seg.repeat}")
        for t in seg.tasks:
            _check_task(t, si, f"{where}: task {t.id!r}", ctx)
    if not plan.segments:
        raise PlanError(f"{where}: field 'segments' is empty: a plan without work says nothing; re-create it "
                        "with simulate --plan-out")
    if not any(seg.tasks for seg in plan.segments):
        raise PlanError(f"{where}: no segment holds a task: a plan without work says nothing; re-create it "
                        "with simulate --plan-out")
    if policies is not None and plan.policy not in policies:
        raise PlanError(f"{where}: field 'policy' {plan.policy!r} is not a known policy ({', '.join(policies)}); "
                        "re-create the plan with simulate --plan-out")
    _check_freed(plan, tensors, where)


def _check_freed(plan: Plan, tensors: Mapping[str, TensorSpec], where: str) -> None:
    """The contract of a run's end: every tensor neither ``persistent`` nor homed is freed wherever it is
    allocated (by an alloc or a copy's ``alloc_dst``; freed by a free or a copy's ``free_src``), else the run
    ends with it resident: a leak the invariant check refuses after the simulation."""
    made: dict[tuple[str, str], str] = {}
    freed: set[tuple[str, str]] = set()
    for seg in plan.segments:
        for t in seg.tasks:
            for p in t.allocs:
                made.setdefault((p.tensor.id, p.loc), t.id)
            if t.frees:
                freed.update([(p.tensor.id, p.loc) for p in t.frees])
            if t.op == "copy" and t.tensor is not None and t.src is not None and t.dst is not None:
                if t.alloc_dst:
                    made.setdefault((t.tensor.id, t.dst), t.id)
                if t.free_src:
                    freed.add((t.tensor.id, t.src))
    for (tid, loc), task in made.items():
        spec = tensors[tid]
        if spec.persistent or spec.home is not None or (tid, loc) in freed:
            continue
        raise PlanError(f"{where}: tensor {tid!r} is allocated on {loc!r} (task {task!r}) and never freed there; "
                        "free it in a later task or mark the tensor \"persistent\": true")


def _check_tensor(t: TensorSpec, w: str, locs: frozenset[str] | None) -> None:
    if t.kind not in TENSOR_KINDS:
        raise PlanError(f"{w}: kind {t.kind!r} is not one of {', '.join(TENSOR_KINDS)}")
    if t.scope not in SCOPES:
        raise PlanError(f"{w}: scope {t.scope!r} is not one of {', '.join(SCOPES)}")
    if not _size(t.bytes):
        raise PlanError(f"{w}: bytes must be finite and >= 0, got {t.bytes}")
    if t.home is not None and t.scope != "global":
        raise PlanError(f"{w}: only global tensors can have a home")
    if locs is not None and t.home is not None and t.home not in locs:
        raise PlanError(f"{w}: home {t.home!r} is not a location of this hardware ({', '.join(sorted(locs))})")


@dataclass(frozen=True)
class _TaskContext:
    """What a task is checked against: the plan's tensors, streams, task segments and locations."""

    tensors: Mapping[str, TensorSpec]
    streams: frozenset[str]
    seg_of: Mapping[str, int]
    locs: frozenset[str] | None


def _check_task(t: TaskSpec, si: int, w: str, ctx: _TaskContext) -> None:
    if t.op not in OPS:
        raise PlanError(f"{w}: op {t.op!r} is not one of {', '.join(OPS)}")
    if "phase" in t.tags and Phase.parse(t.tags["phase"]) is None:
        raise PlanError(f"{w}: tag 'phase' {t.tags['phase']!r} is not one of {', '.join(Phase)}")
    if t.stream not in ctx.streams:
        raise PlanError(f"{w}: stream {t.stream!r} is not declared in 'streams'")
    seg_of = ctx.seg_of
    for r in t.deps:
        # the usual dependency (an earlier or the same segment, no look-back, another task) passes at once
        if seg_of.get(r.id, si + 1) > si or r.iters_back or r.id == t.id:
            _check_dep(t, r, si, w, seg_of)
    if t.allocs or t.frees or t.reads:
        tensors, locs = ctx.tensors, ctx.locs
        for p in (*t.allocs, *t.frees, *t.reads):
            if p.tensor.id not in tensors:
                raise PlanError(f"{w}: references missing tensor {p.tensor.id!r}")
            if locs is not None and p.loc not in locs:
                raise PlanError(f"{w}: location {p.loc!r} is not a location of this hardware")
    if t.op == "compute" and not (_size(t.flops) and _size(t.hbm_bytes)):
        raise PlanError(f"{w}: flops and hbm_bytes must be finite and >= 0")
    if t.op == "copy":
        _check_copy(t, w, ctx)
    if t.op == "optimizer" and not (_size(t.params) and t.params > 0):
        raise PlanError(f"{w}: an optimizer task needs a positive 'params'")
    if t.op == "collective":
        _check_collective(t, w, ctx.locs)


def _check_dep(t: TaskSpec, r: Ref, si: int, w: str, seg_of: Mapping[str, int]) -> None:
    if r.id not in seg_of:
        raise PlanError(f"{w}: depends on missing task {r.id!r}")
    if seg_of[r.id] > si and r.steps_back == 0:
        raise PlanError(f"{w}: depends on {r.id!r} of a later segment in the same step; "
                        f"write '{r.id}^1' for the previous step")
    if r.iters_back and seg_of[r.id] != si:
        raise PlanError(f"{w}: '{r}' looks back iterations of another segment; use plain '{r.id}'")
    if seg_of[r.id] == si and r.steps_back == 0 and r.iters_back == 0 and r.id == t.id:
        raise PlanError(f"{w}: depends on itself")


def _check_copy(t: TaskSpec, w: str, ctx: _TaskContext) -> None:
    if t.src is None or t.dst is None:
        raise PlanError(f"{w}: a copy needs 'src' and 'dst'")
    if t.tensor is None and not (_size(t.bytes) and t.bytes > 0):
        raise PlanError(f"{w}: a copy needs a 'tensor' or a positive 'bytes'")
    if t.tensor is not None and t.tensor.id not in ctx.tensors:
        raise PlanError(f"{w}: copies missing tensor {t.tensor.id!r}")
    if ctx.locs is not None and (t.src not in ctx.locs or t.dst not in ctx.locs):
        raise PlanError(f"{w}: copy location {t.src!r} -> {t.dst!r} is not on this hardware")
    if not _size(t.bytes):
        raise PlanError(f"{w}: bytes must be finite and >= 0")


def _check_collective(t: TaskSpec, w: str, locs: frozenset[str] | None) -> None:
    if t.coll not in COLLECTIVES:
        raise PlanError(f"{w}: coll {t.coll!r} is not one of {', '.join(COLLECTIVES)}")
    if not t.ranks:
        raise PlanError(f"{w}: a collective needs 'ranks'")
    if not _size(t.bytes):
        raise PlanError(f"{w}: bytes must be finite and >= 0")
    if locs is not None and any(r not in locs for r in t.ranks):
        raise PlanError(f"{w}: ranks {list(t.ranks)} include a location not on this hardware")
