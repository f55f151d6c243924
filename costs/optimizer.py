"""Optimizer-step seconds.

- CPU Adam: the host updates ``host.optimizer_params_per_s`` parameters per second in all (the engine's
  ``cpu.adam`` resource), shared by every rank whose optimizer steps at the same time.
- GPU optimizer: HBM-bound, ``params * gpu.optimizer_bytes_per_param / gpu.hbm_bw`` plus one launch
  overhead, as seconds of work on the GPU's SMs.
"""

from __future__ import annotations

from hardware_models import HardwareSpec

__all__ = ["cpu_adam_seconds", "gpu_optimizer_seconds"]


def cpu_adam_seconds(hw: HardwareSpec, params: float, ranks: int = 1) -> float:
    """Seconds of a CPU-Adam step over ``params`` parameters of each of ``ranks`` ranks stepping at once
    (they share the host's rate, so each takes ``ranks`` times as long as alone)."""
    return params * ranks / hw.host.optimizer_params_per_s


def gpu_optimizer_seconds(hw: HardwareSpec, params: float) -> float:
    """Seconds of work of a GPU optimizer step over ``params`` parameters (HBM-bound, launch included)."""
    return params * hw.gpu.optimizer_bytes_per_param / hw.gpu.hbm_bw + hw.gpu.launch_overhead_s
