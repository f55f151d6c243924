"""The errors a command reports as bad input (exit code 2, one line on stderr)."""

from __future__ import annotations

from hardware_models import HardwareInputError
from policies import KnobError
from simulator import PlanError
from userfiles import UserFileError
from workloads import WorkloadInputError


class UsageError(ValueError):
    """A bad combination of command-line arguments (one line naming the flag and the fix)."""


# UserFileError: a user file refused while read (size, UTF-8, duplicate key, depth, number, alias, bound)
INPUT_ERRORS = (HardwareInputError, WorkloadInputError, PlanError, KnobError, UsageError, UserFileError)


def one_line(text: str) -> str:
    return " ".join(text.split())
