"""The human-readable report of one simulation (what ``tiersim simulate`` prints)."""

from __future__ import annotations

from reports.units import gb, pct, secs, table
from simulator import Result


def verdict_line(result: Result) -> str:
    if result.feasible:
        return "FEASIBLE"
    o = result.oom
    assert o is not None
    return (f"INFEASIBLE: {o.pool} runs out of memory at t={secs(o.time_s)} ({o.task} asks "
            f"{gb(o.requested_bytes)} with {gb(o.free_bytes)} free); total demand {gb(o.total_demand_bytes)} "
            f"vs capacity {gb(o.capacity_bytes)}: over by {gb(o.over_by_bytes)}")


def format_result(result: Result) -> str:
    r = result
    wl = r.workload
    model = r.model
    out = [f"tiersim: {r.policy} on {r.hardware} ({r.n_gpus} GPU{'s' if r.n_gpus != 1 else ''}), "
           f"model {model.get('name')} ({model.get('params', 0) / 1e9:.2f}B params)"]
    out.append("")
    out.append("Assumed workload:")
    rows = [[k, str(wl.get(k))] for k in ("global_batch", "micro_batch", "seq_len", "precision",
                                          "checkpointing", "flash_attention")]
    accum = r.info.get("accumulation")
    if accum is not None:
        rows.append(["accumulation", f"{accum} micro-step(s) per step"])
    if r.knobs:
        rows.append(["knobs", ", ".join(f"{k}={v}" for k, v in r.knobs.items())])
    out.append(table(rows, align="ll"))
    for a in wl.get("assumed", []):
        out.append(f"  default picked: {a}")
    out.append("")
    out.append(f"Verdict: {verdict_line(r)}")
    out.append(table([
        ["step time", secs(r.step_time_s)],
        ["tokens/s", f"{r.tokens_per_s:,.0f}"],
        ["TFLOP/s per GPU", f"{r.tflops_per_gpu:,.1f}"],
        ["MFU", pct(r.mfu)],
        ["compute busy (busiest GPU)", secs(r.compute_busy_s)],
        ["exposed transfer (worst GPU)", secs(r.exposed_transfer_s)],
    ], align="lr"))
    out.append("")
    out.append("Memory (peak of the run vs usable capacity; reserved = lost before the model gets any):")
    rows = []
    for pool in sorted(r.peak_bytes, key=_pool_order):
        peak, cap = r.peak_bytes[pool], r.capacity_bytes[pool]
        reserved = sum(r.reserved_bytes.get(pool, {}).values())
        kinds = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in r.peak_by_kind.get(pool, {}).items() if v > 0)
        rows.append([pool, gb(peak), gb(cap), pct(peak / cap) if cap else "-", gb(reserved), kinds])
    out.append(table(rows, ["pool", "peak", "capacity", "used", "reserved", "at peak (GB by kind)"], "lrrrrl"))
    out.append("")
    out.append("Links (measured step):")
    rows = [[ln, gb(b), secs(r.link_busy_s.get(ln, 0.0))] for ln, b in sorted(r.link_bytes.items()) if b > 0]
    out.append(table(rows, ["link", "bytes", "busy"]) if rows else "  (no transfers)")
    for n in r.notes:
        out.append(f"note: {n}")
    out.append(f"simulation: {r.sim.events:,} events, {r.sim.simulated_tasks:,} tasks, {r.sim.wall_s:.2f} s wall, "
               f"{r.sim.method}")
    return "\n".join(out)


def _pool_order(name: str) -> tuple[int, int, str]:
    if name.startswith("gpu"):
        return (0, int(name[3:]) if name[3:].isdigit() else 0, name)
    return ({"unified": 1, "cpu": 2, "nvme": 3}.get(name, 4), 0, name)
