"""replay.host_memory: freed host memory stays in the process during a CPU replay (glibc), restored after."""

from __future__ import annotations

import resource

import pytest

torch = pytest.importorskip("torch")

from replay.host_memory import RESERVE_FACTOR, _libc, host_reserve_bytes, keep_freed_memory  # noqa: E402

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
    # with a reserve faulted in first, as a replay's (host_reserve_bytes): without one the heap still grew by a
    # tensor or two within the eight measured here now and then (32768 faults in one of 4-6 runs, 2026-12-05)
    with keep_freed_memory("cpu", 2**30) as kept:
        assert kept
        _faults_of_fresh_tensors(12, numel)  # the heap grows for the first few (by where its free space lies)
        reused = _faults_of_fresh_tensors(8, numel)
    assert reused < pages, reused  # then eight allocations fault fewer pages than one fresh one


_FAULTS = """
import os, resource
import replay  # leaves THP_MEM_ALLOC_ENABLE as the caller set it
import torch
from replay.host_memory import keep_freed_memory
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
with keep_freed_memory("cpu"):
    for _ in range(12):  # the heap grows for the first few
        t = torch.empty(64 * 2**20 // 4); t.fill_(1.0); del t
    before = faults()
    for _ in range(8):  # an LM head's step: logits, their fp32 copy and gradient, of three sizes
        a = torch.empty(24 * 2**20 // 4); a.fill_(1.0)
        b = torch.empty(48 * 2**20 // 4); b.fill_(1.0)
        c = torch.empty(40 * 2**20 // 4); c.fill_(1.0)
        del a, b, c
print(os.environ.get("THP_MEM_ALLOC_ENABLE", "unset"), faults() - before)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
def test_importing_replay_keeps_the_callers_huge_page_setting_and_reuses_freed_tensors() -> None:
    """``import replay`` does not turn torch's transparent huge pages on (a user's setting is theirs): with them,
    every large tensor that is not reused faults 2 MiB pages in, each zeroed (measured: 85-265 ms of system time in
    most LM-head forwards and backwards of gpt-h256-tinypipe-bf16, replay/__init__.py). Without them, under
    ``keep_freed_memory``, eight rounds of three large tensors of different sizes reuse freed memory: they fault in
    fewer pages than one round's tensors hold."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    setting, faults = out.stdout.split()[-2:]
    assert setting == "unset"
    assert int(faults) < (24 + 48 + 40) * 2**20 // 4096, faults


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
    assert calls == [(-4, 0), (-1, -1), (-4, 65536), (-1, 128 * 1024)]  # -1: trimming off (mallopt(3))


def test_nothing_changes_off_the_cpu() -> None:
    with keep_freed_memory("cuda") as kept:
        assert kept is False


_RESERVED = """
import resource, torch
from replay.host_memory import keep_freed_memory
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
with keep_freed_memory("cpu", RESERVE):
    reserved = faults() - before
    before = faults()
    for n in (96, 160, 64, 128, 200):  # tensors of five sizes (MiB), all alive at once, then all freed
        ts = [torch.empty(m * 2**20 // 4).fill_(1.0) for m in (n, n // 2, n // 4)]
        del ts
    used = faults() - before
print(reserved, used)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
@pytest.mark.parametrize("reserve_mib", [0, 1024])
def test_a_reserve_faults_the_heap_in_before_the_work(reserve_mib: int) -> None:
    """``reserve_bytes`` faults that much heap in on entry, kept (not trimmed, even above 2 GiB is the rule; 1 GiB
    here): tensors of several sizes inside then fault few pages, where without a reserve the first of each size
    faults all of its own (a fresh process each, so the heap starts as a replay's does)."""
    import subprocess
    import sys

    code = _RESERVED.replace("RESERVE", str(reserve_mib * 2**20))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    reserved, used = (int(x) for x in out.stdout.split()[-2:])
    biggest = (200 + 100 + 50) * 2**20 // 4096  # the pages of the largest round alone
    if reserve_mib:
        assert reserved >= reserve_mib * 2**20 // 4096 * 0.9, reserved  # every page written once, up front
        assert used < biggest // 10, used
    else:
        assert reserved < 1000 and used > biggest // 2, (reserved, used)


def test_reserve_is_sized_from_the_priced_peaks_and_capped_by_the_available_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}[name])
    assert host_reserve_bytes(100_000) == int(RESERVE_FACTOR * 100_000)
    assert host_reserve_bytes(3_000_000) == 1000 * 4096 // 2  # at most half of what is available
    assert host_reserve_bytes(10**9) == 0  # more than there is: the replay cannot hold it, nothing reserved
    assert host_reserve_bytes(0) == 0


_THREAD_FAULTS = """
import resource, threading
import torch
from replay.host_memory import keep_freed_memory
got = []
def work():
    torch.set_num_threads(1)
    for _ in range(6):  # the heap grows for the first few
        t = torch.empty(96 * 2**20 // 4); t.fill_(1.0); del t
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(4):  # a large gradient flattened on a collective stream, step after step
        t = torch.empty(96 * 2**20 // 4); t.fill_(1.0); del t
    got.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
with keep_freed_memory("cpu", 2**30):  # a reserve, as a replay faults one in (host_reserve_bytes)
    th = threading.Thread(target=work); th.start(); th.join()
print(got[0])
"""


def _thread_faults(arena: bool) -> int:
    import subprocess
    import sys

    from replay.host_memory import one_malloc_arena

    if arena:
        with one_malloc_arena():
            out = subprocess.run([sys.executable, "-c", _THREAD_FAULTS], capture_output=True, text=True, timeout=120,
                                 check=True)
    else:
        env = {k: v for k, v in __import__("os").environ.items() if k != "MALLOC_ARENA_MAX"}
        out = subprocess.run([sys.executable, "-c", _THREAD_FAULTS], env=env, capture_output=True, text=True,
                             timeout=120, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not GLIBC or not hasattr(resource, "RUSAGE_THREAD"), reason="glibc on Linux only")
def test_a_worker_threads_large_tensors_are_reused_in_one_arena() -> None:
    """A worker thread's request above its arena's 64 MiB heaps is mmapped afresh whatever ``keep_freed_memory``
    says (glibc's sysmalloc for a non-main arena), and the reserve faulted into the main arena does not serve it:
    four 96 MiB tensors fault every page in each time. A process started within ``one_malloc_arena`` (as the
    replay's are: replay.dist_launch, replay.isolated) allocates every thread's memory from the main arena, where
    the reserve and freed memory are kept: four fault fewer pages than one holds."""
    pages = 96 * 2**20 // 4096
    assert _thread_faults(arena=False) >= 4 * pages * 0.9  # the mechanism: fresh pages each time
    assert _thread_faults(arena=True) < pages


def test_one_malloc_arena_sets_the_variable_for_the_block_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from replay.host_memory import ARENA_ENV, one_malloc_arena

    monkeypatch.delenv(ARENA_ENV, raising=False)
    with one_malloc_arena():
        assert os.environ[ARENA_ENV] == "1"
    assert ARENA_ENV not in os.environ
    monkeypatch.setenv(ARENA_ENV, "4")  # a user's own setting is theirs
    with one_malloc_arena():
        assert os.environ[ARENA_ENV] == "4"
    assert os.environ[ARENA_ENV] == "4"
