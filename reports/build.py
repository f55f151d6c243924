"""A comparison report: figures (PNG + SVG), the data behind each (CSV), ``report.html`` and ``report.md``.

``build_charts(inputs)`` turns results, result dicts, coverage / what-if documents and replay comparisons
(``reports.contents.ReportInputs``) into ``Chart`` objects (a figure and its DataFrame, ``reports.charts``);
``write_report(out_dir, inputs)`` draws them all and writes the pages (``reports.html``, ``reports.markdown``).
Figures 2-4 need the time series of an in-process ``simulator.Result``; a ``simulate --json`` object only
feeds figure 1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from reports import frames
from reports.charts import Chart, Written, render_all
from reports.contents import ReportInputs
from reports.html import write_html
from reports.markdown import write_markdown
from simulator import Result

# ReportInputs is defined in reports.contents and Chart/Written in reports.charts; callers may import them here
__all__ = ["Chart", "ReportInputs", "Written", "build_charts", "summary_tables", "write_report"]


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "x"


def _unique(names: list[str]) -> list[str]:
    out, seen = [], set()
    for n in names:
        k, i = n, 2
        while k in seen:
            k, i = f"{n}-{i}", i + 1
        seen.add(k)
        out.append(k)
    return out


def _job(r: Result) -> str:
    return f"{r.model.get('name', '?')} on {r.hardware}"


def step_note(r: Result) -> str:
    """What the one-step figures show, when that is not simply the whole step."""
    lo, hi = r.window
    shown = hi - lo
    if r.sim.method.startswith("extrapolated"):
        return (f"Shown: the simulated step ({shown:,.2f} s, with fewer micro-steps than the real one); the step "
                f"time, {r.step_time_s:,.2f} s, is extrapolated from it.")
    if r.sim.method.startswith("measured"):
        return "Shown: the measured step of a replay."
    return ""


def result_charts(r: Result, tag: str) -> list[Chart]:
    """Figures 2-4 of one simulated Result (``tag`` makes the file names unique)."""
    gpu = frames.focus_gpu(r)
    note = step_note(r)
    verdict = "" if r.feasible else f" - INFEASIBLE: {r.oom.pool if r.oom else '?'} runs out of memory"
    mem = frames.memory_frame(r, frames.memory_pools(r, gpu))
    tl = frames.timeline_frame(r, gpu)
    lk = frames.link_frame(r, frames.link_names(r, gpu))
    t2 = f"Memory over one step: {r.policy}, {_job(r)}{verdict}"
    t3 = f"Timeline of one step: {r.policy}, {_job(r)} ({gpu}, CPU, NVMe streams)"
    t4 = f"Link rates over one step: {r.policy}, {_job(r)} ({gpu}'s links)"
    exposed = tl[tl["category"] == frames.EXPOSED] if len(tl) else tl
    hidden = float((exposed["end_s"] - exposed["start_s"]).sum()) if len(exposed) else 0.0
    charts = [
        Chart(f"fig2-memory-{tag}", 2, t2,
              f"Bytes held in {', '.join(dict.fromkeys(mem['pool']))} over the measured step, stacked by tensor kind, "
              f"against each pool's usable capacity. {note}".strip(), mem, note),
        Chart(f"fig3-timeline-{tag}", 3, t3,
              f"Tasks of {gpu}'s streams and of the CPU and NVMe streams during the measured step; the red row "
              f"marks where {gpu} moves data and computes nothing ({hidden:,.3f} s in this window). {note}".strip(),
              tl, note),
    ]
    if len(lk):  # no figure of links that carried nothing
        charts.append(Chart(f"fig4-links-{tag}", 4, t4,
                            f"Rate of each direction of the links {gpu}'s copies cross (and NVMe's), against each "
                            f"direction's bandwidth. {note}".strip(), lk, note))
    return charts


def comparison_chart(rows: Sequence[Mapping[str, Any]], title: str) -> Chart:
    df = frames.comparison_frame(rows)
    t = f"Policy comparison: {title}"
    return Chart("fig1-comparison", 1, t,
                 "Throughput (tokens/s for the whole job, model TFLOP/s per GPU) beside each policy's peak bytes on "
                 "its busiest GPU, the CPU and NVMe against usable capacity; infeasible policies in red, with how "
                 "far over they are.", df)


def build_charts(inputs: ReportInputs) -> list[Chart]:
    charts: list[Chart] = []
    rows = inputs.comparison_rows()
    if rows:
        charts.append(comparison_chart(rows, inputs.title))
    tags = _unique([slug(f"{r.policy}") for r in inputs.results])
    if len({(r.hardware, r.model.get("name")) for r in inputs.results}) > 1:
        tags = _unique([slug(f"{r.policy}-{r.model.get('name')}-{r.hardware}") for r in inputs.results])
    for r, tag in zip(inputs.results, tags, strict=True):
        if r.records:
            charts.extend(result_charts(r, tag))
    cov_tags = _unique([slug(str(d.get("hardware") or "coverage")) for d in inputs.coverage])
    for d, tag in zip(inputs.coverage, cov_tags, strict=True):
        df = frames.coverage_frame(d)
        t = f"Coverage on {d.get('hardware', '?')}: which policy fits which model, and how fast"
        charts.append(Chart(f"fig5-coverage-{tag}", 5, t,
                            "Each cell: the policy's best tokens/s (colour, log scale; text: tokens/s and TFLOP/s "
                            "per GPU) for that model on this machine; hatched grey: does not fit, with the pool "
                            "that binds.", df))
    wi_tags = _unique([slug(f"{d.get('model') or 'whatif'}-{d.get('hardware') or ''}") for d in inputs.whatif])
    for d, tag in zip(inputs.whatif, wi_tags, strict=True):
        df = frames.whatif_frame(d)
        t = f"What-if sensitivity: {d.get('model', '?')} on {d.get('hardware', '?')}"
        charts.append(Chart(f"fig6-whatif-{tag}", 6, t,
                            "Tokens/s of the best policy with each single hardware change, against the base machine "
                            "(vertical line); largest effect on top.", df))
    if inputs.replay:
        df = frames.replay_frame(inputs.replay)
        if len(df):
            t = "Simulated vs measured (tiersim replay)"
            charts.append(Chart("fig7-replay", 7, t,
                                "Each replayed case's measured step time and per-pool peak bytes against the "
                                "simulation of the same plan (solid: identity; dashed: a factor 1.3 either way), "
                                "and the errors.",
                                df))
    return charts


def write_report(out_dir: str | Path, inputs: ReportInputs, workers: int | None = None) -> list[Path]:
    """Write every figure (PNG, SVG, CSV), ``report.html`` and ``report.md`` into ``out_dir`` (created
    if missing); returns the paths written. ``workers``: processes that render figures (default: one per
    CPU; 1 renders here)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = render_all(build_charts(inputs), out, workers)
    tables = summary_tables(inputs)
    html = write_html(out / "report.html", inputs, written, tables)
    md = write_markdown(out / "report.md", inputs, written, tables)
    return [p for w in written for p in (w.png, w.svg, w.csv)] + [html, md]


# -- tables ----------------------------------------------------------------------------------------
def _gb(x: Any) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "-"
    return "-" if v != v else f"{v / 1e9:,.1f}"


def _num(x: Any, fmt: str) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "-"
    return "-" if v != v else fmt.format(v)


def summary_tables(inputs: ReportInputs) -> list[tuple[str, pd.DataFrame]]:
    """The report's tables, formatted for people (pandas DataFrames of strings)."""
    out: list[tuple[str, pd.DataFrame]] = []
    rows = inputs.comparison_rows()
    if rows:
        df = frames.comparison_frame(rows)
        out.append(("Policies", pd.DataFrame({
            "policy": df["label"],
            "feasible": ["yes" if f else f"NO: {p} over by {_gb(o)} GB" if p else "NO"
                         for f, p, o in zip(df["feasible"], df["over_pool"], df["over_by_bytes"], strict=True)],
            "step s": [_num(x, "{:,.3f}") for x in df["step_time_s"]],
            "tokens/s": [_num(x, "{:,.0f}") for x in df["tokens_per_s"]],
            "TFLOP/s/GPU": [_num(x, "{:,.1f}") for x in df["tflops_per_gpu"]],
            "MFU": [_num(x * 100 if x == x and x is not None else None, "{:.1f}%") for x in df["mfu"]],
            "HW TFLOP/s/GPU": [_num(x, "{:,.1f}") for x in df["hw_tflops_per_gpu"]],
            "HFU": [_num(x * 100 if x == x and x is not None else None, "{:.1f}%") for x in df["hfu"]],
            **{f"{name} GB": [_gb(x) + (" (policy estimate)" if src == "policy estimate" and _gb(x) != "-" else "")
                              for x, src in zip(df[f"{kind}_peak_bytes"], df["peak_source"], strict=True)]
               for kind, name in (("gpu", "GPU"), ("cpu", "CPU"), ("nvme", "NVMe"))},
        })))
    for d in inputs.whatif:
        df = frames.whatif_frame(d)
        out.append((f"What-if: {d.get('model', '?')} on {d.get('hardware', '?')}", pd.DataFrame({
            "change": df["change"], "tokens/s": [_num(x, "{:,.0f}") for x in df["tokens_per_s"]],
            "vs base": [_num(x * 100, "{:+.1f}%") for x in df["relative"]],
            "makes it fit": ["yes" if x else "" for x in df["makes_feasible"]]})))
    if inputs.replay:
        df = frames.replay_frame(inputs.replay)
        out.append(("Simulated vs measured", pd.DataFrame({
            "case": df["case"], "figure": df["figure"],
            "simulated": [_num(s, "{:,.4f} s") if u == "s" else f"{_gb(s)} GB" for s, u in
                          zip(df["simulated"], df["unit"], strict=True)],
            "measured": [_num(m, "{:,.4f} s") if u == "s" else f"{_gb(m)} GB" for m, u in
                         zip(df["measured"], df["unit"], strict=True)],
            "error": [_num(e * 100, "{:+.1f}%") for e in df["error"]]})))
    return out
