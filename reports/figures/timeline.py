"""Figure 3: a Gantt chart of one GPU's streams, the CPU's and NVMe's over one step.

Bars are tasks coloured (and, for transfers, hatched) by what they do; the extra row under the GPU's
streams marks where that GPU moves data while computing nothing: transfers that stall it rather than
hide behind its compute.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from reports.figures.memory import time_unit
from reports.figures.style import GREY, OKABE_ITO, fixed_margins, label_width, new_figure, style, suptitle
from reports.frames import CATEGORIES, EXPOSED

# category -> (face colour, hatch)
LOOK = {  # category -> (face colour, hatch, hatch colour); hatches kept sparse: dense ones render slowly
    "forward": (OKABE_ITO[4], "", "none"),
    "backward": (OKABE_ITO[1], "", "none"),
    "recompute": (OKABE_ITO[6], "", "none"),
    "optimizer": (OKABE_ITO[2], "", "none"),
    "other compute": (GREY, "", "none"),
    "copy": (OKABE_ITO[0], "//", "#333333"),
    "NVMe I/O": (OKABE_ITO[3], "xx", "#333333"),
    "collective": (OKABE_ITO[7], "\\\\", "#ffffff"),
    EXPOSED: (OKABE_ITO[5], "", "none"),
}


PIXEL = 1 / 1500  # bars closer than this fraction of the step are drawn as one (the CSV keeps every task)


def merged(starts: Iterable[float], ends: Iterable[float], gap: float) -> list[tuple[float, float]]:
    """(start, width) of the intervals with gaps below ``gap`` closed: what a screen shows anyway, and
    far fewer (hatched) rectangles to render."""
    out: list[list[float]] = []
    for a, b in sorted(zip(starts, ends, strict=True)):
        if out and a - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, max(b - a, gap)) for a, b in out]


def draw(df: pd.DataFrame, title: str, notes: str = "") -> Figure:
    rows = df.drop_duplicates("row").sort_values("row_index")[["row", "row_index"]] if len(df) else df
    labels = list(rows["row"]) if len(df) else []
    index = {r: i for i, r in enumerate(labels)}
    span = float(df["end_s"].max()) if len(df) else 0.0
    scale, unit = time_unit(span)
    with style():
        fig = new_figure(11.0, 1.9 + 0.32 * max(len(labels), 3), constrained=False)
        ax = fig.subplots()
        present = []
        for cat in CATEGORIES:
            part = df[df["category"] == cat]
            if part.empty:
                continue
            present.append(cat)
            face, hatch, ink = LOOK[cat]
            for row, grp in part.groupby("row", sort=False):
                spans = merged(grp["start_s"] / scale, grp["end_s"] / scale, span / scale * PIXEL)
                ax.broken_barh(spans, (index[row] - 0.38, 0.76), facecolors=face, hatch=hatch,
                               edgecolor=ink if hatch else face, linewidth=0)
        devices = list(df.drop_duplicates("row").sort_values("row_index")["device"])
        for i in range(1, len(devices)):
            if devices[i] != devices[i - 1] and not (devices[i].startswith("cpu") and devices[i - 1].startswith("cpu")):
                ax.axhline(i - 0.5, color="black", linewidth=0.8)
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_xlim(0, span / scale if span else 1.0)
        ax.set_xlabel(f"time since the step began ({unit})")
        ax.grid(axis="y", visible=False)
        handles = [Patch(facecolor=LOOK[c][0], hatch=LOOK[c][1], edgecolor=LOOK[c][2] if LOOK[c][1] else "#333333",
                         label=c) for c in present]
        fig.legend(handles=handles, loc="lower center", ncol=min(5, len(handles)), frameon=False)
        heading = suptitle(fig, title, notes)
        legend_rows = -(-len(handles) // 5)
        fixed_margins(fig, left=label_width(labels) + 0.25, bottom=0.55 + 0.22 * legend_rows, top=0.3 + 0.2 * heading)
    return fig
