"""Policies: each turns (hardware, workload, knobs) into a Plan. One module per policy."""

from policies import lazytrain, none, synergyscale, tinypipe, zero_infinity, zero_offload
from policies.base import Job, KnobError, PlanInfeasible, PolicyInfo, knob_help, parse_knobs

POLICIES: dict[str, PolicyInfo] = {p.name: p for p in (
    none.POLICY, zero_offload.POLICY, zero_infinity.POLICY, tinypipe.POLICY, lazytrain.POLICY, synergyscale.POLICY)}


def get_policy(name: str) -> PolicyInfo:
    try:
        return POLICIES[name]
    except KeyError:
        raise KnobError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None


__all__ = ["POLICIES", "Job", "KnobError", "PlanInfeasible", "PolicyInfo", "get_policy", "knob_help",
           "parse_knobs"]
