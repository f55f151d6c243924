"""Tensors on the "nvme" tier: their raw bytes in one file, written and read past the page cache.

The plan prices an NVMe copy at the drive's rate, which ``tiersim calibrate`` measures with ``O_DIRECT``
(``replay.calibrate.measure_disk``), and DeepSpeed's NVMe swapper moves raw tensor bytes with ``O_DIRECT``
asynchronous I/O into aligned, pinned buffers (``deepspeed/ops/csrc/aio``, ``AsyncIOBuilder``; the swap
buffers of ``deepspeed/runtime/swap_tensor``). The runner used ``torch.save`` / ``torch.load``, which pickle
into a zip archive through the page cache: measured on the 2-core validation VM, 0.18-0.38 GB/s written and
0.9-1.8 GB/s read against 1.4-2.5 GB/s written and 2.3-2.5 GB/s read with ``O_DIRECT`` on the same disk, and
a later read may be served from memory, so llama-h1024-zinf-nvme measured 1.9-2.8 s a step against 1.29 s
simulated (docs/calib.md).

:func:`write_tensors` lays the tensors out in one page-aligned buffer (each at a 64-byte offset, the file
rounded up to :data:`ALIGN`), writes it with ``O_DIRECT`` and returns an :class:`NvmeFile` that keeps the
layout in memory (names, dtypes, shapes, offsets), as the swapper keeps its tensors' metadata;
:func:`read_tensors` reads the file back the same way into a fresh buffer and returns views of it. Where the
filesystem refuses ``O_DIRECT`` (tmpfs, some network filesystems) both fall back to buffered I/O with an
``fsync`` after the write and the file's pages dropped (``posix_fadvise DONTNEED``) so the read comes from
the drive: the fallback ``calibrate`` measures with.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

ALIGN = 4096  # O_DIRECT transfers: buffer address, file offset and length in multiples of the block size
OFFSET_ALIGN = 64  # each tensor's bytes start at a multiple of this (any dtype's alignment)

STAGING_KEPT = 4  # staging buffers kept for reuse (one per concurrent transfer: the plan's I/O streams)

__all__ = ["ALIGN", "NvmeFile", "Staging", "read_tensors", "reading", "write_tensors"]


@dataclass(frozen=True)
class NvmeFile:
    """A file of raw tensor bytes and what is in it: (name, dtype, shape, byte offset) per tensor."""

    path: Path
    layout: tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]
    size: int  # the file's bytes (a multiple of ALIGN)
    direct: bool  # written (and read) with O_DIRECT

    @property
    def nbytes(self) -> int:
        """The tensors' own bytes (without the alignment padding)."""
        return sum(_numel(shape) * _itemsize(dtype) for _, dtype, shape, _ in self.layout)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def _direct_flag() -> int:
    return getattr(os, "O_DIRECT", 0)


def _open(path: Path, flags: int, direct: bool | None = None) -> tuple[int, bool]:
    """``os.open`` with O_DIRECT where the filesystem takes it (``direct`` None: try it; True: insist; False:
    buffered); (fd, direct)."""
    flag = _direct_flag()
    if direct is not False and flag:
        try:
            return os.open(path, flags | flag, 0o600), True
        except OSError:  # EINVAL: the filesystem has no direct I/O
            if direct:
                raise
    elif direct:
        raise OSError(f"{path}: this platform has no O_DIRECT")
    return os.open(path, flags, 0o600), False


class Staging:
    """Page-aligned buffers for the transfers, reused as DeepSpeed reuses its swap buffers: a fresh anonymous
    mapping faults in every page it is written (measured on the validation VM: 0.9-1.2 GB/s into a fresh
    96 MiB mapping, 4-9 GB/s into a mapped one), which cost more than the drive. Thread-safe: each transfer
    takes a buffer of its own; at most STAGING_KEPT are kept."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> mmap.mmap:
        """A buffer of at least ``size`` bytes: the smallest kept one that holds it, else a new one."""
        with self._lock:
            fits = [b for b in self._free if len(b) >= size]
            if fits:
                buf = min(fits, key=len)
                self._free.remove(buf)
                return buf
        return mmap.mmap(-1, size)

    def give(self, buf: mmap.mmap) -> None:
        """Hands ``buf`` back; nothing may view it any more (a tensor from ``torch.frombuffer`` does not hold the
        mapping open: closing it under a live view is a segmentation fault). The smallest are unmapped once
        more than STAGING_KEPT are kept."""
        with self._lock:
            self._free.append(buf)
            self._free.sort(key=len, reverse=True)
            drop = self._free[STAGING_KEPT:]
            del self._free[STAGING_KEPT:]
        for b in drop:
            b.close()

    def close(self) -> None:
        with self._lock:
            bufs, self._free = self._free, []
        for b in bufs:
            b.close()


def write_tensors(path: str | os.PathLike[str], tensors: dict[str, Tensor],
                  staging: Staging | None = None, direct: bool | None = None) -> NvmeFile:
    """Write ``tensors`` (on any device) to ``path`` as raw bytes past the page cache (module docstring),
    through a buffer of ``staging`` (None: a fresh one); ``direct``: as :func:`_open` (None: O_DIRECT where
    the filesystem takes it)."""
    layout: list[tuple[str, torch.dtype, tuple[int, ...], int]] = []
    off = 0
    for name, t in tensors.items():
        layout.append((name, t.dtype, tuple(t.shape), off))
        off = _round_up(off + t.numel() * t.element_size(), OFFSET_ALIGN)
    size = max(ALIGN, _round_up(off, ALIGN))
    buf = staging.take(size) if staging is not None else mmap.mmap(-1, size)  # anonymous: page-aligned
    try:
        u8 = torch.frombuffer(buf, dtype=torch.uint8)
        for (_, _, _, o), t in zip(layout, tensors.values(), strict=True):
            n = t.numel() * t.element_size()
            if n:
                u8[o:o + n].copy_(t.detach().reshape(-1).view(torch.uint8))
        del u8
        view = memoryview(buf)[:size]
        try:
            try:
                used = _write_file(Path(path), view, direct)
            except OSError as e:  # a filesystem that takes O_DIRECT at open and refuses the write: buffered
                if direct is not None or e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                used = _write_file(Path(path), view, False)
        finally:
            view.release()
    finally:
        if staging is not None:
            staging.give(buf)
        else:
            buf.close()
    return NvmeFile(Path(path), tuple(layout), size, used)


def _write_file(path: Path, view: memoryview, direct: bool | None) -> bool:
    """Write all of ``view`` to ``path`` (O_DIRECT as :func:`_open`; buffered: fsync, then the pages dropped so
    that a read comes from the drive); whether it went direct."""
    fd, used = _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, direct)
    try:
        done = 0
        while done < len(view):
            n = os.write(fd, view[done:])
            if n <= 0:
                raise OSError(f"{path}: short write ({done} of {len(view)} bytes)")
            done += n
        if not used:
            os.fsync(fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return used


def _read_into(f: NvmeFile, buf: mmap.mmap) -> dict[str, Tensor]:
    fd, _ = _open(f.path, os.O_RDONLY, f.direct)  # as written (a buffered file's pages were dropped)
    try:
        view = memoryview(buf)[:f.size]
        done = 0
        while done < f.size:
            n = os.readv(fd, [view[done:]])
            if n <= 0:
                raise OSError(f"{f.path}: short read ({done} of {f.size} bytes): the file was cut")
            done += n
        view.release()
    finally:
        os.close(fd)
    u8 = torch.frombuffer(buf, dtype=torch.uint8)
    return {name: u8[off:off + _numel(shape) * _itemsize(dtype)].view(dtype).view(shape)
            for name, dtype, shape, off in f.layout}


@contextmanager
def reading(f: NvmeFile, staging: Staging) -> Iterator[dict[str, Tensor]]:
    """The tensors of ``f``, read past the page cache into a buffer of ``staging``: views of it, valid inside
    the block only (copy them out there; the buffer is reused after it)."""
    buf = staging.take(f.size)
    try:
        yield _read_into(f, buf)
    finally:
        staging.give(buf)


def read_tensors(f: NvmeFile, device: torch.device | None = None) -> dict[str, Tensor]:
    """The tensors of ``f``, read past the page cache into a fresh buffer (on the CPU: views of it, which
    keep it alive; else copied to ``device``)."""
    out = _read_into(f, mmap.mmap(-1, f.size))
    if device is None or device.type == "cpu":
        return out
    return {k: t.to(device) for k, t in out.items()}
