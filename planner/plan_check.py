"""The meaning checks of a plan read from a file, beyond its form (``simulator.validate_plan``).

A plan file is data: it names its policy and that policy's knobs, which the simulator never needs but the
reports, ``replay`` (``delayed_update``, a policy's replay knobs) and the user read as facts about the run.
So a saved plan must name a registered policy and knobs that policy accepts, hold work to do, and agree
with itself: its segments have distinct names (extrapolation changes repeats by name), its sequence fits
the model's learned positions, its global batch is a multiple of its micro-batch, and the tokens per step
its figures are computed from are its global batch times its sequence length.
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
        raise PlanError(f"{where}: field 'knobs': {' '.join(str(e).split())}; {RECREATE}") from None
    problem = _contradiction(plan)
    if problem is not None:
        raise PlanError(f"{where}: {problem}; {RECREATE}")


RECREATE = "re-create the plan with simulate --plan-out"


def _contradiction(plan: Plan) -> str | None:
    names = [s.name for s in plan.segments]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return f"field 'segments': the name {twice[0]!r} is given to more than one segment"
    model, config = plan.workload.model, plan.workload.config
    if model.learned_pos and config.seq_len > model.max_pos:
        return (f"field 'workload.seq_len': {config.seq_len} exceeds the model's learned positions "
                f"(max_pos {model.max_pos})")
    gb = config.global_batch
    if gb is None:
        return None
    if gb % config.micro_batch:
        return f"field 'workload.global_batch': {gb} is not a multiple of micro_batch {config.micro_batch}"
    tokens = plan.metrics.get("tokens_per_step")
    if tokens is not None and tokens != gb * config.seq_len:
        return (f"field 'metrics.tokens_per_step': {tokens:g} contradicts the workload's global_batch x seq_len "
                f"= {gb * config.seq_len}")
    return None
