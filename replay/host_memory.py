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
``M_TRIM_THRESHOLD`` is -1, which the manual says disables trimming completely: its largest positive value (an
int, 2 GiB) still let a top chunk above 2 GiB go back to the kernel.

Every thread of a multi-rank replay's rank processes allocates from the process's main arena
(:func:`one_malloc_arena`, around their start in ``replay.dist_launch``; under ``torchrun``, set
``MALLOC_ARENA_MAX=1`` in the launcher's environment). By default glibc gives each new thread an arena of its own,
whose heaps are at most 64 MiB: a request larger than that from a worker thread (the runner's collective, copy and
optimizer streams) is served by a fresh ``mmap`` whatever ``M_MMAP_MAX`` says, and unmapped on free, so it faults
its pages in every time. A vocab-50257 x 512 table's gradient (103 MB fp32, flattened for its reduce-scatter on the
collective stream) and its 16-bit wire took 72-77 ms a round (135 the first) in a worker thread (29 k page faults
each time) against 20-22 ms in the main thread; with one arena 21-29 ms there, 2 faults over 8 rounds (2026-12-05,
2-core AMD EPYC VM, a throwaway script). In a gpt-h512-zoff-bf16 2-rank replay that reduce-scatter's flattening
took 50-470 ms. ``M_ARENA_MAX`` set by ``mallopt`` after start does not bring threads back to the main arena (a new
thread takes a free arena first), so the processes start with ``MALLOC_ARENA_MAX=1`` in their environment. Fewer
arenas mean a lock shared by the threads' allocations; replays of one GPU (started in the command's own process by
``tiersim replay``, in a spawned one by ``python -m replay.validation``: both keep glibc's default, so that the two
agree) measured the same with one arena or sixteen within their noise, or not clearly: synergy-small 316-320 vs
282-290 ms in a first pair of replays, 249-257 vs 244-255 ms in a second; zinf-nvme-small 316-335 vs 304-327 ms;
none-small 228-232 vs 221-254 ms (2026-12-05 06:45-06:55, while this VM ran 5-20% slower than an hour before).

Kept memory is reused, but the heap still grows to its working size over a replay's first steps (the tensors'
sizes interleave and fragment it), each new page faulted then: gpt-h2048-lazytrain (2.1 GB of priced peaks, a 3.9 GB
heap) faulted 1.25 M pages in six steps, its steps 7.2, 4.2, 4.3, 4.5, 3.0, 3.3 s, still settling at the sixth, where
a GPU's memory is mapped before the first. ``reserve_bytes`` faults that much heap in once, on entry (written and
freed: kept, not trimmed), so the steps run on pages already there: the same plan then ran 5.2, 2.7, 2.7, 2.7, 2.7,
2.6 s (4.5 GB reserved in 9.4 s beforehand, 2026-12-04, 2-core AMD EPYC VM: ~2 s per GB, setup time).
:func:`host_reserve_bytes` sizes it from the plan's priced peaks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ARENA_ENV", "RESERVE_FACTOR", "host_reserve_bytes", "keep_freed_memory", "one_malloc_arena"]

ARENA_ENV = "MALLOC_ARENA_MAX"  # glibc reads it when a process starts (mallopt(3), M_ARENA_MAX)
M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_MAX = -4
DEFAULT_TRIM_THRESHOLD = 128 * 1024  # glibc's defaults (mallopt(3))
DEFAULT_MMAP_MAX = 65536
NO_TRIM = -1  # mallopt(3): "Setting M_TRIM_THRESHOLD to -1 disables trimming completely"
#: heap reserved per priced byte: the runner keeps fp32 working parameters and gradients where a 16-bit plan prices
#: 2 B, and the heap fragments: gpt-h2048-lazytrain grew a 3.9 GB heap for 2.1 GB of priced peaks (1.8x),
#: gpt-h512-zoff-bf16 (a tied fp32 vocab-50257 table) 2.9 GB for 0.8 GB (3.6x; with 2x reserved its table's
#: backward still stalled now and then: 12 ms, or 260-390 ms; with 4x, no stall in two replays)
RESERVE_FACTOR = 4.0
MAX_RESERVE_SHARE = 0.5  # of the memory the machine has available: a reserve never crowds the replay out


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


def host_reserve_bytes(priced_peaks: float) -> int:
    """The heap to fault in before a CPU replay whose pools (this process's share of them) peak at ``priced_peaks``
    bytes as priced: RESERVE_FACTOR times that, at most MAX_RESERVE_SHARE of the memory available now; none when
    the peaks alone are more than is available (that replay cannot hold its plan here: faulting memory in would
    only delay its verdict)."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
    if priced_peaks > available:
        return 0
    return int(max(0.0, min(RESERVE_FACTOR * priced_peaks, MAX_RESERVE_SHARE * available)))


def _fault_in(libc: ctypes.CDLL, nbytes: int) -> None:
    """Grow the heap by ``nbytes`` and write every page (then free it: kept, as trimming is off)."""
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    buf = libc.malloc(nbytes)
    if buf:
        ctypes.memset(buf, 0, nbytes)
        libc.free(buf)


@contextmanager
def keep_freed_memory(device_type: str, reserve_bytes: int = 0) -> Iterator[bool]:
    """Within the block, on a CPU device with glibc, freed tensors' memory stays in the process, and
    ``reserve_bytes`` of heap are faulted in on entry (module docstring); yields whether it does."""
    libc = _libc() if device_type == "cpu" else None
    if libc is None or not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, NO_TRIM)):
        yield False
        return
    if reserve_bytes > 0:
        _fault_in(libc, int(reserve_bytes))
    try:
        yield True
    finally:
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)


@contextmanager
def one_malloc_arena() -> Iterator[None]:
    """Processes started within the block (``spawn``, and a ``forkserver`` started within it: a fresh
    interpreter that reads its environment) allocate every thread's memory from glibc's main arena (module
    docstring); the caller's own environment is restored after. A value already set is left as it is. A
    forkserver already running keeps the environment it started with."""
    before = os.environ.get(ARENA_ENV)
    if before is None:
        os.environ[ARENA_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ARENA_ENV, None)
