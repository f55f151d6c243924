"""Chrome / Perfetto trace-event JSON of a simulated step (the format torch.profiler writes).

One process per device (GPU, CPU, NVMe), one thread per stream, an ``X`` event per task (microseconds),
and ``C`` counter events with the bytes of every memory pool over time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator import Result


def _dev_order(dev: str) -> int:
    if dev.startswith("gpu") and dev[3:].isdigit():
        return int(dev[3:])
    return {"cpu": 1000, "nvme": 1001}.get(dev, 1002)


def trace_events(result: Result) -> list[dict[str, Any]]:
    devices = sorted({r.device for r in result.records}, key=_dev_order)
    pid = {d: i + 1 for i, d in enumerate(devices)}
    streams = sorted({(r.device, r.stream) for r in result.records}, key=lambda x: (_dev_order(x[0]), x[1]))
    tid = {s: i + 1 for i, (_, s) in enumerate(streams)}
    ev: list[dict[str, Any]] = []
    for d in devices:
        ev.append({"ph": "M", "name": "process_name", "pid": pid[d], "tid": 0, "args": {"name": d}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid[d], "tid": 0,
                   "args": {"sort_index": pid[d]}})
    for d, s in streams:
        ev.append({"ph": "M", "name": "thread_name", "pid": pid[d], "tid": tid[s], "args": {"name": s}})
    for r in sorted(result.records, key=lambda r: (r.start, r.stream)):
        args = {"op": r.op, "step": r.step, "iteration": r.iteration, **r.tags}
        if r.bytes:
            args["bytes"] = r.bytes
        ev.append({"ph": "X", "name": r.id, "cat": r.op, "pid": pid[r.device], "tid": tid[r.stream],
                   "ts": r.start * 1e6, "dur": (r.end - r.start) * 1e6, "args": args})
    mem_pid = len(devices) + 1
    ev.append({"ph": "M", "name": "process_name", "pid": mem_pid, "tid": 0, "args": {"name": "memory"}})
    for pool, series in result.memory_series.items():
        by_kind: dict[str, float] = {}
        for t, kind, v in series:
            by_kind[kind] = v
            ev.append({"ph": "C", "name": f"{pool} bytes", "pid": mem_pid, "ts": t * 1e6,
                       "args": {k: max(0.0, x) for k, x in sorted(by_kind.items())}})
    return ev


def write_trace(result: Result, path: str | Path) -> None:
    doc = {"traceEvents": trace_events(result), "displayTimeUnit": "ms",
           "otherData": {"tool": "tiersim", "policy": result.policy, "hardware": result.hardware,
                         "sim_method": result.sim.method}}
    Path(path).write_text(json.dumps(doc))
