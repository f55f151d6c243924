"""The look shared by every figure: Agg backend, a colour-blind-safe palette, hatches, saving.

Colours are Okabe & Ito's eight (distinguishable with every common colour-vision deficiency); every
series also gets a hatch or a marker, so nothing is told by colour alone (grey-scale print included).
Figures are plain ``matplotlib.figure.Figure`` objects drawn on an Agg canvas (no pyplot, no display,
no global state): the style is applied with ``rc_context`` around drawing and saving.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

# Okabe-Ito: orange, sky blue, bluish green, yellow, blue, vermillion, reddish purple, black
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")
GREY = "#999999"
HATCHES = ("", "//", "..", "xx", "\\\\", "++", "oo", "--")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
CAPACITY: dict[str, Any] = {"color": "#000000", "linestyle": "--", "linewidth": 1.4}
DPI = 100

RC: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "hatch.linewidth": 0.6,
    "svg.hashsalt": "tiersim",   # deterministic SVG ids
    "svg.fonttype": "none",      # text stays text in the SVG (searchable, small)
    "path.simplify": True,
}


@contextmanager
def style() -> Iterator[None]:
    with matplotlib.rc_context(RC):
        yield


def new_figure(width: float, height: float, constrained: bool = True) -> Figure:
    """A figure on an Agg canvas (inches); use it inside ``style()``. ``constrained=False`` for figures
    that call ``fixed_margins`` (a constrained layout costs a fifth of a figure's drawing time)."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained" if constrained else None)
    FigureCanvasAgg(fig)
    return fig


def fixed_margins(fig: Figure, *, left: float, bottom: float, top: float, right: float = 0.25,
                  hspace: float = 0.55) -> None:
    """Margins in inches (and the gap between stacked axes), for figures of a known shape."""
    w, h = fig.get_size_inches()
    n = max(len(fig.axes), 1)
    axes_h = max(h - top - bottom, 0.5)
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h,
                        hspace=hspace / max(axes_h / n - hspace, 0.3))


def suptitle(fig: Figure, title: str, notes: str = "") -> int:
    """The figure's bold title, the notes wrapped to the figure's width under it; returns its line count."""
    width = int(fig.get_size_inches()[0] * 12)  # characters of 10 pt bold per inch, with a margin
    lines = textwrap.wrap(title, width) + (textwrap.wrap(notes, width) if notes else [])
    fig.suptitle("\n".join(lines), fontsize=10, fontweight="bold")
    return len(lines)


def label_width(labels: list[str], fontsize: float = 8.0) -> float:
    """Inches a column of tick labels needs (DejaVu Sans averages ~0.6 em per character)."""
    return max((len(s) for s in labels), default=0) * fontsize * 0.6 / 72


def colour(i: int) -> str:
    return OKABE_ITO[i % len(OKABE_ITO)]


def hatch(i: int) -> str:
    return HATCHES[i % len(HATCHES)]


def marker(i: int) -> str:
    return MARKERS[i % len(MARKERS)]


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    with style():
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, pil_kwargs={"compress_level": 3})
    return buf.getvalue()


def save(fig: Figure, stem: Path) -> tuple[Path, Path, bytes]:
    """Write ``stem``.png and ``stem``.svg; returns both paths and the PNG's bytes (for embedding)."""
    png = png_bytes(fig)
    fig.set_layout_engine("none")  # the PNG's draw laid it out; the SVG keeps that layout (half the work)
    png_path, svg_path = stem.with_suffix(".png"), stem.with_suffix(".svg")
    png_path.write_bytes(png)
    with style():
        fig.savefig(svg_path, format="svg", dpi=DPI, metadata={"Date": None, "Creator": None})
    return png_path, svg_path, png
