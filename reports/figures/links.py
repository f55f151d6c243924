"""Figure 4: the rate of each direction of each link over one step (GB/s), against its bandwidth.

One panel per link; the forward direction (away from host DRAM: to the GPU, into NVMe) is drawn above
the zero line and the reverse direction below it, each with its bandwidth as a dotted line, so the two
directions are told apart by position as well as colour.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from reports.figures.memory import time_unit
from reports.figures.style import OKABE_ITO, fixed_margins, new_figure, style, suptitle

DIRECTION_LOOK = {"fwd": (OKABE_ITO[4], 1.0), "rev": (OKABE_ITO[5], -1.0)}
BINS = 500  # the step is drawn as this many time bins: transfers shorter than a pixel would alias away


def binned(ts: np.ndarray, rates: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bin edges, mean rate, max rate) of the step function ``rates`` (holding from each time in ``ts``
    to the next) over ``n`` equal bins from ts[0] to ts[-1]. The mean is exact (bytes per bin / bin width)."""
    edges = np.linspace(ts[0], ts[-1], n + 1)
    area = np.concatenate([[0.0], np.cumsum(np.diff(ts) * rates[:-1])])  # bytes moved up to each ts
    moved = np.interp(edges, ts, area)
    mean = np.diff(moved) / np.maximum(np.diff(edges), 1e-30)
    lo = np.clip(np.searchsorted(ts, edges[:-1], side="right") - 1, 0, len(ts) - 1)
    hi = np.clip(np.searchsorted(ts, edges[1:], side="left") - 1, 0, len(ts) - 1)
    peak = np.array([rates[a:max(a, b) + 1].max() for a, b in zip(lo, hi, strict=True)])
    return edges, mean, peak


def draw(df: pd.DataFrame, title: str, notes: str = "") -> Figure:
    links = list(dict.fromkeys(df["link"]))
    span = float(df["time_s"].max()) if len(df) else 0.0
    scale, unit = time_unit(span)
    with style():
        fig = new_figure(10.0, 1.5 + 1.9 * max(len(links), 1), constrained=False)
        axes = fig.subplots(max(len(links), 1), 1, sharex=True, squeeze=False)[:, 0]
        if not links:
            axes[0].text(0.5, 0.5, "no link carried bytes in this step", transform=axes[0].transAxes,
                         ha="center", va="center")
        for ax, ln in zip(axes, links, strict=False):
            part = df[df["link"] == ln]
            caps = [0.0]
            for d in ("fwd", "rev"):
                sub = part[part["direction"] == d]
                if sub.empty:
                    continue
                col, sign = DIRECTION_LOOK[d]
                ts = sub["time_s"].to_numpy()
                rates = sub["rate_Bps"].to_numpy()
                cap = float(sub["capacity_Bps"].iloc[0]) / 1e9
                caps.append(cap)
                dt = np.diff(ts)
                busy = float(np.sum(dt * (rates[:-1] > 0))) / max(span, 1e-30) if len(ts) > 1 else 0.0
                mean = float(np.sum(dt * rates[:-1])) / max(span, 1e-30) / 1e9 if len(ts) > 1 else 0.0
                label = f"{sub['label'].iloc[0]}: mean {mean:,.1f} GB/s, busy {busy * 100:.0f}% of the step"
                if len(ts) > 1 and ts[-1] > ts[0]:
                    edges, avg, top_rate = binned(ts, rates, BINS)
                    t = edges / scale
                    ax.stairs(sign * avg / 1e9, t, baseline=0, fill=True, color=col, alpha=0.6, linewidth=0,
                              label=label)
                    ax.stairs(sign * top_rate / 1e9, t, baseline=None, color=col, linewidth=0.6)
                ax.axhline(sign * cap, color="black", linestyle=":", linewidth=1.0)
                ax.text(span / scale if span else 1.0, sign * cap, f"{cap:,.1f} GB/s ",
                        va="bottom" if sign > 0 else "top", ha="right", fontsize=7)
            top = max(caps) * 1.3 or 1.0
            ax.axhline(0, color="black", linewidth=0.6)
            kind = part["kind"].iloc[0] if len(part) else ""
            ax.set_title(f"{ln} ({kind})", loc="left", fontsize=9)
            ax.set_ylabel("GB/s")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{abs(v):g}"))
            ax.set_ylim(-top, top)
            ax.legend(loc="upper left", fontsize=7, frameon=True, framealpha=0.85, ncol=2)
            ax.set_xlim(0, span / scale if span else 1.0)
        axes[-1].set_xlabel(f"time since the step began ({unit}); filled: mean rate per 1/{BINS} of the step, "
                            "thin line: its highest rate, dotted: bandwidth of each direction")
        heading = suptitle(fig, title, notes)
        fixed_margins(fig, left=0.7, bottom=0.55, top=0.55 + 0.2 * heading)
    return fig
