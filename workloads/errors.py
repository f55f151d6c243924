"""The one exception type of the workloads package.

Every message is a single line that names the file or field at fault and says how to fix it, so the
CLI can print it as is and exit with code 2 (bad input).
"""

from __future__ import annotations

__all__ = ["WorkloadInputError"]


class WorkloadInputError(ValueError):
    """Bad model name, model file, model dimensions or workload configuration."""
