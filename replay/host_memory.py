"""Freed host memory stays in the process while a CPU-only machine stands in for a GPU.

A GPU training process allocates through a caching allocator (PyTorch's CUDA caching allocator): a freed
block goes back to the process's pool and the next tensor of that size reuses it, with no call to the
driver. On a CPU torch allocates from glibc's malloc, which serves a large request (above its mmap threshold,
at most 32 MiB) with a fresh ``mmap`` and unmaps it on free, and trims the heap's top back to the kernel. Every
large tensor (a step's logits, a layer's gradients, an embedding table's gradient) then starts on pages the
kernel must fault in and zero first. On a virtual machine that costs ~1-2 us per 4 KiB page (fp32 zeros of a
50257 x 512 table: 42-52 ms with fresh pages against 2-10 ms reused, 2026-12-04, 2-core AMD EPYC VM), time the
simulator does not price and a GPU does not spend: llama-h256-none (vocab 50257) faulted 1.6 M pages in three
steps, its head's forward and backward measured 1.39x and 1.59x their simulated time; with freed memory kept
0.53-0.60 M and 1.03x / 1.10x.

:func:`keep_freed_memory` makes glibc behave like the caching allocator for the duration of a replay or a
calibration on the CPU: no ``mmap`` for large requests (``M_MMAP_MAX`` 0: they come from the heap, where a
freed block is reused) and no trimming (``M_TRIM_THRESHOLD`` at its maximum). Restored to glibc's defaults after
(the process's own work after a replay returns memory as usual). Not glibc (musl, macOS) or a CUDA device:
nothing changes. The calls are ``mallopt(3)``; glibc documents both parameters as settable at any time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["keep_freed_memory"]

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_MAX = -4
DEFAULT_TRIM_THRESHOLD = 128 * 1024  # glibc's defaults (mallopt(3))
DEFAULT_MMAP_MAX = 65536
NO_TRIM = 2**31 - 1  # mallopt takes an int


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: its mallopt parameters
    except (OSError, AttributeError):
        return None
    return libc


@contextmanager
def keep_freed_memory(device_type: str) -> Iterator[bool]:
    """Within the block, on a CPU device with glibc, freed tensors' memory stays in the process (module
    docstring); yields whether it does."""
    libc = _libc() if device_type == "cpu" else None
    if libc is None or not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, NO_TRIM)):
        yield False
        return
    try:
        yield True
    finally:
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
