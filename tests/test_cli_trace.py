"""`--trace`: Chrome / Perfetto trace-event JSON (the format torch.profiler writes).

What Perfetto's JSON importer needs: a ``traceEvents`` list; complete events (``ph: X``) with name, pid,
tid, ts and dur >= 0 in microseconds, properly nested per thread (here: never overlapping, since a
stream runs its tasks in order); metadata naming every process and thread used; counters (``ph: C``)
with numeric args. Strict JSON: no NaN or Infinity.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tiersim.cli import simulate_main

CASES = {
    "offload": ["--hw", "a100", "--model", "gpt2", "--policy", "zero-offload"],
    "8 GPUs": ["--hw", "a100x8", "--model", "gpt2", "--policy", "zero-offload"],
    "oom": ["--hw", "a100", "--model", "gpt2", "--policy", "none", "--micro-batch", "256",
            "--checkpointing", "none"],
}


def _strict(text: str) -> Any:
    def bad_constant(name: str) -> Any:
        raise AssertionError(f"trace contains {name}, which Perfetto's JSON parser rejects")

    return json.loads(text, parse_constant=bad_constant)


@pytest.fixture(scope="module", params=list(CASES))
def traced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, str]:
    """(trace document, the --json result of the same run, case name)."""
    path = tmp_path_factory.mktemp("trace") / "t.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = simulate_main([*CASES[request.param], "--trace", str(path), "--json"])
    result = _strict(out.getvalue())  # exactly one JSON object on stdout, the trace went to the file
    assert rc == (3 if request.param == "oom" else 0)
    return _strict(path.read_text()), result, request.param


def _events(doc: dict, ph: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph]


def test_document_shape(traced: tuple[dict, dict, str]) -> None:
    doc, result, _ = traced
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    assert all(isinstance(e, dict) and isinstance(e.get("ph"), str) for e in doc["traceEvents"])
    assert {e["ph"] for e in doc["traceEvents"]} <= {"X", "M", "C"}
    assert doc["otherData"]["policy"] == result["policy"]
    assert doc["otherData"]["hardware"] == result["hardware"]


def test_complete_events(traced: tuple[dict, dict, str]) -> None:
    doc, _, _ = traced
    xs = _events(doc, "X")
    assert xs
    for e in xs:
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        for k in ("ts", "dur"):
            assert isinstance(e[k], int | float) and math.isfinite(e[k]), (k, e)
        assert e["ts"] >= 0 and e["dur"] >= 0, e
    assert any(e["dur"] > 0 for e in xs)


def test_every_process_and_thread_is_named(traced: tuple[dict, dict, str]) -> None:
    doc, _, _ = traced
    meta = _events(doc, "M")
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    used_pids = {e["pid"] for e in doc["traceEvents"]}
    assert used_pids <= set(processes), used_pids - set(processes)
    used_threads = {(e["pid"], e["tid"]) for e in _events(doc, "X")}
    assert used_threads <= set(threads), used_threads - set(threads)
    assert len(set(processes.values())) == len(processes)  # no two processes share a name
    for (pid, _), stream in threads.items():  # a stream sits in its device's process (gpu0.h2d in gpu0)
        device = processes[pid]
        assert stream.startswith(device + ".") or device.startswith("gpu"), (device, stream)


def test_threads_never_overlap(traced: tuple[dict, dict, str]) -> None:
    """Perfetto drops improperly nested slices; tasks on one stream run one after another."""
    doc, _, _ = traced
    by_thread: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in _events(doc, "X"):
        by_thread[(e["pid"], e["tid"])].append(e)
    for key, evs in by_thread.items():
        evs.sort(key=lambda e: (e["ts"], e["dur"]))
        for a, b in zip(evs, evs[1:], strict=False):
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-3, (key, a["name"], b["name"])


def test_memory_counters_match_the_peaks(traced: tuple[dict, dict, str]) -> None:
    doc, result, _ = traced
    cs = _events(doc, "C")
    pools_used = {p for p, peak in result["peak_bytes"].items() if peak > 0}
    assert pools_used and {c["name"] for c in cs} >= {f"{p} bytes" for p in pools_used}
    peak_seen: dict[str, float] = defaultdict(float)
    for c in cs:
        assert isinstance(c["pid"], int) and isinstance(c["ts"], int | float) and c["ts"] >= 0
        assert c["args"] and all(isinstance(v, int | float) and v >= 0 for v in c["args"].values()), c
        pool = c["name"].removesuffix(" bytes")
        peak_seen[pool] = max(peak_seen[pool], sum(c["args"].values()))
    for pool in pools_used:
        assert peak_seen[pool] == pytest.approx(result["peak_bytes"][pool], rel=1e-9), pool


def test_transfers_are_on_copy_streams(traced: tuple[dict, dict, str]) -> None:
    doc, result, case = traced
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in _events(doc, "M") if e["name"] == "thread_name"}
    copies = [e for e in _events(doc, "X") if e.get("cat") == "copy"]
    if case == "oom":
        return  # no-offload: nothing to copy
    assert copies and result["link_bytes"]
    assert all(e["args"]["bytes"] > 0 for e in copies)
    assert {threads[(e["pid"], e["tid"])].rsplit(".", 1)[1] for e in copies} <= {"h2d", "d2h", "io"}


def test_trace_written_next_to_a_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = simulate_main([*CASES["offload"], "--trace", str(tmp_path / "t.json"),
                        "--plan-out", str(tmp_path / "p.json")])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "") and "Verdict: FEASIBLE" in out
    assert _strict((tmp_path / "t.json").read_text())["traceEvents"]
    assert _strict((tmp_path / "p.json").read_text())["schema"] == "tiersim.plan"
