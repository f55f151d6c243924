"""Suite-wide settings: every simulation made by any test checks the simulator's invariants."""

from __future__ import annotations

import os

os.environ["TIERSIM_CHECK_INVARIANTS"] = "1"
