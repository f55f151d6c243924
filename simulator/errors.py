"""Errors the simulator raises for bad input. Each message is one line naming the field and the fix."""


class PlanError(ValueError):
    """A plan is malformed or inconsistent (missing tensor, stream, dependency; data not where it is read)."""


class TemplateRefused(PlanError):
    """A rank template (``simulator.rank_template``) whose ranks do not play one role on this machine (e.g. GPUs
    that share switch uplinks unevenly): its plan has to be built and simulated in full
    (``planner.job.simulate_job`` does)."""
