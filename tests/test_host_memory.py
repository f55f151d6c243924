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
    with keep_freed_memory("cpu") as kept:
        assert kept
        _faults_of_fresh_tensors(12, numel)  # the heap grows for the first few (by where its free space lies)
        reused = _faults_of_fresh_tensors(8, numel)
    assert reused < pages, reused  # then eight allocations fault fewer pages than one fresh one


_FAULTS = """
import resource, sys
import replay  # sets THP_MEM_ALLOC_ENABLE unless the caller did, before torch loads
import torch
from replay.host_memory import keep_freed_memory
numel = 64 * 2**20 // 4
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
with keep_freed_memory("cpu"):
    t = torch.empty(numel); t.fill_(1.0); del t
    before = faults()
    for _ in range(4):
        t = torch.empty(numel); t.fill_(1.0); del t
import os
print(os.environ["THP_MEM_ALLOC_ENABLE"], faults() - before)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
@pytest.mark.parametrize("thp", [None, "0"])
def test_importing_replay_makes_torch_reuse_a_freed_large_tensor(thp: str | None) -> None:
    """torch's 64-byte-aligned large tensors do not reuse the chunk a freed one left (glibc posix_memalign asks for
    a little more; measured here: 105k faults per 412 MB tensor, every time); with THP_MEM_ALLOC_ENABLE (set by
    ``import replay`` unless the user set it) they do. A user's own 0 is kept."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if thp is not None:
        env["THP_MEM_ALLOC_ENABLE"] = thp
    out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    setting, faults = out.stdout.split()[-2:]
    if thp is None:
        assert setting == "1"
        assert int(faults) < 64 * 2**20 // 4096, faults  # four more tensors fault fewer pages than one afresh
    else:
        assert setting == "0"  # the user's own setting is kept


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
