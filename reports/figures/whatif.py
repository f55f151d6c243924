"""Figure 6: what-if sensitivity as a tornado chart: tokens/s with each hardware change against the base."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from reports.figures.style import OKABE_ITO, new_figure, style, suptitle

GAIN, LOSS = (OKABE_ITO[2], ""), (OKABE_ITO[5], "//")


@dataclass(frozen=True)
class _Bar:
    """One row of the what-if table, as the figure reads it."""

    base: float
    delta: float
    tokens: float
    relative: float
    makes_feasible: bool


def _bars(df: pd.DataFrame) -> list[_Bar]:
    columns = ("base_tokens_per_s", "delta_tokens_per_s", "tokens_per_s", "relative", "makes_feasible")
    return [
        _Bar(float(base), float(delta), float(tokens), float(relative), bool(fits))
        for base, delta, tokens, relative, fits in zip(*(df[c].tolist() for c in columns), strict=True)
    ]


def draw(df: pd.DataFrame, title: str) -> Figure:
    n = max(len(df), 1)
    base = float(df["base_tokens_per_s"].iloc[0]) if len(df) else 0.0
    ends = list(df["tokens_per_s"]) + [base]
    lo, hi = min(ends), max(ends)
    pad = max((hi - lo) * 0.35, abs(base) * 0.05, 1.0)  # never zoom into rounding noise
    with style():
        fig = new_figure(9.0, 1.6 + 0.42 * n)
        ax = fig.subplots()
        for i, r in enumerate(_bars(df)):
            face, hatch = GAIN if r.delta >= 0 else LOSS
            ax.barh(i, r.delta, left=r.base, height=0.6, color=face, hatch=hatch, edgecolor="#333333",
                    linewidth=0)
            rel = f"{r.relative * 100:+.1f}%" if math.isfinite(r.relative) else "from infeasible"
            if math.isfinite(r.relative) and abs(r.relative) < 5e-4:
                rel = "no change"
            text = f"{r.tokens:,.0f} ({rel})" + (", makes it fit" if r.makes_feasible else "")
            right = r.delta >= 0
            ax.text(r.tokens + (pad * 0.04 if right else -pad * 0.04), i, text, va="center",
                    ha="left" if right else "right", fontsize=8)
        ax.axvline(base, color="black", linewidth=1.2)
        ax.text(base, -0.75, f"base {base:,.0f} tokens/s", ha="center", va="bottom", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.5})
        ax.set_yticks(range(len(df)), list(df["change"]))
        ax.set_ylim(n - 0.5, -1.1)
        ax.set_xlim(max(0.0, lo - pad), hi + pad)
        ax.set_xlabel("tokens/s of the best policy with the change")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.grid(axis="y", visible=False)
        fig.legend(handles=[Patch(facecolor=GAIN[0], label="faster"),
                            Patch(facecolor=LOSS[0], hatch=LOSS[1], edgecolor="#333333", label="slower")],
                   loc="outside lower center", ncol=2, frameon=False)
        suptitle(fig, title)
    return fig
