"""Errors of the torch runner (one line each, naming the task and what was wrong)."""

from __future__ import annotations


class ReplayError(Exception):
    """The plan cannot be replayed as written: data not where the plan put it, an unsupported plan
    (multi-GPU on one device, MoE), or a deadlock. The message names the task and the missing piece."""


class ReplayOom(ReplayError):
    """An allocation took a pool over the plan's capacity in the runner's own accounting."""


class ReplayTimeout(ReplayError):
    """Spawned ranks gave no result within the deadline they were given (they were stopped)."""
