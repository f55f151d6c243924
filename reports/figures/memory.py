"""Figure 2: bytes in each pool over one step, stacked by tensor kind, with the capacity line."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from reports.figures.style import CAPACITY, colour, fixed_margins, hatch, new_figure, style, suptitle
from reports.frames import KIND_LABELS, KIND_ORDER

INK = "#333333"  # hatch colour
FAR = 4.0  # capacity this many times the peak: scale the axis to the peak and state the capacity in words


def thinned(part: pd.DataFrame, span: float, bins: int = 1000) -> pd.DataFrame:
    """At most about two rows per ``1/bins`` of the step for drawing: in each bin the row with the most
    bytes and the bin's last row (whole rows, so the stack stays consistent and no peak is lost). The CSV
    keeps every row."""
    if len(part) <= 2 * bins or span <= 0:
        return part
    b = np.minimum((part["time_s"].to_numpy() / span * bins).astype(int), bins - 1)
    pos = np.arange(len(part))
    frame = pd.DataFrame({"b": b, "pos": pos, "total": part["total_bytes"].to_numpy()})
    peak = frame.loc[frame.groupby("b")["total"].idxmax(), "pos"]
    last = frame.groupby("b")["pos"].max()
    keep = np.union1d(np.union1d(peak.to_numpy(), last.to_numpy()), [0, len(part) - 1])
    return part.iloc[keep]


def time_unit(span_s: float) -> tuple[float, str]:
    """Seconds or milliseconds, whichever reads better for a span."""
    return (1.0, "s") if span_s >= 2.0 else (1e-3, "ms")


def draw(df: pd.DataFrame, title: str, notes: str = "") -> Figure:
    pools = list(dict.fromkeys(df["pool"]))
    kinds = [c for c in df.columns if c not in ("pool", "time_s", "total_bytes", "capacity_bytes")]
    used = [k for k in kinds if (df[k] > 0).any()]
    span = float(df["time_s"].max()) if len(df) else 0.0
    scale, unit = time_unit(span)
    with style():
        fig = new_figure(10.0, 1.6 + 2.3 * max(len(pools), 1), constrained=False)
        axes = fig.subplots(max(len(pools), 1), 1, sharex=True, squeeze=False)[:, 0]
        for ax, pool in zip(axes, pools, strict=False):
            part = thinned(df[df["pool"] == pool], span)
            t = part["time_s"].to_numpy() / scale
            base = np.zeros(len(part))
            for k in used:
                i = KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER)
                top = base + part[k].to_numpy() / 1e9
                ax.fill_between(t, base, top, step="post", facecolor=colour(i), hatch=hatch(i), edgecolor=INK,
                                linewidth=0)
                base = top
            cap = float(part["capacity_bytes"].iloc[0]) / 1e9 if len(part) else float("nan")
            peak = float(part["total_bytes"].max()) / 1e9 if len(part) else 0.0
            far = np.isfinite(cap) and cap > FAR * peak  # the stack would be a sliver under the capacity line
            if np.isfinite(cap) and not far:
                ax.axhline(cap, **CAPACITY)
                ax.text(t[-1] if len(t) else 0, cap, f"usable capacity {cap:,.1f} GB ", ha="right", va="bottom",
                        fontsize=8)
            ax.set_ylim(0, (peak if far else max(peak, cap if np.isfinite(cap) else 0.0)) * 1.15 or 1.0)
            ax.set_ylabel("GB")
            used_pct = f" ({peak / cap * 100:.1f}% of the usable {cap:,.1f} GB" + (
                ", whose line is above this axis)" if far else ")") if np.isfinite(cap) and cap > 0 else ""
            ax.set_title(f"{pool}: peak in this step {peak:,.1f} GB{used_pct}", loc="left", fontsize=9)
            ax.set_xlim(0, span / scale if span else 1.0)
        axes[-1].set_xlabel(f"time since the step began ({unit})")
        handles = [Patch(facecolor=colour(KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER)),
                         hatch=hatch(KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER)),
                         edgecolor=INK, label=KIND_LABELS.get(k, k)) for k in used]
        handles.append(Patch(facecolor="none", edgecolor="black", linestyle="--", label="usable capacity"))
        rows = -(-len(handles) // 5)
        fig.legend(handles=handles, loc="lower center", ncol=min(5, len(handles)), frameon=False)
        heading = suptitle(fig, title, notes)
        fixed_margins(fig, left=0.75, bottom=0.55 + 0.22 * rows, top=0.55 + 0.2 * heading)
    return fig
