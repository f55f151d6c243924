"""Measured versus simulated, side by side: step time, busy time per stream, peak bytes per pool.

Imports no torch: it reads two ``simulator.Result`` objects (the simulation and the replay's
measurement, which ``replay.runner.measured_result`` builds with the simulator's own metric definitions).
``error`` is ``measured / simulated - 1`` (None where the simulation says 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reports.units import secs as fmt_seconds
from reports.units import table
from simulator import Result


def rel_error(measured: float, simulated: float) -> float | None:
    return measured / simulated - 1.0 if simulated else None


def _figures(r: Result) -> dict[str, Any]:
    return {"step_time_s": r.step_time_s, "stream_busy_s": dict(r.stream_busy_s), "peak_bytes": dict(r.peak_bytes),
            "link_bytes": dict(r.link_bytes), "compute_busy_s": r.compute_busy_s,
            "exposed_transfer_s": r.exposed_transfer_s}


def _errors(meas: Mapping[str, float], sim: Mapping[str, float]) -> dict[str, float | None]:
    return {k: rel_error(meas.get(k, 0.0), sim.get(k, 0.0)) for k in sorted(set(meas) | set(sim))}


def comparison(simulated: Result, measured: Result, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The ``--json`` object: ``simulated``, ``measured`` (plus ``extra``), ``error``."""
    sim, meas = _figures(simulated), _figures(measured)
    return {
        "policy": simulated.policy,
        "hardware": simulated.hardware,
        "simulated": {**sim, "sim_method": simulated.sim.method},
        "measured": {**meas, **extra},
        "error": {
            "step_time": rel_error(measured.step_time_s, simulated.step_time_s),
            "stream_busy": _errors(meas["stream_busy_s"], sim["stream_busy_s"]),
            "peak_bytes": _errors(meas["peak_bytes"], sim["peak_bytes"]),
        },
    }


def fmt_bytes(x: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:,.2f} {unit}"
    return f"{x:,.0f} B"


def _pct(e: float | None) -> str:
    return "n/a" if e is None else f"{e * 100:+.1f}%"


BYTES_NOTE_AT = 0.05  # say so when the bytes the runner moved differ from the plan's by more than this


def bytes_moved_lines(priced: float, real: float) -> list[str]:
    """The bytes the replay moved over links and collectives (all steps) against the plan's, and why they
    differ where they do: the runner keeps fp32 working parameters and gradients (PyTorch AMP:
    ``replay.precision``) where a 16-bit plan prices 2 B per parameter, so its uploads, gathers and gradient
    copies move twice the priced bytes (its gradient reductions are sent in the plan's dtype)."""
    if priced <= 0 and real <= 0:
        return []
    line = f"bytes moved (all steps, every link and ring hop): priced {fmt_bytes(priced)}, real {fmt_bytes(real)}"
    if priced > 0:
        line += f" ({_pct(real / priced - 1.0)})"
    if priced <= 0 or real / priced - 1.0 > BYTES_NOTE_AT:
        line += ("; the runner keeps fp32 working parameters and gradients where a 16-bit plan prices 2 B per "
                 "parameter (replay.precision), so its copies and gathers of them move more than priced")
    elif real / priced - 1.0 < -BYTES_NOTE_AT:
        line += "; the runner moved less than the plan prices (a copy the plan sizes larger than its tensors)"
    return [line]


def format_comparison(d: Mapping[str, Any]) -> str:
    sim, meas, err = d["simulated"], d["measured"], d["error"]
    rows = [("step time", fmt_seconds(sim["step_time_s"]), fmt_seconds(meas["step_time_s"]), _pct(err["step_time"]))]
    for s, e in err["stream_busy"].items():
        rows.append((f"busy {s}", fmt_seconds(sim["stream_busy_s"].get(s, 0.0)),
                     fmt_seconds(meas["stream_busy_s"].get(s, 0.0)), _pct(e)))
    for p, e in err["peak_bytes"].items():
        rows.append((f"peak {p}", fmt_bytes(sim["peak_bytes"].get(p, 0.0)), fmt_bytes(meas["peak_bytes"].get(p, 0.0)),
                     _pct(e)))
    out = [f"tiersim replay: {d['policy']} on {d['hardware']} (measured on {meas.get('device', '?')}, "
           f"{len(meas.get('step_times_s', []))} step(s), wall {fmt_seconds(meas.get('wall_s', 0.0))})", "",
           table([list(r) for r in rows], ["figure (measured step)", "simulated", "measured", "error"])]
    steps = meas.get("step_times_s") or []
    if steps:
        out += ["", "measured step times: " + ", ".join(fmt_seconds(x) for x in steps)]
    losses = meas.get("losses") or []
    if losses:
        out.append("losses: " + ", ".join(f"s{s}.{m} {v:.6f}" for s, m, v in losses))
    out.append("peak bytes are the plan's bytes as the runner allocated and freed them (its own accounting)")
    out += bytes_moved_lines(meas.get("link_bytes_priced", 0.0), meas.get("link_bytes_real", 0.0))
    v = d.get("verify")
    if v is not None:
        verdict = "OK" if v["ok"] else "MISMATCH"
        out.append(f"verify ({v['reference']} reference, rtol {v['rtol']:g}): {verdict}: max loss rel err "
                   f"{v['max_loss_rel_err']:.2e}, max weight rel err {v['max_weight_rel_err']:.2e}"
                   + (f" (worst: {v['worst']})" if v["worst"] else ""))
    return "\n".join(out)
