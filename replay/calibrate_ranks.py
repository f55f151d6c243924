"""What N ranks on this machine share, for ``tiersim calibrate --ranks N`` (issue 12 item 2).

A multi-rank replay on a CPU-only machine runs one process per rank (``torch.distributed``, gloo). The ranks
share the host: its cores (each rank's "GPU" compute runs one intra-op thread, ``replay.threads``, beside its
copy and optimizer threads), its memory bandwidth (every gpu <-> cpu copy is a host memcpy) and the gloo
collectives between them. Measured here with N real processes, as the replay runs them:

- **collective**: ``dist.all_reduce`` (gloo) of a large buffer in the precision's dtype (what the runner reduces:
  ``Precision.wire_gradients`` sends 16-bit gradients in a 16-bit plan), median of repeats after a barrier; a ring
  all-reduce over N ranks sends ``2 (N - 1) / N`` of the bytes per rank (``costs.collective``), so the rate per
  direction is that over the time. Its latency: a 4-byte all-reduce / its ``2 (N - 1)`` ring steps. A ring
  reduce-scatter or all-gather of the same buffer sends half an all-reduce's bytes, but gloo's (as the runner
  calls them, ``replay.dist_comm``) do not run as rings: two ranks here, 64 MiB fp32, 2026-12-04, took 1.5x and
  0.95x the all-reduce's time (the same in bf16 and fp16), i.e. 3.0x and 1.9x a ring's bytes at the all-reduce's
  rate (3.97x and 2.85x as this module measured them for the validation, latency taken off); both are timed on
  the same buffer and written as ``nvlink.reduce_scatter_bytes`` / ``all_gather_bytes``
  (``hardware_models.NvlinkSpec``), so the simulator prices the collectives the replay runs. The all-reduce's own
  rate depends on the dtype, since gloo sums on the CPU: 64 MiB took 61 ms in fp32, 65 ms in bf16 and 99 ms in fp16
  (1 MiB: 1.5, 1.1 and 3.5 ms; two ranks, 2026-12-04, a throwaway script), so each precision's spec is timed in
  that precision, as its GEMM rates are;
- **compute while the others compute**: every rank runs the same linear layer as the runner computes it
  (``replay.precision.linear_rate_op``) at once; the ratio of that rate to one rank alone scales the peaks;
- **copies while the others copy**: every rank copies a buffer between two host tensors at once; the total
  over all ranks is what their copies share.

Both shared rates are the median over ``repeats`` windows of ``share_s`` seconds in which every rank loops the same
operation back to back after a barrier, alternated with as many solo windows on rank 0 (so that both sample the
host's same minutes), not single timed calls after a barrier each: a 64 MiB copy takes 4-6 ms here, about what the
ranks' release from a gloo barrier can differ by, so timed one at a time the ranks' copies overlapped only partly,
and the bf16 spec of 2026-12-05 04:32 got a memory share of 0.985 where the fp32 one of 04:59 got 0.636. Three runs
of both methods, two ranks, one minute (2026-12-05, 05:45 UTC, a throwaway script): single calls 0.805, 0.600,
0.705; a 0.4 s window 0.548, 0.513, 0.662 (the GEMM's share 0.94-1.0 either way).

Each function takes its sizes as parameters so that tests run in seconds; nothing runs at import time.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from replay.precision import TORCH_DTYPES, linear_rate_op
from replay.threads import CPU_OP_THREADS

__all__ = ["RanksCalibration", "measure_ranks"]


@dataclass(frozen=True)
class RanksCalibration:
    """What ``ranks`` processes on this host measured together (bytes, seconds, FLOP/s, bytes/s)."""

    ranks: int
    allreduce_bytes: int
    allreduce_s: float           # median seconds of one all_reduce of allreduce_bytes
    collective_bw: float         # bytes/s per direction per rank (ring: 2 (n-1)/n x bytes / time)
    collective_latency_s: float  # per ring step, from a 4-byte all_reduce
    gemm_alone: float            # FLOP/s of one rank's linear layer with the others idle
    gemm_shared: float           # FLOP/s of one rank's linear layer while every rank computes (median over ranks)
    copy_alone: float            # bytes/s of one rank's host copy, the others idle
    copy_shared_total: float     # bytes/s of all ranks' copies at once, summed
    precision: str
    method: str
    reduce_scatter_s: float = 0.0  # median seconds of one reduce_scatter of allreduce_bytes (0: not measured)
    all_gather_s: float = 0.0      # median seconds of one all_gather into allreduce_bytes (0: not measured)

    def _ring_multiple(self, seconds: float) -> float:
        """A reduce-scatter's or all-gather's time as a multiple of what a ring of the same buffer takes at the
        all-reduce's rate (its ``(n-1)/n`` of the bytes per rank, ``n - 1`` latency steps); 1 where not measured."""
        if seconds <= 0:
            return 1.0
        n = self.ranks
        ring_s = self.allreduce_bytes * (n - 1) / n / self.collective_bw
        return max(seconds - (n - 1) * self.collective_latency_s, 1e-9) / ring_s

    @property
    def reduce_scatter_bytes(self) -> float:
        return self._ring_multiple(self.reduce_scatter_s)

    @property
    def all_gather_bytes(self) -> float:
        return self._ring_multiple(self.all_gather_s)

    @property
    def compute_share(self) -> float:
        """The fraction of its solo rate one rank computes at while every rank computes (<= 1)."""
        return min(1.0, self.gemm_shared / self.gemm_alone) if self.gemm_alone > 0 else 1.0

    @property
    def memory_share(self) -> float:
        """The fraction of its solo memory bandwidth one rank gets while every rank streams memory (<= 1): the
        ranks' host copies at once against one alone. Every rank's memory-bound work (element-wise operators,
        a kernel held to its operands' traffic) runs over the same memory bus as their copies."""
        if self.copy_alone <= 0:
            return 1.0
        return min(1.0, self.copy_shared_total / (self.ranks * self.copy_alone))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median_s(fn: Any, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` (a collective), each after a barrier, after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rate_over(fn: Any, work: float, seconds: float) -> float:
    """``work`` units per call of ``fn`` over a window of at least ``seconds`` (and 3 calls) of calls back to back,
    after one warm-up call: units/s."""
    fn()
    calls, t0 = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - t0 < seconds:
        fn()
        calls += 1
    return work * calls / (time.perf_counter() - t0)


def _alone_and_shared(fn: Any, work: float, rank: int, seconds: float, windows: int) -> tuple[float, float]:
    """``fn``'s rate on rank 0 with the others waiting (0.0 on the others), and on every rank at once: the
    medians of ``windows`` windows of each, alternated so that both sample the host's same minutes."""
    alone, shared = [], []
    for _ in range(windows):
        alone.append(_rate_over(fn, work, seconds) if rank == 0 else 0.0)
        dist.barrier()
        shared.append(_rate_over(fn, work, seconds))
        dist.barrier()  # no rank starts the next window while another still loops this one
    return statistics.median(alone), statistics.median(shared)


def _rank_main(rank: int, n: int, rdzv: str, sizes: dict[str, Any], precision: str, out: Any) -> None:
    torch.set_num_threads(CPU_OP_THREADS)  # as the runner's ranks compute (replay.threads)
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=n)
    try:
        reps = sizes["repeats"]
        dtype = TORCH_DTYPES[precision]  # the gradients' wire dtype (Precision.wire_gradients)
        buf = torch.ones(sizes["allreduce_bytes"] // dtype.itemsize, dtype=dtype)
        t_ar = _median_s(lambda: dist.all_reduce(buf), reps)
        shard = torch.empty(buf.numel() // n, dtype=dtype)  # whole shards: allreduce_bytes is a multiple of 4 n
        t_rs = _median_s(lambda: dist.reduce_scatter_single(shard, buf, op=dist.ReduceOp.SUM), reps)
        t_ag = _median_s(lambda: dist.all_gather_single(buf, shard), reps)
        tiny = torch.ones(1)
        t_small = _median_s(lambda: dist.all_reduce(tiny), max(reps, 10))
        k = sizes["gemm_n"]
        op = linear_rate_op(torch.device("cpu"), precision, k, k, k)
        alone, shared = _alone_and_shared(op, 2.0 * k**3, rank, sizes["share_s"], reps)
        a = torch.ones(sizes["copy_bytes"] // 4)
        b = torch.empty_like(a)
        copy_alone, copy_shared = _alone_and_shared(lambda: b.copy_(a), a.numel() * 4, rank, sizes["share_s"], reps)
        gathered: list[Any] = [None] * n
        dist.all_gather_object(gathered, (t_ar, t_small, alone, shared, copy_alone, copy_shared, t_rs, t_ag))
        if rank == 0:
            out.put(gathered)
    finally:
        dist.destroy_process_group()


def measure_ranks(ranks: int = 2, precision: str = "fp32", allreduce_bytes: int = 64 * 2**20,
                  gemm_n: int = 1024, copy_bytes: int = 64 * 2**20, repeats: int = 5, share_s: float = 0.2,
                  timeout_s: float = 600.0) -> RanksCalibration:
    """Run ``ranks`` local processes (spawned, gloo, a file rendezvous in a private temporary folder) and
    measure what they share (``share_s``: each window the compute and copy rates are taken over); RuntimeError
    when a rank fails or they do not finish within ``timeout_s``."""
    if ranks < 2:
        raise ValueError(f"ranks must be >= 2 to measure what ranks share, got {ranks}")
    allreduce_bytes -= allreduce_bytes % (4 * ranks)  # whole shards of any dtype, one per rank
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    sizes = {"allreduce_bytes": allreduce_bytes, "gemm_n": gemm_n, "copy_bytes": copy_bytes, "repeats": repeats,
             "share_s": share_s}
    with tempfile.TemporaryDirectory(prefix="tiersim-ranks-") as tmp:
        rdzv = str(Path(tmp) / "rendezvous")
        procs = [ctx.Process(target=_rank_main, args=(r, ranks, rdzv, sizes, precision, out), daemon=True)
                 for r in range(ranks)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        try:
            got = out.get(timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 - queue.Empty: a rank died or hung
            raise RuntimeError(f"calibrate --ranks {ranks}: the ranks did not report within {timeout_s:.0f} s "
                               f"(exit codes {[p.exitcode for p in procs]})") from e
        finally:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
                if p.is_alive():
                    p.terminate()
    t_ar = statistics.median(g[0] for g in got)
    t_small = statistics.median(g[1] for g in got)
    steps = 2 * (ranks - 1)
    per_rank = allreduce_bytes * steps / ranks
    latency = t_small / steps
    return RanksCalibration(
        ranks=ranks, allreduce_bytes=allreduce_bytes, allreduce_s=t_ar,
        collective_bw=per_rank / max(t_ar - steps * latency, 1e-9), collective_latency_s=latency,
        gemm_alone=got[0][2], gemm_shared=statistics.median(g[3] for g in got), copy_alone=got[0][4],
        copy_shared_total=sum(g[5] for g in got), precision=precision,
        reduce_scatter_s=statistics.median(g[6] for g in got), all_gather_s=statistics.median(g[7] for g in got),
        method=(f"{ranks} local processes (torch.multiprocessing spawn, torch.distributed gloo, "
                f"{CPU_OP_THREADS} intra-op thread each as the runner's ranks; pid {os.getpid()} launched them)"))
