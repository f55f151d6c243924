"""How many CPU threads torch's kernels use while a CPU-only machine stands in for a GPU.

On a CPU-only machine the runner's "GPU" compute, its copies and the CPU optimizer are threads of one
process. With torch's default (one OpenMP thread per core) each Python thread that runs a torch op gets its
own team of threads, and the teams oversubscribe the cores: the same decoder layer ran 2-3x slower in an
offloading replay (copies and Adam in worker threads) than in a plain one (zoff-small backward 15-22 ms
vs none-small 6-8 ms per layer, quiet 2-core VM, 2026-12-02). With ONE thread per op the two agree
(9.1 vs 10.5 ms): the "GPU" is one core and the other cores serve the copy and optimizer streams, as copy
engines and the host CPU do beside a real GPU. Calibration measures under the same setting, so the
simulator is given the rates the replay will see. CUDA replays are unaffected.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

CPU_OP_THREADS = 1


@contextmanager
def cpu_op_threads(device: torch.device, n: int = CPU_OP_THREADS) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads per torch op when ``device`` is the CPU (restored after)."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pin_this_thread(device: torch.device, n: int = CPU_OP_THREADS) -> None:
    """In a worker thread: OpenMP's thread count is per thread, so each worker sets its own."""
    if device.type == "cpu":
        torch.set_num_threads(n)
