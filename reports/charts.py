"""Charts: one figure to draw with the data behind it, and drawing them into PNG, SVG and CSV files
(in worker processes when there are several)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from reports.figures import comparison, coverage, links, memory, replay, timeline, whatif
from reports.figures.style import save


@dataclass(frozen=True)
class Chart:
    """One figure to draw: plain data (picklable, so charts render in worker processes)."""

    name: str            # file stem, e.g. "fig2-memory-zero-offload"
    number: int          # which of the seven figures
    title: str
    caption: str
    data: pd.DataFrame
    note: str = ""       # a second title line (what the one-step figures show)

    def draw(self) -> Figure:
        if self.number in (2, 3, 4):
            return DRAW[self.number](self.data, self.title, self.note)
        return DRAW[self.number](self.data, self.title)


DRAW: dict[int, Callable[..., Figure]] = {1: comparison.draw, 2: memory.draw, 3: timeline.draw, 4: links.draw,
                                          5: coverage.draw, 6: whatif.draw, 7: replay.draw}


@dataclass(frozen=True)
class Written:
    chart: Chart
    png: Path
    svg: Path
    csv: Path
    png_bytes: bytes


def render(chart: Chart, out: Path) -> Written:
    fig = chart.draw()
    png, svg, data = save(fig, out / chart.name)
    csv = out / f"{chart.name}.csv"
    chart.data.to_csv(csv, index=False)
    return Written(chart, png, svg, csv, data)


def render_all(charts: Sequence[Chart], out: Path, workers: int | None = None) -> list[Written]:
    """Render the charts, in ``workers`` processes (default: one per CPU) when there are several."""
    n = min(len(charts), workers if workers is not None else os.cpu_count() or 1)
    if n <= 1:
        return [render(c, out) for c in charts]
    from planner.workers import Workers  # stopped at once on Ctrl-C/SIGTERM; its processes die with this one

    # the slowest (most tasks to draw) first, so that no long one starts last
    order = sorted(range(len(charts)), key=lambda i: -len(charts[i].data))
    written: dict[int, Written] = {}
    with Workers(n) as pool:
        for i in order:
            pool.submit(i, render, charts[i], out)
        while pool.pending():
            written.update(pool.wait())
    return [written[i] for i in range(len(charts))]
