"""The meaning checks of a plan read from a file, beyond its form (``simulator.validate_plan``).

A plan file is data: it names its policy and that policy's knobs, which the simulator never needs but the
reports, ``replay`` (``delayed_update``, a policy's replay knobs) and the user read as facts about the run.
So a saved plan must name a registered policy and knobs that policy accepts, and hold work to do.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import POLICIES, KnobError, parse_knobs
from simulator import Plan, PlanError, validate_plan


def check_saved_plan(plan: Plan, where: str, locations: Iterable[str] | None = None) -> None:
    """PlanError (one line naming ``where`` and the field) unless ``plan`` is valid on ``locations``, names
    a registered policy and that policy accepts its knobs."""
    validate_plan(plan, where, locations, POLICIES)
    try:
        parse_knobs(POLICIES[plan.policy], dict(plan.knobs))
    except (KnobError, TypeError, ValueError) as e:
        raise PlanError(f"{where}: field 'knobs': {' '.join(str(e).split())}; re-create the plan with "
                        "simulate --plan-out") from None
