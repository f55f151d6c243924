"""The human-readable report of one simulation (what ``tiersim simulate`` prints).

The report starts with every assumption (hardware, model, workload, knobs and each default that was
picked), then the verdict, the step figures, memory per pool against capacity and bytes per link.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hardware_models import HardwareSpec
from planner.result_json import oom_verdict
from reports.units import gb, group_numbered, pct, secs, table
from simulator import Result

WORKLOAD_FIELDS = ("global_batch", "micro_batch", "seq_len", "precision", "checkpointing", "flash_attention",
                   "checkpoint_early_stop")


def verdict_line(result: Result) -> str:
    if result.feasible:
        return "FEASIBLE"
    o = result.oom
    assert o is not None
    return oom_verdict(o.to_dict())


def hardware_rows(hw: HardwareSpec, precision: str | None = None, overrides: Sequence[str] = ()) -> list[list[str]]:
    """A few lines that say which machine was assumed (``tiersim hardware show NAME`` has every field)."""
    g = hw.gpu
    if hw.unified_memory:
        gpus = f"{g.count}x {g.model}, sharing {gb(hw.host.dram_bytes)} of unified memory with the CPU"
    else:
        gpus = f"{g.count}x {g.model}, {gb(g.memory_bytes)} each"
    rows = [["preset", hw.name], ["GPUs", gpus]]
    if precision and precision in g.peak_flops:
        rows.append(["GPU peak", f"{g.peak_flops[precision] / 1e12:,.1f} TFLOP/s {precision}"])
    h = hw.host
    rows.append(["host", f"{h.cpu_model}, {h.cores} cores, {gb(h.dram_bytes)} DRAM"])
    rows.append(["PCIe", f"Gen{hw.pcie.gen} x{hw.pcie.lanes}, {hw.pcie.per_direction_bw / 1e9:.1f} GB/s per "
                         f"direction, {hw.pcie.gpus_per_switch} GPU(s) per switch uplink"])
    if hw.nvlink is not None:
        rows.append(["NVLink", f"{hw.nvlink.per_direction_bw / 1e9:.0f} GB/s per direction per GPU"])
    if hw.c2c is not None:
        rows.append(["NVLink-C2C", f"{hw.c2c.per_direction_bw / 1e9:.0f} GB/s per direction"])
    if hw.nvme is not None:
        rows.append(["NVMe", f"{hw.nvme.count}x {gb(hw.nvme.capacity_bytes_each)}, "
                             f"{hw.nvme.read_bw / 1e9:.1f} GB/s read, {hw.nvme.write_bw / 1e9:.1f} GB/s write"])
    if overrides:
        rows.append(["overrides", ", ".join(f"--set {o}" for o in overrides)])
    return rows


def format_header(*, policy: str, hardware: str, n_gpus: int, model: Mapping[str, Any],
                  workload: Mapping[str, Any], knobs: Mapping[str, Any], accumulation: Any = None,
                  hw: HardwareSpec | None = None, overrides: Sequence[str] = (),
                  extra_assumed: Sequence[str] = ()) -> list[str]:
    """What was assumed: hardware, model, workload, knobs and every default picked."""
    out = [f"tiersim: {policy} on {hardware} ({n_gpus} GPU{'s' if n_gpus != 1 else ''}), "
           f"model {model.get('name')} ({float(model.get('params') or 0) / 1e9:.2f}B params)"]
    if hw is not None:
        out.append("")
        out.append("Hardware:")
        out.append(table(hardware_rows(hw, workload.get("precision"), overrides), align="ll"))
    out.append("")
    out.append("Assumed workload:")
    rows = [["model", f"{model.get('name')} ({int(model.get('params') or 0):,} params)"]]
    rows += [[k, str(workload.get(k))] for k in WORKLOAD_FIELDS]
    if accumulation is not None:
        rows.append(["accumulation", f"{accumulation} micro-step(s) per step"])
    rows.append(["policy", policy])
    if knobs:
        rows.append(["knobs", ", ".join(f"{k}={v}" for k, v in knobs.items())])
    out.append(table(rows, align="ll"))
    for a in [*extra_assumed, *workload.get("assumed", [])]:
        out.append(f"  default picked: {a}")
    return out


def format_result(result: Result, hw: HardwareSpec | None = None, overrides: Sequence[str] = (),
                  extra_assumed: Sequence[str] = ()) -> str:
    r = result
    out = format_header(policy=r.policy, hardware=r.hardware, n_gpus=r.n_gpus, model=r.model,
                        workload=r.workload, knobs=r.knobs, accumulation=r.info.get("accumulation"), hw=hw,
                        overrides=overrides, extra_assumed=extra_assumed)
    out.append("")
    out.append(f"Verdict: {verdict_line(r)}")
    out.append(table([
        ["step time", secs(r.step_time_s)],
        ["tokens/s", f"{r.tokens_per_s:,.0f}"],
        ["TFLOP/s per GPU (model)", f"{r.tflops_per_gpu:,.1f}"],
        ["MFU (model FLOPs)", pct(r.mfu)],
        ["TFLOP/s per GPU (hardware)", f"{r.hw_tflops_per_gpu:,.1f}"],
        ["HFU (hardware FLOPs, recompute incl.)", pct(r.hfu)],
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
    out.append(table(group_numbered(rows), ["pool", "peak", "capacity", "used", "reserved", "at peak (GB by kind)"],
                     "lrrrrl"))
    out.append("")
    out.append("Links (measured step):")
    names = sorted(r.link_bytes, key=_link_order)
    rows = [[ln, gb(r.link_bytes[ln]), secs(r.link_busy_s.get(ln, 0.0))] for ln in names if r.link_bytes[ln] > 0]
    out.append(table(group_numbered(rows), ["link", "bytes", "busy"]) if rows else "  (no transfers)")
    for n in r.notes:
        out.append(f"note: {n}")
    out.append(f"simulation: {r.sim.events:,} events, {r.sim.simulated_tasks:,} tasks, {r.sim.wall_s:.2f} s wall, "
               f"{r.sim.method}")
    return "\n".join(out)


def format_infeasible(d: Mapping[str, Any], hw: HardwareSpec | None = None, overrides: Sequence[str] = (),
                      extra_assumed: Sequence[str] = ()) -> str:
    """The report of a job its policy found infeasible before simulating (``d``: the JSON object)."""
    out = format_header(policy=d["policy"], hardware=d["hardware"], n_gpus=d["n_gpus"], model=d["model"],
                        workload=d["workload"], knobs=d["knobs"], hw=hw, overrides=overrides,
                        extra_assumed=extra_assumed)
    out.append("")
    out.append(f"Verdict: {d['verdict']}")
    caps = d.get("capacity_bytes") or {}
    if caps:
        out.append("")
        out.append("Memory (usable capacity; reserved = lost before the model gets any):")
        reserved = d.get("reserved_bytes") or {}
        rows = [[p, gb(caps[p]), gb(sum(reserved.get(p, {}).values()))] for p in sorted(caps, key=_pool_order)]
        out.append(table(rows, ["pool", "capacity", "reserved"]))
    return "\n".join(out)


def _link_order(name: str) -> tuple[str, int, str]:
    """gpu2.pcie before gpu10.pcie; links grouped by kind (all .nvlink together)."""
    import re

    m = re.match(r"^([a-z_]+)(\d+)(.*)$", name)
    return (m[3] + m[1], int(m[2]), name) if m else (name, 0, name)


def _pool_order(name: str) -> tuple[int, int, str]:
    if name.startswith("gpu"):
        return (0, int(name[3:]) if name[3:].isdigit() else 0, name)
    return ({"unified": 1, "cpu": 2, "nvme": 3}.get(name, 4), 0, name)
