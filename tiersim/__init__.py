"""tiersim: a discrete-event simulator and what-if planner for LLM training across GPU HBM, CPU DRAM
and NVMe. The public API:

    tiersim.simulate(hw="a100x8", model="70b", policy="zero-offload") -> Result
"""

from tiersim.api import JobRequest, make_job, make_plan, simulate

__all__ = ["JobRequest", "make_job", "make_plan", "simulate"]
