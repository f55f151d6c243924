"""Suite-wide settings.

- Every simulation made by any test checks the simulator's invariants (TIERSIM_CHECK_INVARIANTS=1).
- Under CI (CI=true) Hypothesis is derandomized: the same examples every run, so a red CI is a real
  regression and not a new random draw; local runs keep exploring new examples.
"""

from __future__ import annotations

import os

from hypothesis import settings

os.environ["TIERSIM_CHECK_INVARIANTS"] = "1"

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
