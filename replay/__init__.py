"""The torch runner: executes a Plan for real (design.md: "the torch runner executes the same Plan").

The only package of tiersim that imports torch, and only inside its submodules (``replay.model``,
``replay.store``, ``replay.runner``, ``replay.reference``), so ``import replay`` stays cheap and
torch stays an optional extra (``pip install 'tiersim[replay]'``).

Before torch is imported, ``THP_MEM_ALLOC_ENABLE`` defaults to 1 (a user's own setting wins): torch then aligns
large CPU tensors to 2 MiB and asks for transparent huge pages. Without it, a CPU tensor that is freed is not
reused by the next one of the same size (glibc's ``posix_memalign`` at torch's 64-byte alignment asks for a little
more than the freed chunk holds), so each new large tensor faults its pages in afresh: 100k faults and 0.17 s
per 412 MB on this VM, seconds when two threads fault at once, every step of a replay, none of it in what the
simulator prices (calibration measures on reused buffers). With it, the same tensor reuses its 2 MiB-aligned
chunk: 729 faults, then none (``replay.host_memory`` keeps the freed memory in the process). torch reads the
variable once, at its first large allocation, so it is set here, before any submodule imports torch.
"""

import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from replay.errors import ReplayError, ReplayOom  # noqa: E402

__all__ = ["ReplayError", "ReplayOom"]
