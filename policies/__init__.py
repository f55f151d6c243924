"""Policies: each turns (hardware, workload, knobs) into a Plan. One package (or module) per policy.

The registry is :data:`REGISTRY`: one line per policy, the module that holds its ``POLICY`` (a
:class:`~policies.base.PolicyInfo`: plan function, knobs, search grid, checkpointing rule, refine hook).
Adding a policy is writing its package and adding its line; nothing else names it (the planner, the CLI
and the reports read every fact about a policy from its ``PolicyInfo``). See ``docs/policy-authoring.md``.

A policy defined outside this package (a plugin, a test's toy policy) joins with :func:`register` (and
leaves with :func:`unregister`); :func:`load_policy` reads a module's ``POLICY`` as the registry does.
"""

from __future__ import annotations

import importlib

from policies.base import Job, KnobError, PlanInfeasible, PolicyInfo, knob_help, parse_knobs

#: the registry: one line per policy, in the order the CLI lists them and a search tries them
REGISTRY = (
    "policies.none",
    "policies.zero_offload",
    "policies.zero_infinity",
    "policies.tinypipe",
    "policies.lazytrain",
    "policies.synergyscale",
)


def load_policy(module: str) -> PolicyInfo:
    """The ``POLICY`` of ``module`` (imported); TypeError, naming the module, when it has none."""
    info = getattr(importlib.import_module(module), "POLICY", None)
    if not isinstance(info, PolicyInfo):
        raise TypeError(f"policy module {module!r} must define POLICY = PolicyInfo(...), got {info!r}")
    return info


#: every registered policy by name (the REGISTRY's, then any added with ``register``)
POLICIES: dict[str, PolicyInfo] = {}


def register(info: PolicyInfo) -> PolicyInfo:
    """Add a policy to :data:`POLICIES` (ValueError when its name is taken); returns it."""
    if info.name in POLICIES:
        raise ValueError(f"a policy named {info.name!r} is already registered")
    POLICIES[info.name] = info
    return info


def unregister(name: str) -> None:
    """Remove a policy added with :func:`register` (those of the REGISTRY stay)."""
    if any(load_policy(m).name == name for m in REGISTRY):
        raise ValueError(f"policy {name!r} is one of the registry's; it cannot be removed")
    POLICIES.pop(name, None)


def get_policy(name: str) -> PolicyInfo:
    try:
        return POLICIES[name]
    except KeyError:
        raise KnobError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None


for _module in REGISTRY:
    register(load_policy(_module))

__all__ = ["POLICIES", "REGISTRY", "Job", "KnobError", "PlanInfeasible", "PolicyInfo", "get_policy", "knob_help",
           "load_policy", "parse_knobs", "register", "unregister"]
