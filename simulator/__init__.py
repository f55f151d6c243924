"""SimPy engine: executes any Plan on a HardwareSpec (see docs/design.md)."""

from simulator.errors import PlanError
from simulator.plan import (
    PLAN_SCHEMA,
    PLAN_VERSION,
    Placement,
    Plan,
    Ref,
    Segment,
    StreamSpec,
    TaskSpec,
    TensorSpec,
    validate_plan,
)
from simulator.result import Oom, Result, SimInfo
from simulator.simulate import simulate_plan

__all__ = [
    "PLAN_SCHEMA", "PLAN_VERSION", "Oom", "Placement", "Plan", "PlanError", "Ref", "Result", "Segment",
    "SimInfo", "StreamSpec", "TaskSpec", "TensorSpec", "simulate_plan", "validate_plan",
]
