"""The what-if planner: search policies and knobs for a job, what-if grids, largest model, coverage, sweeps.

Sits above ``policies/`` and ``simulator/`` (design.md); everything runs in-process and is deterministic.
"""
