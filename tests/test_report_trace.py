"""``--trace`` of a replay follows the simulator's trace format: processes named for devices, threads for
streams, no overlapping slices on a thread, counters of per-pool bytes; strict JSON (Perfetto loads it)."""

from __future__ import annotations

import contextlib
import io
import json
from collections import defaultdict
from pathlib import Path

import pytest

from tiersim.cli import main, simulate_main


def strict(text: str) -> dict:
    def bad(name: str) -> None:
        raise AssertionError(f"{name} in a trace: not JSON that Perfetto reads")

    return json.loads(text, parse_constant=bad)


def shape(doc: dict) -> tuple[dict[int, str], set[str], set[str]]:
    """(process names, thread names, counter names) after checking the trace-event invariants."""
    ev = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    slices = [e for e in ev if e["ph"] == "X"]
    per: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in slices:
        assert (e["pid"], e["tid"]) in threads and e["dur"] >= 0 and e["ts"] >= 0
        per[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in per.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(spans, spans[1:], strict=False))  # a stream runs in order
    counters = [e for e in ev if e["ph"] == "C"]
    assert counters and all(e["pid"] in procs and all(isinstance(v, int | float) and v >= 0
                                                      for v in e["args"].values()) for e in counters)
    return procs, set(threads.values()), {e["name"] for e in counters}


def _tiny_plan(path: Path) -> None:
    from policies import get_policy, parse_knobs
    from tiersim.api import JobRequest, make_job
    from workloads import ModelSpec

    model = ModelSpec(name="tiny-gpt", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn=256,
                      vocab=256, max_pos=128, tied_embeddings=True, mlp="gelu", norm="layernorm", bias=True,
                      learned_pos=True)
    job, _ = make_job("a100", model, JobRequest(micro_batch=1, seq_len=32, global_batch=2, precision="bf16",
                                                checkpointing="full", flash_attention=True))
    info = get_policy("zero-offload")
    info.plan(job, parse_knobs(info, {})).save(path)


def test_replay_trace_has_the_simulators_format(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    plan = tmp_path / "plan.json"
    _tiny_plan(plan)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["replay", str(plan), "--steps", "1", "--trace", str(tmp_path / "replay.json"),
                     "--nvme-dir", str(tmp_path)]) == 0
        assert simulate_main(["--plan", str(plan), "--trace", str(tmp_path / "sim.json")]) == 0
    replayed, simulated = (strict((tmp_path / f).read_text()) for f in ("replay.json", "sim.json"))
    r_procs, r_threads, r_counters = shape(replayed)
    s_procs, s_threads, s_counters = shape(simulated)
    # the same processes (devices + memory), threads (streams) and per-pool counters: one viewer, side by side
    assert sorted(r_procs.values()) == sorted(s_procs.values()) == ["cpu", "gpu0", "memory"]
    assert r_threads == s_threads == {"gpu0.compute", "gpu0.h2d", "gpu0.d2h", "cpu.adam0"}
    assert r_counters == s_counters == {"gpu0 bytes", "cpu bytes"}
    assert replayed["otherData"]["sim_method"].startswith("measured by tiersim replay")
