"""The torch runner: executes a Plan for real (design.md: "the torch runner executes the same Plan").

The only package of tiersim that imports torch, and only inside its submodules (``replay.model``,
``replay.store``, ``replay.runner``, ``replay.reference``), so ``import replay`` stays cheap and
torch stays an optional extra (``pip install 'tiersim[replay]'``).

Host memory: ``replay.host_memory`` keeps freed memory in the process during a replay, and ``replay.pools``
reuses copy buffers. ``THP_MEM_ALLOC_ENABLE`` (torch: 2 MiB-aligned CPU tensors on transparent huge pages) is
left as the user set it; it was turned on here by default from 2026-12-04 (session 8) to 2026-12-04 (session 10)
and then off again: with it, every large tensor that is not reused faults whole 2 MiB pages in, each zeroed by
the kernel (and compacted for, where ``defrag`` is ``madvise``), so the LM head of gpt-h256-tinypipe-bf16 (vocab
32,000) spent 85-265 ms of system time in 336-1,183 huge-page faults in most of its forwards and backwards
(31 and 52 ms without them; 4 KiB faults cost it 0-28 ms), and the held-out cases measured, one process each,
6 steps (docs/calib.md, session 10): gpt-h768-zinf-cpu +45.8% -> +6.1%, llama-h768-lazytrain-bf16 +44.9% ->
+1.6%, llama-h2048-tinypipe (the case it was set for) 9.71 -> 9.60 s a step.
"""

from replay.errors import ReplayError, ReplayOom

__all__ = ["ReplayError", "ReplayOom"]
