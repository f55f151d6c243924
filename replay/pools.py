"""Where real tensors live: ``gpu*`` on the compute device, ``cpu`` in (pinned) host memory, ``nvme`` in
files of a directory, written and read for real, past the page cache (``replay.nvme_files``).

Buffers are recycled, as a caching allocator does: a tensor handed back with :meth:`Pools.recycle` (its
owner guarantees nothing else uses it) is reused by the next :meth:`Pools.put` of the same device, dtype and
shape, so a copy writes into memory that is already mapped (and pinned) instead of a fresh allocation, whose
page faults (and pinning) cost more than the copy itself for the few-MB tensors of a layer. A key keeps at most
as many spares as :meth:`Pools.put` ever had out at once for it (none for a key it never copied to): gradients
that autograd made and the optimizer hands back are otherwise never taken again (a plan that copies nothing, such
as ``none``, grew by its parameters' bytes every micro-step: 5 GB after 3 steps of a 117 M-parameter model,
every new page a fault). The plan's memory accounting is the runner's (``MemoryTracker``), not this cache's.
"""

from __future__ import annotations

import itertools
import re
import shutil
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import torch
from torch import Tensor

from replay.nvme_files import NvmeFile, Staging, reading, write_tensors

# how many tensors share a storage (torch's own; private, so absent in a future torch means: never reclaim)
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _unused(kept: list[Tensor], j: int) -> bool:
    """Does nothing but ``kept`` hold ``kept[j]``: no Python reference (a parameter dict a running task still
    holds, a module attribute), no autograd graph that saved it (its TensorImpl's use count), no view of its
    storage? Unknown (an API this torch lacks): no."""
    if _USE_COUNT is None or not hasattr(Tensor, "_use_count"):
        return False
    t = kept[j]
    # the references: kept's, this frame's ``t`` and getrefcount's argument
    if sys.getrefcount(t) > 3 or t._use_count() != 1:  # type: ignore[attr-defined]
        return False
    return bool(_USE_COUNT(t.untyped_storage()._cdata) <= 2)


Held = dict[str, Tensor] | NvmeFile  # tensors in memory, or the file holding them on "nvme" (replay.nvme_files)
Key = tuple[str, torch.dtype, tuple[int, ...]]  # a spare buffer's device (":pinned"), dtype and shape


class Pools:
    def __init__(self, device: torch.device, nvme_dir: str | Path | None = None):
        self.device = device
        self.pin = device.type == "cuda"
        self._nvme_dir = Path(nvme_dir) if nvme_dir is not None else None
        self._tmp: Path | None = None
        self._ids = itertools.count()
        # the ranks of a multi-rank replay share one --nvme-dir: each Pools names its files apart
        self._prefix = uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._free: dict[Key, list[Tensor]] = {}
        self._out: dict[Key, int] = {}  # tensors put() handed out and not handed back yet
        self._cap: dict[Key, int] = {}  # the most put() had out at once: the spares worth keeping
        self._retired: dict[Key, list[Tensor]] = {}  # handed back while maybe still in use (retire)
        self._staging = Staging()  # the nvme files' transfer buffers (replay.nvme_files)

    def torch_device(self, loc: str) -> torch.device:
        if loc.startswith("gpu"):
            return self.device
        return torch.device("cpu")

    def nvme_dir(self) -> Path:
        with self._lock:
            if self._nvme_dir is None:
                self._tmp = Path(tempfile.mkdtemp(prefix="tiersim-replay-nvme-"))
                self._nvme_dir = self._tmp
            return self._nvme_dir

    def put(self, loc: str, tensors: dict[str, Tensor], name: str) -> Held:
        """Copies ``tensors`` to ``loc`` (a file there for nvme) and returns what holds them."""
        if loc == "nvme":
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
            path = self.nvme_dir() / f"{safe}.{self._prefix}.{next(self._ids)}.bin"
            return write_tensors(path, tensors, self._staging)
        dev = self.torch_device(loc)
        pin = self.pin and loc == "cpu"
        out = {}
        for k, v in tensors.items():
            key = (str(dev) + (":pinned" if pin else ""), v.dtype, tuple(v.shape))
            with self._lock:
                spare = self._free.get(key)
                t = spare.pop() if spare else self._reclaim(key)
                self._out[key] = self._out.get(key, 0) + 1
                self._cap[key] = max(self._cap.get(key, 0), self._out[key])
            if t is None:
                t = torch.empty(v.shape, dtype=v.dtype, device=dev, pin_memory=pin)
            out[k] = t.copy_(v.detach(), non_blocking=pin)
        return out

    def recycle(self, held: Held | None) -> None:
        """Hands back the buffers of ``held`` (which nothing else uses any more) for reuse by :meth:`put`;
        a file on nvme is removed."""
        self._hand_back(held, retired=False)

    def retire(self, held: Held | None) -> None:
        """Hands back the buffers of ``held`` that something else may still use (a parameter version an
        autograd graph may still hold): each is reused by :meth:`put` only once nothing but this pool holds its
        storage (at most as many kept per key as :meth:`recycle` keeps spares; a file on nvme is removed)."""
        self._hand_back(held, retired=True)

    def _hand_back(self, held: Held | None, retired: bool) -> None:
        if held is None or isinstance(held, NvmeFile):
            self.drop(held)
            return
        with self._lock:
            for t in held.values():
                pinned = t.device.type == "cpu" and self.pin and t.is_pinned()
                key = (str(t.device) + (":pinned" if pinned else ""), t.dtype, tuple(t.shape))
                self._out[key] = max(0, self._out.get(key, 0) - 1)
                cap = self._cap.get(key, 0)
                if retired:
                    kept = self._retired.setdefault(key, [])
                    kept.append(t)
                    del kept[:max(0, len(kept) - cap)]  # the oldest go back to the allocator
                else:
                    spare = self._free.setdefault(key, [])
                    if len(spare) < cap:
                        spare.append(t)

    def _reclaim(self, key: Key) -> Tensor | None:
        """Under the lock: a retired buffer of ``key`` that nothing else holds any more, taken; else None."""
        kept = self._retired.get(key, [])
        for j in range(len(kept)):
            if _unused(kept, j):
                return kept.pop(j)
        return None

    def get(self, held: Held, loc: str) -> dict[str, Tensor]:
        """The tensors of ``held`` on ``loc``'s device (read from the file for nvme)."""
        dev = self.torch_device(loc)
        if isinstance(held, NvmeFile):  # into this pool's buffers of the tensors' shapes (recycle hands them back)
            with reading(held, self._staging) as views:
                out = self.put(loc if loc != "nvme" else "cpu", views, "")
                del views  # no view of the staging buffer outlives its transfer
            assert isinstance(out, dict)
            return out
        return {k: v.to(dev) for k, v in held.items()}

    @staticmethod
    def drop(held: Held | None) -> None:
        if isinstance(held, NvmeFile):
            held.path.unlink(missing_ok=True)

    @staticmethod
    def nbytes(tensors: dict[str, Tensor]) -> int:
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def close(self) -> None:
        with self._lock:
            self._free.clear()
            self._out.clear()
            self._cap.clear()
            self._retired.clear()
        self._staging.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
