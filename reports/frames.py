"""The data behind every figure, as pandas DataFrames (each written beside its figure as CSV).

Units stay internal (bytes, seconds, bytes/s); figures convert at the edge. Times of one-step figures are
seconds since the start of the measured step (``Result.window``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from simulator import Result
from simulator.phase import Phase
from simulator.result import subtract, union

POOL_KINDS = ("gpu", "cpu", "nvme")
KIND_ORDER = ("param16", "param32", "grad", "grad32", "optim", "activation", "checkpoint", "buffer")
KIND_LABELS = {"param16": "parameters (16-bit)", "param32": "master parameters (fp32)",
               "grad": "gradients (16-bit)", "grad32": "gradients (fp32)", "optim": "optimizer states",
               "activation": "activations", "checkpoint": "activation checkpoints", "buffer": "buffers"}
CATEGORIES = ("forward", "backward", "recompute", "optimizer", "other compute", "copy", "NVMe I/O", "collective",
              "transfer not hidden by compute")
EXPOSED = "transfer not hidden by compute"


def pool_kind(pool: str) -> str:
    """gpu0 -> gpu, unified -> gpu (the GPU allocates from it), cpu, nvme."""
    if pool.startswith("gpu") or pool == "unified":
        return "gpu"
    return pool


# -- figure 1: policy comparison --------------------------------------------------------------------
def _point_text(v: Any) -> str:
    if isinstance(v, Mapping):
        return ",".join(f"{k}={x}" for k, x in sorted(v.items()))
    if isinstance(v, list | tuple):
        return ",".join(str(x) for x in v)
    return str(v)


def _labels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The policy name; where rows share a policy, what tells them apart within that group: the sweep
    point's inputs that vary, else hardware and/or model where they vary, else the file each came from."""
    names = [str(d.get("policy")) for d in rows]

    def facets(d: Mapping[str, Any]) -> dict[str, str]:
        point = d.get("point")
        if isinstance(point, Mapping):
            return {k: _point_text(v) for k, v in sorted(point.items()) if k != "policy"}
        return {"hardware": str(d.get("hardware")), "model": str((d.get("model") or {}).get("name"))}

    out = list(names)
    for name in set(names):
        group = [i for i, n in enumerate(names) if n == name]
        if len(group) < 2:
            continue
        fs = [facets(rows[i]) for i in group]
        keys = sorted({k for f in fs for k in f})
        varying = [k for k in keys if len({f.get(k) for f in fs}) > 1]
        for i, f in zip(group, fs, strict=True):
            if varying:
                shown = [f"{k}={f.get(k, '')}" if isinstance(rows[i].get("point"), Mapping) else str(f.get(k))
                         for k in varying]
                out[i] = f"{name} [{'; '.join(shown)}]"
    before = list(out)
    for i, n in enumerate(before):  # still the same: the file, else a number
        if before.count(n) > 1:
            src = rows[i].get("source")
            same = [j for j, m in enumerate(before) if m == n]
            out[i] = f"{n} ({src})" if src and len({rows[j].get("source") for j in same}) == len(same) \
                else f"{n} #{same.index(i) + 1}"
    return out


def comparison_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per result dict (``simulate --json`` shape, infeasible ones included).

    ``<kind>_peak_bytes`` is the peak of the busiest pool of that kind and ``<kind>_capacity_bytes`` that
    pool's usable capacity; for a job its policy rejected before simulating, the rejected pool's peak is
    the policy's own estimate of the need (``peak_source`` says which).
    """
    out = []
    for label, d in zip(_labels(rows), rows, strict=True):
        oom = d.get("oom") or {}
        stage = oom.get("stage", "simulation") if oom else None
        rec: dict[str, Any] = {
            "label": label, "policy": d.get("policy"), "hardware": d.get("hardware"),
            "model": (d.get("model") or {}).get("name"), "feasible": bool(d.get("feasible")),
            "step_time_s": d.get("step_time_s"), "tokens_per_s": d.get("tokens_per_s"),
            "tflops_per_gpu": d.get("tflops_per_gpu"), "mfu": d.get("mfu"),
            "hw_tflops_per_gpu": d.get("hw_tflops_per_gpu"), "hfu": d.get("hfu"),
            "over_pool": oom.get("pool") if oom else None,
            "over_by_bytes": oom.get("over_by_bytes") if oom else None,
            "peak_source": "policy estimate" if stage == "plan" else "simulated",
        }
        peaks = d.get("peak_bytes") or {}
        caps = d.get("capacity_bytes") or {}
        for kind in POOL_KINDS:
            pools = [p for p in caps if pool_kind(p) == kind]
            if stage == "plan" and oom.get("pool") in pools:
                pool, peak = oom["pool"], oom.get("requested_bytes")
            elif peaks and pools:
                pool = max(pools, key=lambda p: (peaks.get(p, 0.0), -pools.index(p)))
                peak = peaks.get(pool)
            else:
                pool, peak = (pools[0] if pools else None), None
            rec[f"{kind}_pool"] = pool
            rec[f"{kind}_peak_bytes"] = peak
            rec[f"{kind}_capacity_bytes"] = caps.get(pool) if pool else None
        out.append(rec)
    return pd.DataFrame(out)


# -- figure 2: memory over one step -------------------------------------------------------------------
def focus_gpu(result: Result) -> str | None:
    """The GPU the one-step figures look at: the one whose pool peaks highest (lowest number on a tie)."""
    topo = result.topology
    gpus = list(topo.gpu_locations()) if topo is not None else sorted(
        {g for r in result.records for g in r.gpus}, key=_num)
    if not gpus:
        return None

    def peak(g: str) -> float:
        pool = topo.pool_of.get(g, g) if topo is not None else g
        return result.peak_bytes.get(pool, 0.0)

    return max(gpus, key=lambda g: (peak(g), -_num(g)))


def gpu_pool(result: Result, gpu: str) -> str:
    topo = result.topology
    return topo.pool_of.get(gpu, gpu) if topo is not None else gpu


def _num(name: str) -> int:
    digits = "".join(c for c in name if c.isdigit())
    return int(digits) if digits else 0


def memory_pools(result: Result, gpu: str | None = None) -> list[str]:
    """The pools figure 2 shows: one GPU's (``gpu`` or ``focus_gpu``), then CPU and NVMe where used."""
    g = gpu or focus_gpu(result)
    pools = [gpu_pool(result, g)] if g else []
    pools += [p for p in ("cpu", "nvme") if p in result.memory_series and result.peak_bytes.get(p, 0.0) > 0
              and p not in pools]
    return pools


def memory_frame(result: Result, pools: Iterable[str] | None = None) -> pd.DataFrame:
    """Bytes per tensor kind of each pool over the measured step: one row per allocation or free (so no
    transient peak is lost), plus a row at the step's start and end. Columns: pool, time_s (since the
    step began), one column per kind, total_bytes, capacity_bytes."""
    lo, hi = result.window
    rows: list[dict[str, Any]] = []
    kinds = sorted({k for p in result.peak_by_kind.values() for k in p} |
                   {k for s in result.memory_series.values() for _, k, _ in s}, key=_kind_key)
    for pool in (memory_pools(result) if pools is None else pools):
        state: dict[str, float] = dict.fromkeys(kinds, 0.0)
        cap = result.capacity_bytes.get(pool, math.nan)

        def row(t: float, state: dict[str, float] = state, pool: str = pool, cap: float = cap) -> dict[str, Any]:
            vals = {k: max(0.0, v) for k, v in state.items()}
            return {"pool": pool, "time_s": t - lo, **vals, "total_bytes": sum(vals.values()),
                    "capacity_bytes": cap}

        series = result.memory_series.get(pool, ())
        i = 0
        while i < len(series) and series[i][0] <= lo:
            state[series[i][1]] = series[i][2]
            i += 1
        rows.append(row(lo))
        while i < len(series) and series[i][0] <= hi:
            t, kind, v = series[i]
            state[kind] = v
            rows.append(row(t))
            i += 1
        rows.append(row(hi))
    cols = ["pool", "time_s", *kinds, "total_bytes", "capacity_bytes"]
    return pd.DataFrame(rows, columns=cols)


def _kind_key(kind: str) -> tuple[int, str]:
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), kind)


# -- figure 3: timeline ----------------------------------------------------------------------------
COMPUTE_CATEGORY = {Phase.FWD: "forward", Phase.BWD: "backward", Phase.RECOMPUTE: "recompute"}


def category(op: str, phase: str | None, device: str) -> str:
    ph = Phase.parse(phase)
    if op == "compute":
        return COMPUTE_CATEGORY.get(ph, "other compute") if ph is not None else "other compute"
    if op == "optimizer":
        return "optimizer"
    if op == "collective":
        return "collective"
    if op == "copy":
        return "NVMe I/O" if device.startswith("nvme") or (ph is not None and ph.group == "nvme") else "copy"
    return "other compute"


def _stream_key(device: str, stream: str, gpu: str) -> tuple[int, int, str]:
    rank = 0 if device == gpu else 2 if device.startswith("cpu") else 3 if device.startswith("nvme") else 1
    return (rank, 0 if stream.endswith(".compute") else 1, stream)


def timeline_frame(result: Result, gpu: str | None = None) -> pd.DataFrame:
    """Every task of one GPU's streams and of the CPU and NVMe streams that overlaps the measured step,
    plus rows ``transfer not hidden by compute``: where that GPU moves data (a copy it is an end of, a
    collective it is a rank of) and computes nothing (the simulator's ``exposed_transfer_s`` definition)."""
    g = gpu or focus_gpu(result) or "gpu0"
    lo, hi = result.window
    rows: list[dict[str, Any]] = []
    comp: list[tuple[float, float]] = []
    xfer: list[tuple[float, float]] = []
    for r in result.records:
        if r.op in ("compute", "optimizer") and g in r.gpus:
            comp.append((r.start, r.end))
        if r.end <= lo or r.start >= hi or r.end <= r.start:
            continue
        if r.op in ("copy", "collective") and g in r.gpus:
            xfer.append((r.start, r.end))
        mine = r.device == g or r.device.startswith(("cpu", "nvme"))
        if not mine:
            continue
        phase = r.tags.get("phase") if isinstance(r.tags, dict) else None
        rows.append({"row": r.stream, "device": r.device, "stream": r.stream, "task": r.uid, "op": r.op,
                     "phase": phase, "category": category(r.op, phase, r.device),
                     "layer": r.tags.get("layer") if isinstance(r.tags, dict) else None,
                     "start_s": r.start - lo, "end_s": r.end - lo, "bytes": r.bytes})
    exposed = subtract(union(xfer), union(comp))
    for a, b in exposed:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            rows.append({"row": f"{g}: {EXPOSED}", "device": g, "stream": "", "task": "", "op": "exposed",
                         "phase": None, "category": EXPOSED, "layer": None, "start_s": a - lo, "end_s": b - lo,
                         "bytes": 0.0})
    df = pd.DataFrame(rows, columns=["row", "device", "stream", "task", "op", "phase", "category", "layer",
                                     "start_s", "end_s", "bytes"])
    if df.empty:
        return df
    order = sorted({(d, s) for d, s in zip(df["device"], df["stream"], strict=True) if s},
                   key=lambda x: _stream_key(x[0], x[1], g))
    rank = {s: i for i, (_, s) in enumerate(order)}
    n_gpu_rows = sum(1 for d, _ in order if d == g)
    df["row_index"] = [rank[s] if s else n_gpu_rows - 0.5 for s in df["stream"]]
    return df.sort_values(["row_index", "start_s", "task"], kind="stable").reset_index(drop=True)


# -- figure 4: link utilisation ----------------------------------------------------------------------
def direction_label(link: str, kind: str, forward: bool) -> str:
    """Forward is away from host DRAM (towards a GPU or into NVMe)."""
    if kind == "nvme":
        return "write (to NVMe)" if forward else "read (from NVMe)"
    if kind == "nvlink":
        return "into the GPU" if forward else "out of the GPU"
    return "to GPU (H2D)" if forward else "to host (D2H)"


def link_names(result: Result, gpu: str | None = None) -> list[str]:
    """The links of one GPU's path to the host and NVMe, its NVLink, and the NVMe link: those that carried
    bytes in the step (all links with bytes when the topology is unknown)."""
    topo = result.topology
    busy = [ln for ln, b in result.link_bytes.items() if b > 0]
    if topo is None:
        return sorted(busy)
    g = gpu or focus_gpu(result)
    names: list[str] = []
    if g is not None:
        for dst in ("cpu", "nvme"):
            if dst in topo.locations and g != dst and (g, dst) in topo.routes:
                names += [h.link for h in topo.route(g, dst)]
        names += [ln for ln in topo.links if ln == f"{g}.nvlink"]
    names += [ln for ln in topo.links if topo.links[ln].kind == "nvme"]
    names = list(dict.fromkeys(names))
    return [ln for ln in names if any(r > 0 for _, r in result.link_rate_log.get(f"{ln}:fwd", ()))
            or any(r > 0 for _, r in result.link_rate_log.get(f"{ln}:rev", ()))]


def _steps_in_window(log: Sequence[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """(time, rate) from lo to hi, the last entry of equal times kept; a point at lo and at hi."""
    last: dict[float, float] = {}
    for t, r in log:
        last[t] = r
    times = sorted(last)
    at_lo = 0.0
    pts: list[tuple[float, float]] = []
    for t in times:
        if t <= lo:
            at_lo = last[t]
        elif t < hi:
            pts.append((t, last[t]))
    cur = pts[-1][1] if pts else at_lo
    return [(lo, at_lo), *pts, (hi, cur)]


def link_frame(result: Result, links: Iterable[str] | None = None) -> pd.DataFrame:
    """Rate of each direction of each link over the measured step, as a step function (a row where the
    rate changes). Columns: link, kind, direction, label, time_s, rate_Bps, capacity_Bps, utilisation."""
    lo, hi = result.window
    topo = result.topology
    rows = []
    for ln in (link_names(result) if links is None else links):
        link = topo.links[ln] if topo is not None and ln in topo.links else None
        kind = link.kind if link else ""
        for forward in (True, False):
            log = result.link_rate_log.get(f"{ln}:{'fwd' if forward else 'rev'}", ())
            cap = (link.bw_fwd if forward else link.bw_rev) if link else math.nan
            for t, rate in _steps_in_window(log, lo, hi):
                rows.append({"link": ln, "kind": kind, "direction": "fwd" if forward else "rev",
                             "label": direction_label(ln, kind, forward), "time_s": t - lo, "rate_Bps": rate,
                             "capacity_Bps": cap, "utilisation": rate / cap if cap else math.nan})
    return pd.DataFrame(rows, columns=["link", "kind", "direction", "label", "time_s", "rate_Bps", "capacity_Bps",
                                       "utilisation"])


def integrate_rate(df: pd.DataFrame) -> float:
    """Bytes moved by a step function of ``rate_Bps`` over ``time_s`` (one link direction)."""
    t = df["time_s"].to_numpy()
    r = df["rate_Bps"].to_numpy()
    return float(sum((t[i + 1] - t[i]) * r[i] for i in range(len(t) - 1)))


# -- figure 5: coverage -------------------------------------------------------------------------------
def coverage_frame(doc: Mapping[str, Any]) -> pd.DataFrame:
    """``tiersim coverage --json`` rows: policy, model, params, feasible, tokens_per_s, tflops_per_gpu,
    binding, knobs (as JSON text)."""
    rows = []
    for r in doc.get("rows", []):
        rows.append({"policy": r["policy"], "model": r["model"], "params": r.get("params"),
                     "feasible": bool(r.get("feasible")), "tokens_per_s": r.get("tokens_per_s"),
                     "tflops_per_gpu": r.get("tflops_per_gpu"), "binding": r.get("binding"),
                     "knobs": json.dumps(r.get("knobs") or {}, sort_keys=True)})
    return pd.DataFrame(rows, columns=["policy", "model", "params", "feasible", "tokens_per_s", "tflops_per_gpu",
                                       "binding", "knobs"])


# -- figure 6: what-if sensitivity -------------------------------------------------------------------
def whatif_frame(doc: Mapping[str, Any]) -> pd.DataFrame:
    """``tiersim whatif --json`` sensitivity, largest change of tokens/s first. ``delta_tokens_per_s`` is
    tokens/s with the change minus without (infeasible counts as 0 tokens/s)."""
    rows = []
    for s in doc.get("sensitivity", []):
        base = float(s.get("base_tokens_per_s") or 0.0)
        new = float(s.get("tokens_per_s") or 0.0)
        rows.append({"change": s["change"], "base_tokens_per_s": base, "tokens_per_s": new,
                     "delta_tokens_per_s": new - base, "relative": (new / base - 1.0) if base > 0 else math.nan,
                     "gain": s.get("gain"), "makes_feasible": bool(s.get("makes_feasible"))})
    df = pd.DataFrame(rows, columns=["change", "base_tokens_per_s", "tokens_per_s", "delta_tokens_per_s", "relative",
                                     "gain", "makes_feasible"])
    if df.empty:
        return df
    df["_abs"] = df["delta_tokens_per_s"].abs()
    return df.sort_values(["_abs", "change"], ascending=[False, True], kind="stable").drop(columns="_abs") \
        .reset_index(drop=True)


# -- figure 7: simulated vs measured --------------------------------------------------------------------
def replay_rows(doc: Mapping[str, Any], case: str | None = None) -> list[dict[str, Any]]:
    """Rows (case, policy, figure, unit, simulated, measured, error) of a ``tiersim replay --json`` object
    or a ``python -m replay.validation --json`` file."""
    out: list[dict[str, Any]] = []

    def add(case: str, policy: str, figure: str, unit: str, sim: float | None, meas: float | None) -> None:
        if sim is None or meas is None or not (math.isfinite(sim) and math.isfinite(meas)):
            return
        out.append({"case": case, "policy": policy, "figure": figure, "unit": unit, "simulated": sim,
                    "measured": meas, "error": meas / sim - 1.0 if sim else math.nan})

    if "simulated" in doc and "measured" in doc:
        name = case or str(doc.get("policy"))
        s, m = doc["simulated"], doc["measured"]
        add(name, str(doc.get("policy")), "step time", "s", s.get("step_time_s"), m.get("step_time_s"))
        for pool in sorted(set(s.get("peak_bytes", {})) | set(m.get("peak_bytes", {}))):
            sp, mp = s.get("peak_bytes", {}).get(pool, 0.0), m.get("peak_bytes", {}).get(pool, 0.0)
            if sp or mp:
                add(name, str(doc.get("policy")), f"peak {pool}", "bytes", sp, mp)
        return out
    for r in doc.get("rows", []):
        add(r["case"], r.get("policy", ""), "step time", "s", r.get("sim_step_s"), r.get("meas_step_s"))
        sp, mp = r.get("sim_peak") or {}, r.get("meas_peak") or {}
        for pool in sorted(set(sp) | set(mp)):
            if sp.get(pool) or mp.get(pool):
                add(r["case"], r.get("policy", ""), f"peak {pool}", "bytes", sp.get(pool, 0.0), mp.get(pool, 0.0))
    return out


def replay_frame(docs: Sequence[tuple[str | None, Mapping[str, Any]]]) -> pd.DataFrame:
    rows = [row for case, d in docs for row in replay_rows(d, case)]
    return pd.DataFrame(rows, columns=["case", "policy", "figure", "unit", "simulated", "measured", "error"])
