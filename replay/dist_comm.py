"""One rank's side of the real communication of a multi-rank replay (``torch.distributed``).

- collectives: ``all_reduce`` (sum), ``reduce_scatter`` (sum, this rank keeps its contiguous shard),
  ``all_gather`` (shards in rank order), each on the process group of the plan stream that issues it
  (``replay.ranks``: one group per shared stream, so two streams' collectives never cross);
- cross-rank dependencies: a rank publishes the end of a task another rank waits for as a key in the
  rendezvous store; the waiting rank polls for it (a blocking store wait would hold the store client's
  lock and stop this rank's other streams from publishing theirs).

The data of a collective is one flat fp32 tensor (a layer's gradients or parameter shard, as DeepSpeed's
and DDP's flat buckets are), padded to a multiple of the group size.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from replay.errors import ReplayError

KEY_PREFIX = "tiersim/done/"
WAIT_TIMEOUT_S = 600.0
_POLL_MIN_S, _POLL_MAX_S = 2e-5, 1e-3


class Comm:
    def __init__(self, rank: int, world: int, store: Any, groups: dict[str, Any], device: torch.device,
                 run_id: str = ""):
        self.rank = rank
        self.world = world
        self.store = store
        self.groups = groups  # shared stream -> process group
        self.device = device
        self.prefix = f"{KEY_PREFIX}{run_id}/"

    def _group(self, stream: str) -> Any:
        try:
            return self.groups[stream]
        except KeyError:
            raise ReplayError(f"stream {stream!r} has no process group on rank {self.rank}") from None

    # -- collectives -----------------------------------------------------------------------------------
    def all_reduce(self, flat: Tensor, stream: str, op: str = "sum") -> None:
        """``flat`` summed (``op="sum"``) or its elementwise max (``"max"``) over the stream's group, in place."""
        red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        dist.all_reduce(flat, op=red, group=self._group(stream))

    def reduce_scatter(self, flat: Tensor, stream: str, n: int) -> Tensor:
        out = torch.empty(flat.numel() // n, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_single(out, flat, op=dist.ReduceOp.SUM, group=self._group(stream))
        return out

    def all_gather(self, shard: Tensor, stream: str, n: int) -> Tensor:
        out = torch.empty(shard.numel() * n, dtype=shard.dtype, device=shard.device)
        dist.all_gather_single(out, shard.contiguous(), group=self._group(stream))
        return out

    # -- point to point (pipeline stages) -----------------------------------------------------------------
    def send(self, layer: int, data: Tensor, stream: str, peer: int) -> None:
        """The layer index the tensor belongs to, then the tensor (fp32, the receiver knows its shape)."""
        group = self._group(stream)
        dist.send(torch.tensor([layer], dtype=torch.int64, device=data.device), dst=peer, group=group)
        dist.send(data.contiguous(), dst=peer, group=group)

    def recv(self, shape: tuple[int, ...], stream: str, peer: int) -> tuple[int, Tensor]:
        group = self._group(stream)
        head = torch.empty(1, dtype=torch.int64, device=self.device)
        dist.recv(head, src=peer, group=group)
        data = torch.empty(shape, dtype=torch.float32, device=self.device)
        dist.recv(data, src=peer, group=group)
        return int(head.item()), data

    def barrier(self) -> None:
        dist.barrier()

    def common_t0(self) -> float:
        """After the start barrier: rank 0's ``perf_counter`` reading, which every rank on the same host uses
        as its time zero (Linux's monotonic clock is one clock for all processes of a host, whereas each
        rank's own reading after the barrier may lag by a scheduling slice: 10+ ms on a loaded machine);
        a rank on another host uses its own reading (its skew is the barrier's exit skew)."""
        self.barrier()
        mine = time.perf_counter()
        key = self.prefix + "t0"
        if self.rank == 0:
            self.store.set(key, f"{socket.gethostname()} {mine!r}".encode())
            return mine
        host, t0 = bytes(self.store.get(key)).decode().rsplit(" ", 1)
        return float(t0) if host == socket.gethostname() else mine

    # -- cross-rank dependencies -----------------------------------------------------------------------
    def publish(self, uid: str) -> None:
        self.store.set(self.prefix + uid, b"1")

    def wait(self, uids: Iterable[str], abort: Any = None) -> None:
        keys = [self.prefix + u for u in uids]
        if not keys:
            return
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        pause = _POLL_MIN_S
        while not self.store.check(keys):
            if abort is not None and abort.is_set():
                return
            if time.monotonic() > deadline:
                raise ReplayError(f"waited {WAIT_TIMEOUT_S:.0f} s for {uids!r} of another rank (did it fail?)")
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)


def padded(n: int, world: int) -> int:
    """``n`` rounded up to a multiple of ``world``."""
    return -(-n // world) * world
