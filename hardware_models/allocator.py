"""Bytes a GPU allocation really holds under PyTorch's CUDA caching allocator.

Source: PyTorch ``c10/cuda/CUDACachingAllocator.cpp`` (its header comment and constants): every request is
rounded up to a multiple of ``kMinBlockSize`` = 512 B; requests of at most ``kSmallSize`` = 1 MiB are packed
into 2 MiB segments (``kSmallBuffer``); requests between 1 MiB and ``kMinLargeAlloc`` = 10 MiB are carved
from 20 MiB segments (``kLargeBuffer``); larger requests get a segment of their own rounded up to
``kRoundLarge`` = 2 MiB. A block larger than the request is split only when the remainder is worth keeping:
in the large pool when it exceeds ``kSmallSize`` (``should_split``), otherwise the remainder stays inside the
block and is lost to the tensor.

What we charge per tensor of a Plan (one framework buffer: a flat parameter group, a gradient bucket, a
layer's activations): its 512-byte-rounded size, plus, for a request of 10 MiB or more, the tail of its own
2 MiB-rounded segment when that tail is too small to be split off (<= 1 MiB). Smaller requests share
segments with their neighbours, so only the 512-byte rounding is theirs. This is the allocator's steady
state (a training step reuses the cached blocks of the previous one); fragmentation from interleaved
lifetimes of different sizes is not modelled (``gpu.fragmentation`` remains for a user who measured it).
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["ALLOCATORS", "K_MIN_BLOCK", "K_MIN_LARGE_ALLOC", "K_ROUND_LARGE", "K_SMALL_SIZE",
           "allocator_overhead", "caching_allocator_bytes"]

K_MIN_BLOCK: Final = 512
K_SMALL_SIZE: Final = 1 << 20
K_MIN_LARGE_ALLOC: Final = 10 << 20
K_ROUND_LARGE: Final = 2 << 20
ALLOCATORS: Final = ("caching", "exact")


def _round_up(n: float, unit: int) -> float:
    return float(math.ceil(n / unit) * unit) if n > 0 else 0.0


def caching_allocator_bytes(nbytes: float) -> float:
    """Bytes a request of ``nbytes`` holds in the caching allocator (module docstring)."""
    if nbytes <= 0:
        return 0.0
    block = max(_round_up(nbytes, K_MIN_BLOCK), float(K_MIN_BLOCK))
    if block < K_MIN_LARGE_ALLOC:
        return block
    tail = _round_up(block, K_ROUND_LARGE) - block
    return block + (tail if tail <= K_SMALL_SIZE else 0.0)


def allocator_overhead(nbytes: float, allocator: str) -> float:
    """Bytes held beyond ``nbytes`` by ``allocator`` ("caching": PyTorch's; "exact": none)."""
    if allocator == "exact":
        return 0.0
    return caching_allocator_bytes(nbytes) - nbytes
