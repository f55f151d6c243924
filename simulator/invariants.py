"""Invariants every simulated run must satisfy (design.md, "Modelling rules").

``check_invariants(result)`` returns a list of violations (empty when the run is sound). The test-suite
calls it on every simulation it makes; ``tiersim simulate --check`` lets a user call it too.
"""

from __future__ import annotations

from collections import defaultdict

from costs import both_ways_bw
from simulator.plan import Plan
from simulator.result import Result
from simulator.unroll import Unroller

_EPS = 1e-9


def check_invariants(result: Result) -> list[str]:
    plan = result.simulated_plan
    bad: list[str] = []
    # memory: never negative; above capacity only with an OOM verdict
    for pool, low in result.min_used_bytes.items():
        if low < -1e-3:
            bad.append(f"pool {pool}: usage went negative ({low:.0f} B)")
    oom_pools = {o.pool for o in result.ooms}
    for pool, peak in result.peak_bytes.items():
        if peak > result.capacity_bytes[pool] + 1e-3 and pool not in oom_pools:
            bad.append(f"pool {pool}: peak {peak:.0f} B above capacity without an OOM verdict")
    if result.feasible != (not result.ooms):
        bad.append("feasible flag disagrees with the OOM verdicts")
    # every allocation freed or persistent
    for leak in result.leaked:
        bad.append(f"tensor {leak} is still allocated at the end and is not persistent")
    if plan is None:
        return bad
    bad.extend(_check_tasks(plan, result))
    # step time bounds: only a steady state has a period that must hold a step's work (a plan whose streams
    # never settle, e.g. one stream running ahead of the others forever, is reported as NOT steady)
    if "NOT steady" in result.sim.method:
        return bad
    st = result.step_time_s
    for s, busy in result.stream_busy_s.items():
        if busy > st * (1 + 1e-9) + _EPS:
            bad.append(f"stream {s}: busy {busy:.6g} s in a step of {st:.6g} s")
    topo = result.topology
    if topo is not None:
        for ln, nbytes in result.link_bytes.items():
            link = topo.links[ln]
            cap = both_ways_bw(link)
            if nbytes / cap > st * (1 + 1e-9) + _EPS:
                bad.append(f"link {ln}: {nbytes:.4g} B need {nbytes / cap:.6g} s at full rate, "
                           f"more than the step's {st:.6g} s")
    return bad


def _check_tasks(plan: Plan, result: Result) -> list[str]:
    bad: list[str] = []
    tasks = Unroller(plan, result.warmup_repeat).unroll()
    records = result.records
    if plan.template is not None:  # a rank template: its tasks are rank 0's, the other ranks' records their images
        ids = plan.task_segment()
        records = [r for r in records if r.id in ids]
    rec = {r.uid: r for r in records}
    if len(rec) != len(tasks):
        bad.append(f"{len(tasks)} tasks planned, {len(rec)} ran")
    tensors = plan.tensor_map()
    planned_bytes = 0.0
    for t in tasks:
        r = rec.get(t.uid)
        if r is None:
            bad.append(f"task {t.uid} never ran")
            continue
        if r.end < r.start - _EPS:
            bad.append(f"task {t.uid} ends before it starts")
        for d in t.deps:
            rd = rec.get(d)
            if rd is not None and r.start < rd.end - 1e-9 * max(1.0, rd.end):
                bad.append(f"task {t.uid} starts at {r.start:.9g} before its dependency {d} ends at {rd.end:.9g}")
        if t.spec.op == "copy":
            nb = t.spec.bytes if t.spec.bytes > 0 else tensors[t.spec.tensor.id].bytes if t.spec.tensor else 0.0
            planned_bytes += nb
    moved = sum(r.bytes for r in records if r.op == "copy")
    if abs(moved - planned_bytes) > 1e-6 * max(1.0, planned_bytes):
        bad.append(f"bytes copied {moved:.0f} != bytes planned {planned_bytes:.0f}")
    by_stream: dict[str, list] = defaultdict(list)
    for r in records:
        by_stream[r.stream].append(r)
    order = {t.uid: i for i, t in enumerate(tasks)}
    for s, rs in by_stream.items():
        rs.sort(key=lambda r: order[r.uid])
        for a, b in zip(rs, rs[1:], strict=False):
            if b.start < a.end - 1e-9 * max(1.0, a.end):
                bad.append(f"stream {s}: {b.uid} starts before {a.uid} ends (streams run in order)")
    return bad
