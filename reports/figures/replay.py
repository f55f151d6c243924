"""Figure 7: simulated against measured (``tiersim replay``): step time and peak bytes per pool, with
the identity line, and the error of each case."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from reports.figures.style import OKABE_ITO, colour, marker, new_figure, style, suptitle


def _scatter(ax: Axes, part: pd.DataFrame, scale: float, unit: str, what: str, cases: list[str]) -> None:
    sim, meas = part["simulated"].to_numpy() / scale, part["measured"].to_numpy() / scale
    for i, case in enumerate(cases):
        m = (part["case"] == case).to_numpy()
        if m.any():
            ax.scatter(sim[m], meas[m], marker=marker(i), color=colour(i), s=36, edgecolor="black", linewidth=0.5,
                       label=case, zorder=3)
    vals = np.concatenate([sim, meas]) if len(sim) else np.array([1.0])
    pos = vals[vals > 0]
    lo, hi = (pos.min(), pos.max()) if pos.size else (1.0, 1.0)
    log = hi / lo > 30
    lo, hi = (lo / 1.6, hi * 1.6) if log else (0.0, hi * 1.15 or 1.0)
    line = np.array([lo if lo > 0 else 0.0, hi])
    ax.plot(line, line, color="black", linewidth=1.0, label="identity (measured = simulated)")
    for f, ls in ((1.3, "--"), (1 / 1.3, "--")):
        ax.plot(line, line * f, color="#777777", linewidth=0.8, linestyle=ls)
    ax.text(hi, hi / 1.3, "x1/1.3 ", fontsize=7, color="#555555", ha="right", va="top")
    ax.text(hi / 1.3, hi, "x1.3 ", fontsize=7, color="#555555", ha="right", va="top")
    if 0 < len(part) <= 10 and "figure" in part and part["figure"].str.startswith("peak").all():
        for x, y, f in zip(sim, meas, part["figure"], strict=True):  # name the pool of each point
            ax.annotate(f.removeprefix("peak "), (x, y), xytext=(4, -10), textcoords="offset points", fontsize=7)
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel(f"simulated {what} ({unit})" + (", log scale" if log else ""))
    ax.set_ylabel(f"measured {what} ({unit})")
    ax.set_title(what.capitalize(), loc="left", fontsize=9)


def byte_unit(top: float) -> tuple[float, str]:
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if top >= scale:
            return scale, unit
    return 1.0, "bytes"


def draw(df: pd.DataFrame, title: str) -> Figure:
    cases = list(dict.fromkeys(df["case"]))
    step = df[df["figure"] == "step time"]
    peak = df[df["figure"].str.startswith("peak")]
    with style():
        fig = new_figure(12.0, 4.6 + 0.18 * len(cases))
        axes = fig.subplots(1, 3, width_ratios=[1, 1, 1.25])
        _scatter(axes[0], step, 1.0, "s", "step time", cases)
        top = float(peak[["simulated", "measured"]].to_numpy().max()) if len(peak) else 1.0
        _scatter(axes[1], peak, *byte_unit(top), "peak bytes per pool", cases)
        ax = axes[2]
        y = np.arange(len(cases))
        worst = [peak[peak["case"] == c]["error"].abs().max() if (peak["case"] == c).any() else math.nan
                 for c in cases]
        steps = [step[step["case"] == c]["error"].iloc[0] if (step["case"] == c).any() else math.nan for c in cases]
        ax.barh(y - 0.2, [s * 100 for s in steps], height=0.38, color=OKABE_ITO[4], label="step time")
        ax.barh(y + 0.2, [w * 100 for w in worst], height=0.38, color=OKABE_ITO[0], hatch="//", edgecolor="#333333",
                linewidth=0, label="peak bytes, worst pool (|error|)")
        for yi, s, w in zip(y, steps, worst, strict=True):
            if math.isfinite(s):
                ax.text(s * 100, yi - 0.2, f" {s * 100:+.1f}%", va="center", fontsize=7,
                        ha="left" if s >= 0 else "right")
            if math.isfinite(w):
                ax.text(w * 100, yi + 0.2, f" {w * 100:.1f}%", va="center", fontsize=7)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(y, cases)
        ax.set_ylim(len(cases) - 0.5, -0.5)
        ax.set_xlabel("error = measured / simulated - 1 (%)")
        ax.set_title("Error per case", loc="left", fontsize=9)
        ax.grid(axis="y", visible=False)
        lim = max([abs(v) * 100 for v in steps + worst if math.isfinite(v)] or [1.0]) * 1.35
        ax.set_xlim(-lim if any(math.isfinite(s) and s < 0 for s in steps) else 0, lim)
        ax.legend(loc="lower right", fontsize=7)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=min(6, len(labels)), frameon=False)
        suptitle(fig, title)
    return fig
