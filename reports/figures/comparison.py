"""Figure 1: every policy's throughput beside its peak GPU, CPU and NVMe bytes against capacity."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from reports.figures.style import CAPACITY, GREY, OKABE_ITO, new_figure, style, suptitle

if TYPE_CHECKING:
    from matplotlib.typing import HashableList

FEASIBLE, OVER = OKABE_ITO[4], OKABE_ITO[5]  # blue; vermillion (hatched)
POOL_TITLES = {"gpu": "Peak GPU memory (busiest GPU)", "cpu": "Peak CPU DRAM", "nvme": "Peak NVMe"}


def _num(x: object) -> float:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return v


def _verdict(row: pd.Series) -> str:
    over = _num(row["over_by_bytes"])
    if math.isfinite(over):
        return f"infeasible: {row['over_pool']} over by {over / 1e9:,.1f} GB"
    return "infeasible"


def _throughput(ax: Axes, df: pd.DataFrame, col: str, label: str, fmt: str) -> None:
    y = list(range(len(df)))
    vals = [_num(v) for v in df[col]]
    top = max([v for v in vals if math.isfinite(v)] or [1.0])
    for i, (v, (_, row)) in enumerate(zip(vals, df.iterrows(), strict=True)):
        if row["feasible"] and math.isfinite(v):
            ax.barh(i, v, color=FEASIBLE, height=0.6)
            text = fmt.format(v)
            if col == "tflops_per_gpu" and math.isfinite(_num(row["mfu"])):
                text += f" (MFU {_num(row['mfu']) * 100:.0f}%"
                hfu = _num(row["hfu"]) if "hfu" in row else math.nan
                text += f", HFU {hfu * 100:.0f}%)" if math.isfinite(hfu) else ")"
            ax.text(v + top * 0.01, i, text, va="center", fontsize=8)
        else:
            ax.text(top * 0.01, i, _verdict(row), va="center", fontsize=8, color=OVER, fontweight="bold")
    ax.set_yticks(y, df["label"])
    ax.set_ylim(len(df) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.35)
    ax.set_xlabel(label)
    ax.grid(axis="y", visible=False)


def _memory(ax: Axes, df: pd.DataFrame, kind: str, show_labels: bool) -> None:
    peaks = [_num(v) / 1e9 for v in df[f"{kind}_peak_bytes"]]
    row_source = list(df["peak_source"])
    caps = [_num(v) / 1e9 for v in df[f"{kind}_capacity_bytes"]]
    cap_max = max([c for c in caps if math.isfinite(c)] or [0.0])
    finite = [p for p in peaks if math.isfinite(p)]
    if not finite and cap_max == 0:
        ax.text(0.5, 0.5, "no such pool", transform=ax.transAxes, ha="center", va="center", color=GREY)
    over_any = any(math.isfinite(p) and math.isfinite(c) and p > c for p, c in zip(peaks, caps, strict=True))
    limit = cap_max * (1.6 if over_any else 1.12) if cap_max else max(finite or [1.0]) * 1.3
    for i, (p, c) in enumerate(zip(peaks, caps, strict=True)):
        if math.isfinite(c):
            ax.plot([c, c], [i - 0.42, i + 0.42], **CAPACITY)
        if not math.isfinite(p):
            ax.text(limit * 0.01, i, "not simulated", va="center", fontsize=7, color=GREY)
            continue
        over = math.isfinite(c) and p > c * (1 + 1e-9)
        shown = min(p, limit * 0.97)
        ax.barh(i, shown, height=0.6, color=OVER if over else OKABE_ITO[1], hatch="//" if over else "",
                edgecolor="white" if over else OKABE_ITO[1], linewidth=0)
        pct = f" ({p / c * 100:.0f}%)" if math.isfinite(c) and c > 0 else ""
        text = f"{p:,.1f} GB{pct}"
        if shown < p:  # clipped: say so
            est = " (policy estimate)" if row_source[i] == "policy estimate" else ""
            text = f"{p:,.0f} GB needed{est} ▶ over by {p - c:,.0f} GB"
            ax.text(limit * 0.02, i - 0.36, text, va="bottom", fontsize=7, color="black", fontweight="bold")
        else:
            x = shown + limit * 0.015
            ha = "left"
            if x > limit * 0.55 or (math.isfinite(c) and x < c < x + limit * 0.35):
                x, ha = shown - limit * 0.015, "right"  # inside the bar: clear of the axes' end and the capacity line
            if ha == "right" and shown < limit * 0.35:
                x, ha = c + limit * 0.015, "left"  # too short to hold it: past the capacity line
            ax.text(x, i, text, va="center", ha=ha, fontsize=7, color="white" if over else "black")
    ax.set_xlim(0, limit)
    ax.set_ylim(len(df) - 0.5, -0.5)
    ax.set_yticks(range(len(df)), df["label"] if show_labels else [""] * len(df))
    ax.set_xlabel("GB (dashed: usable capacity)")
    ax.set_title(POOL_TITLES[kind], loc="left", fontsize=9)
    ax.grid(axis="y", visible=False)


def draw(df: pd.DataFrame, title: str) -> Figure:
    n = max(len(df), 1)
    with style():
        fig = new_figure(11.0, 2.2 + 0.55 * n * 2)
        mosaic: list[HashableList[str]] = [["tok", "tok", "tok", "tfl", "tfl", "tfl"],
                                           ["gpu", "gpu", "cpu", "cpu", "nvme", "nvme"]]
        axes = fig.subplot_mosaic(mosaic, height_ratios=[1, 1])
        _throughput(axes["tok"], df, "tokens_per_s", "tokens/s (whole job)", "{:,.0f}")
        axes["tok"].set_title("Throughput", loc="left", fontsize=9)
        _throughput(axes["tfl"], df, "tflops_per_gpu", "TFLOP/s per GPU", "{:,.1f}")
        axes["tfl"].set_title("Achieved model TFLOP/s per GPU", loc="left", fontsize=9)
        axes["tfl"].set_yticks(range(len(df)), [""] * len(df))
        for i, kind in enumerate(("gpu", "cpu", "nvme")):
            _memory(axes[kind], df, kind, show_labels=i == 0)
        suptitle(fig, title)
    return fig
