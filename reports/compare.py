"""One comparison table for several policies on the same job (``simulate --policy all``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reports.units import table


def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:,.1f}"


def _pool_peak(d: Mapping[str, Any], kind: str) -> float | None:
    peaks = d.get("peak_bytes")
    if not peaks:
        return None
    vals = [v for k, v in peaks.items() if k.startswith(kind)]
    return max(vals) if vals else None


def format_comparison(rows: Sequence[Mapping[str, Any]], header_line: str) -> str:
    """``rows`` are result dicts (``Result.to_dict()`` shape, infeasible ones included)."""
    body = []
    for d in rows:
        ok = d["feasible"]
        verdict = "yes" if ok else "NO: " + (d.get("oom") or {}).get("message", d.get("verdict", "infeasible"))
        if not ok and d.get("oom") and d["oom"].get("over_by_bytes") is not None:
            o = d["oom"]
            verdict = f"NO: {o['pool']} over by {o['over_by_bytes'] / 1e9:,.1f} GB"
        sim = d.get("step_time_s") is not None
        body.append([
            d["policy"], verdict,
            f"{d['step_time_s']:,.3f}" if sim else "-",
            f"{d['tokens_per_s']:,.0f}" if sim else "-",
            f"{d['tflops_per_gpu']:,.1f}" if sim else "-",
            f"{d['mfu'] * 100:.1f}%" if sim else "-",
            f"{d['hfu'] * 100:.1f}%" if sim and d.get("hfu") is not None else "-",
            _gb(_pool_peak(d, "gpu") if _pool_peak(d, "gpu") is not None else _pool_peak(d, "unified")),
            _gb(_pool_peak(d, "cpu")),
            _gb(_pool_peak(d, "nvme")),
            f"{d['exposed_transfer_s']:,.3f}" if sim else "-",
            f"{d['sim']['wall_s']:.2f}",
        ])
    head = ["policy", "feasible", "step s", "tokens/s", "TFLOP/s/GPU", "MFU", "HFU", "GPU GB", "CPU GB",
            "NVMe GB", "exposed s", "sim s"]
    return header_line + "\n" + table(body, head, "llrrrrrrrrrr")
