"""The errors a command reports as bad input (exit code 2, one line on stderr)."""

from __future__ import annotations

from hardware_models import HardwareInputError
from policies import KnobError
from simulator import PlanError
from workloads import WorkloadInputError


class UsageError(ValueError):
    """A bad combination of command-line arguments (one line naming the flag and the fix)."""


INPUT_ERRORS = (HardwareInputError, WorkloadInputError, PlanError, KnobError, UsageError)


def one_line(text: str) -> str:
    return " ".join(text.split())
