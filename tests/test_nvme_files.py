"""replay.nvme_files: tensors on the "nvme" tier as raw bytes written and read past the page cache (O_DIRECT
where the filesystem takes it, else buffered with fsync and the pages dropped), bit for bit."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from replay import nvme_files  # noqa: E402
from replay.nvme_files import ALIGN, read_tensors, write_tensors  # noqa: E402
from replay.pools import Pools  # noqa: E402


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "w": torch.randn(37, 53, generator=g),
        "b": torch.randn(53, generator=g).to(torch.bfloat16),
        "h": torch.randn(5, 3, generator=g).to(torch.float16).t(),  # not contiguous
        "s": torch.tensor(2.5),  # 0-dim
        "e": torch.empty(0, 4),  # no bytes
        "i": torch.arange(7, dtype=torch.int64),
    }


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)


def test_tensors_round_trip_bit_for_bit(tmp_path: Path) -> None:
    t = _tensors()
    f = write_tensors(tmp_path / "x.bin", t)
    assert f.size % ALIGN == 0 and os.path.getsize(f.path) == f.size
    assert f.nbytes == sum(v.numel() * v.element_size() for v in t.values())
    assert all(off % nvme_files.OFFSET_ALIGN == 0 for _, _, _, off in f.layout)
    assert _same(read_tensors(f), t)


def test_direct_io_where_the_filesystem_takes_it_else_buffered_and_the_same_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = _tensors()
    f = write_tensors(tmp_path / "d.bin", t)
    takes_direct = False
    if getattr(os, "O_DIRECT", 0):  # does this filesystem take it (tmpfs and some overlays do not)?
        try:
            os.close(os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
            takes_direct = True
        except OSError:
            pass
    assert f.direct == takes_direct
    monkeypatch.setattr(nvme_files, "_direct_flag", lambda: 0)  # a filesystem without O_DIRECT
    g = write_tensors(tmp_path / "b.bin", t)
    assert not g.direct and _same(read_tensors(g), t)
    assert f.path.read_bytes() == g.path.read_bytes()  # one layout, whichever way it was written


def test_a_cut_file_is_a_clear_error(tmp_path: Path) -> None:
    f = write_tensors(tmp_path / "c.bin", {"w": torch.ones(3 * ALIGN)})
    with open(f.path, "r+b") as fh:
        fh.truncate(ALIGN)
    with pytest.raises(OSError, match="short read .* the file was cut"):
        read_tensors(f)


def test_pools_keep_nvme_tensors_in_files_and_remove_them(tmp_path: Path) -> None:
    pools = Pools(torch.device("cpu"), tmp_path)
    t = _tensors()
    held = pools.put("nvme", t, "layer 3/grads")
    assert not isinstance(held, dict) and held.path.parent == tmp_path and held.path.exists()
    assert _same(pools.get(held, "cpu"), t)
    pools.recycle(held)
    assert not held.path.exists()


def test_a_direct_write_refused_after_open_falls_back_to_buffered(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Some filesystems take O_DIRECT at open and refuse the write (EINVAL): the file is written buffered
    (fsync, pages dropped) and read back the same way."""
    real = nvme_files._write_file

    def refuse(path: Path, view: memoryview, direct: bool | None) -> bool:
        if direct is not False:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, view, direct)

    monkeypatch.setattr(nvme_files, "_write_file", refuse)
    t = _tensors()
    f = write_tensors(tmp_path / "x.bin", t)
    assert not f.direct and _same(read_tensors(f), t)
    with pytest.raises(OSError):  # asked for O_DIRECT outright: no fallback
        write_tensors(tmp_path / "y.bin", t, direct=True)
