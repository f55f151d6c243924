"""Errors the simulator raises for bad input. Each message is one line naming the field and the fix."""


class PlanError(ValueError):
    """A plan is malformed or inconsistent (missing tensor, stream, dependency; data not where it is read)."""
