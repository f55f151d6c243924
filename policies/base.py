"""What every policy shares: the Job it plans for, the PlanInfeasible verdict and knob parsing.

A policy is a package (or module) with a frozen ``Knobs`` dataclass (every field has a default and a
docstring line in the module's docstring), a ``plan(job, knobs) -> Plan`` function and ``POLICY``, its
:class:`PolicyInfo`; one line in ``policies.REGISTRY`` registers it (``docs/policy-authoring.md``).
``PlanInfeasible`` is raised, with the pool and how far over it is, when a policy can tell before
simulating that the job cannot fit.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hardware_models import HardwareSpec, Pool, build_topology
from simulator import Plan
from workloads import ModelSpec, WorkloadConfig, WorkloadTrace


class KnobError(ValueError):
    """An unknown knob or a bad knob value (one line, naming the knob and the accepted values)."""


class PlanInfeasible(Exception):
    """The policy cannot fit this job on this hardware: which pool, how much is needed, how much there is."""

    def __init__(self, policy: str, pool: str, need_bytes: float, capacity_bytes: float, what: str):
        self.policy = policy
        self.pool = pool
        self.need_bytes = need_bytes
        self.capacity_bytes = capacity_bytes
        self.what = what
        super().__init__(
            f"{policy}: {pool} needs {need_bytes / 1e9:.1f} GB for {what} but holds {capacity_bytes / 1e9:.1f} GB "
            f"(over by {(need_bytes - capacity_bytes) / 1e9:.1f} GB)")

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "pool": self.pool, "need_bytes": self.need_bytes,
                "capacity_bytes": self.capacity_bytes, "over_by_bytes": self.need_bytes - self.capacity_bytes,
                "what": self.what, "message": str(self)}


@dataclass(frozen=True)
class Job:
    """One training job: hardware, model and workload settings, and the per-micro-batch trace."""

    hw: HardwareSpec
    model: ModelSpec
    config: WorkloadConfig
    trace: WorkloadTrace
    assumed: tuple[str, ...] = ()  # defaults picked for the user, shown with every result
    # a policy that can emits a rank template (rank 0's tasks of a plan of symmetric ranks: simulator.rank_template):
    # what the symmetric simulation needs, not a plan to save or replay (policies.job.make_plan(template=True))
    rank_template: bool = False

    @property
    def n_gpus(self) -> int:
        return self.hw.gpu.count

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step (WorkloadConfig fills in a missing one on construction)."""
        gb = self.config.global_batch
        assert gb is not None
        return gb

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.config.seq_len

    def accumulation(self, data_parallel: int) -> int:
        """Micro-steps per optimizer step for ``data_parallel`` replicas."""
        per = self.config.micro_batch * data_parallel
        if self.global_batch % per:
            raise KnobError(f"global batch {self.global_batch} is not a multiple of micro-batch "
                            f"{self.config.micro_batch} x {data_parallel} data-parallel ranks; "
                            f"pick --global-batch as a multiple of {per}")
        return self.global_batch // per


def gpu_pool(job: Job) -> Pool:
    """The memory pool GPU 0 allocates from (HBM, or the unified pool of a DGX Spark)."""
    topo = build_topology(job.hw)
    return topo.pools[topo.pool_of["gpu0"]]


def unified(job: Job) -> bool:
    topo = build_topology(job.hw)
    return topo.pool_of["gpu0"] == topo.pool_of["cpu"]


#: seconds per training step of a plan as the simulator prices it (``inf`` when the plan does not fit)
StepSeconds = Callable[[Plan], float]


def pow2_divisors(n: int, cap: int | None = None) -> tuple[int, ...]:
    """Powers of two that divide ``n`` (at most ``cap``): the parallel degrees a search tries."""
    out, d = [], 1
    while d <= n and (cap is None or d <= cap):
        if n % d == 0:
            out.append(d)
        d *= 2
    return tuple(out)


def no_grid(n_gpus: int) -> dict[str, tuple[Any, ...]]:
    """A policy searched with its default knobs only."""
    return {}


@dataclass(frozen=True)
class PolicyInfo:
    """A policy's registration: its plan function and the facts about it that other packages need.

    - ``search_grid(n_gpus)``: the knob values a plan search tries (knobs not named keep their defaults;
      an ``auto`` knob is searched as auto *and* as explicit values);
    - ``fixed_checkpointing``: the one checkpointing setting searched when the policy's plans do not
      depend on the workload's setting (it decides recomputation itself), else None;
    - ``refine(job, knobs, plan, step_seconds)``: an optional second pass that may replace ``plan`` after
      pricing alternatives with ``step_seconds`` (the simulator's seconds per step of a plan, ``inf`` when
      it does not fit). The policy never runs the simulator itself; ``planner.job.make_plan`` hands it in;
    - ``replay_knobs``: the knobs (``name=value``) that keep the policy to plans the torch runner executes
      today (its documented limits); empty when every plan of the policy replays.
    """

    name: str
    summary: str
    knobs_type: type
    plan: Callable[[Job, Any], Plan]
    doc: str
    search_grid: Callable[[int], dict[str, tuple[Any, ...]]] = no_grid
    fixed_checkpointing: str | None = None
    refine: Callable[[Job, Any, Plan, StepSeconds], Plan] | None = None
    replay_knobs: tuple[str, ...] = ()


def knob_help(info: PolicyInfo) -> list[tuple[str, str, str]]:
    """(name, type, default) of every knob."""
    hints = typing.get_type_hints(info.knobs_type)
    out = []
    for f in dataclasses.fields(info.knobs_type):
        typ = hints[f.name]
        members = typing.get_args(typ) if typing.get_origin(typ) in (typing.Union, types.UnionType) else (typ,)
        name = "|".join("|".join(str(c) for c in typing.get_args(m)) if typing.get_origin(m) is typing.Literal
                        else getattr(m, "__name__", str(m)) for m in members)
        out.append((f.name, name, repr(f.default)))
    return out


def _convert(policy: str, name: str, typ: Any, text: str) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):  # e.g. int | Literal["auto"]: the first member that parses
        members = typing.get_args(typ)
        for member in members:
            try:
                return _convert(policy, name, member, text)
            except KnobError:
                continue
        spelled = " or ".join("|".join(map(str, typing.get_args(m))) if typing.get_origin(m) is typing.Literal
                              else getattr(m, "__name__", str(m)) for m in members)
        raise KnobError(f"{policy}: knob '{name}' must be {spelled}, got {text!r}")
    if origin is typing.Literal:
        choices = typing.get_args(typ)
        for c in choices:
            if str(c) == text:
                return c
        raise KnobError(f"{policy}: knob '{name}' must be one of {', '.join(map(str, choices))}, got {text!r}")
    try:
        if typ is bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ is int:
            return int(float(text)) if float(text).is_integer() else int(text)
        if typ is float:
            return float(text)
        if typ is str:
            return text
    except ValueError:
        raise KnobError(f"{policy}: knob '{name}' expects a {typ.__name__}, got {text!r}") from None
    raise KnobError(f"{policy}: knob '{name}' has an unsupported type {typ!r}")


def parse_knobs(info: PolicyInfo, items: Sequence[str] | Mapping[str, Any]) -> Any:
    """Build the policy's Knobs from ``["name=value", ...]`` or a mapping; unknown knobs are errors."""
    hints = typing.get_type_hints(info.knobs_type)
    names = [f.name for f in dataclasses.fields(info.knobs_type)]
    pairs: list[tuple[str, Any]] = []
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        for it in items:
            if "=" not in it:
                raise KnobError(f"--knob {it!r}: expected name=value (knobs of {info.name}: {', '.join(names)})")
            k, v = it.split("=", 1)
            if any(k.strip() == seen for seen, _ in pairs):
                raise KnobError(f"--knob {k.strip()} given twice ({k.strip()}={dict(pairs)[k.strip()]} and {it}); "
                                "give each knob once")
            pairs.append((k.strip(), v.strip()))
    values: dict[str, Any] = {}
    for k, v in pairs:
        if k not in names:
            close = difflib.get_close_matches(k, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise KnobError(f"{info.name}: unknown knob '{k}'{hint} (knobs: {', '.join(names)})")
        try:
            values[k] = _convert(info.name, k, hints[k], v) if isinstance(v, str) else v
        except KnobError as err:  # a knob type may say where a refused value belongs (KNOB_ADVICE)
            advice = getattr(info.knobs_type, "KNOB_ADVICE", {}).get((k, str(v)))
            if advice:
                raise KnobError(f"{err}; {advice}") from None
            raise
    knobs = info.knobs_type(**values)
    check = getattr(knobs, "validate", None)
    if check is not None:
        check()
    return knobs
