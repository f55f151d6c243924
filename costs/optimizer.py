"""Optimizer-step seconds.

- CPU Adam: the host updates ``host.optimizer_params_per_s`` parameters per second in all (the engine's
  ``cpu.adam`` resource), shared by every rank whose optimizer steps at the same time; on several nodes
  each node's host serves its own ranks (ranks spread evenly over the nodes).
- GPU optimizer: HBM-bound, ``params * gpu.optimizer_bytes_per_param / gpu.hbm_bw`` plus one launch
  overhead, as seconds of work on the GPU's SMs.
"""

from __future__ import annotations

from hardware_models import HardwareSpec

__all__ = ["cpu_adam_seconds", "gpu_optimizer_seconds"]


def cpu_adam_seconds(hw: HardwareSpec, params: float, ranks: int = 1) -> float:
    """Seconds of a CPU-Adam step over ``params`` parameters of each of ``ranks`` ranks stepping at once
    (they share their host's rate, so each takes as many times as long as alone as there are ranks per node)."""
    return params * max(1.0, ranks / hw.nodes) / hw.host.optimizer_params_per_s


def gpu_optimizer_seconds(hw: HardwareSpec, params: float) -> float:
    """Seconds of work of a GPU optimizer step over ``params`` parameters (HBM-bound, launch included)."""
    return params * hw.gpu.optimizer_bytes_per_param / hw.gpu.hbm_bw + hw.gpu.launch_overhead_s
