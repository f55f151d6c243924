"""The GPU architecture (generation) of a `gpu.model` name, and what the generation can run.

A preset names its GPU (`gpu.model`: ``V100-SXM2-32GB``, ``A100-SXM4-80GB``, ``H800-SXM5-80GB``,
``GB10 (Blackwell, 48 SMs)``, ...); the generation follows from the product name. It decides defaults that
depend on the silicon rather than on one machine:

- FlashAttention needs Ampere (compute capability 8.0) or newer: FlashAttention-2 supports "Ampere, Ada,
  or Hopper GPUs" (its README; Turing only in FlashAttention 1.x, Volta never), and PyTorch's
  ``scaled_dot_product_attention`` flash backend needs sm80+. Before Ampere (Volta V100, Turing T4) a
  training run materialises the s x s attention scores, so the default is off there.

A name that matches no row is ``None``: callers say so and keep their generation-free default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GpuArch", "FLASH_MIN_CC", "gpu_arch", "flash_attention_default"]

FLASH_MIN_CC = 8.0  # FlashAttention-2 / PyTorch SDPA flash kernels: Ampere (sm_80) or newer


@dataclass(frozen=True)
class GpuArch:
    name: str                   # NVIDIA's architecture name
    compute_capability: float   # CUDA compute capability (sm_XY as X.Y)

    @property
    def sm(self) -> str:
        return f"sm_{round(self.compute_capability * 10)}"


# (pattern over gpu.model, case-insensitive, word-ish) -> architecture; first match wins
# (CUDA GPUs list, developer.nvidia.com/cuda-gpus: V100 7.0, T4 / RTX 20xx 7.5, A100 / A30 8.0,
# A10 / A40 / RTX 30xx 8.6, L4 / L40 / RTX 40xx 8.9, H100 / H800 / H200 9.0, B200 10.0, GB10 12.1)
_TABLE: tuple[tuple[str, GpuArch], ...] = (
    (r"\bGB10\b", GpuArch("Blackwell", 12.1)),
    (r"\bG?B(100|200|300)\b", GpuArch("Blackwell", 10.0)),
    (r"\bGH200\b|\bH(100|800|200|20)\b", GpuArch("Hopper", 9.0)),
    (r"\bL(4|40S?)\b|RTX[- ]?40\d0|RTX[- ]?(A|)\d*Ada|\bRTX[- ]?6000[- ]Ada", GpuArch("Ada", 8.9)),
    (r"\bA(100|30|800)\b", GpuArch("Ampere", 8.0)),
    (r"\bA(10|16|2|40|4000|5000|6000)\b|RTX[- ]?30\d0", GpuArch("Ampere", 8.6)),
    (r"\bT4\b|RTX[- ]?20\d0|TITAN[- ]?RTX|Quadro[- ]?RTX", GpuArch("Turing", 7.5)),
    (r"\bV100\b|TITAN[- ]?V\b", GpuArch("Volta", 7.0)),
    (r"\bP100\b|\bP40\b|GTX[- ]?10\d0", GpuArch("Pascal", 6.0)),
)


def gpu_arch(model: str) -> GpuArch | None:
    """The architecture of a GPU product name (a preset's ``gpu.model``); None when it is not recognised."""
    for pattern, arch in _TABLE:
        if re.search(pattern, model, flags=re.IGNORECASE):
            return arch
    return None


def flash_attention_default(model: str) -> tuple[bool, str]:
    """(default, why) for FlashAttention on the GPU named ``model``: off before Ampere."""
    arch = gpu_arch(model)
    if arch is None:
        return True, f"fused attention kernels; the architecture of '{model}' is not known to tiersim"
    if arch.compute_capability < FLASH_MIN_CC:
        return False, (f"{arch.name} ({arch.sm}) cannot run FlashAttention, which needs Ampere or newer; "
                       "--flash-attention forces it on")
    return True, f"fused attention kernels ({arch.name}, {arch.sm})"
