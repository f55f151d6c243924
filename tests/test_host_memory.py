"""replay.host_memory: freed host memory stays in the process during a CPU replay (glibc), restored after."""

from __future__ import annotations

import resource

import pytest

torch = pytest.importorskip("torch")

from replay.host_memory import _libc, keep_freed_memory  # noqa: E402

GLIBC = _libc() is not None


def _faults_of_fresh_tensors(n: int, numel: int) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        t = torch.empty(numel, dtype=torch.float32)
        t.fill_(1.0)  # touch every page
        del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
def test_a_freed_large_tensor_is_reused_without_page_faults() -> None:
    numel = 64 * 2**20 // 4  # 64 MiB: above glibc's largest mmap threshold (32 MiB), so mmapped by default
    pages = numel * 4 // 4096
    fresh = _faults_of_fresh_tensors(4, numel)
    assert fresh >= 3 * pages  # each allocation starts on new pages (mmap, unmapped on free)
    with keep_freed_memory("cpu") as kept:
        assert kept
        _faults_of_fresh_tensors(12, numel)  # the heap grows for the first few (by where its free space lies)
        reused = _faults_of_fresh_tensors(8, numel)
    assert reused < pages, (fresh, reused)  # then eight allocations fault fewer pages than one fresh one


def test_glibc_defaults_are_restored_after_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    monkeypatch.setattr("replay.host_memory._libc", lambda: Libc())
    with pytest.raises(RuntimeError), keep_freed_memory("cpu") as kept:  # also when the block fails
        assert kept
        raise RuntimeError
    assert calls == [(-4, 0), (-1, 2**31 - 1), (-4, 65536), (-1, 128 * 1024)]


def test_nothing_changes_off_the_cpu() -> None:
    with keep_freed_memory("cuda") as kept:
        assert kept is False
