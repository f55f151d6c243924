"""Figure 5: which policy fits which model size on one machine, and how fast (``tiersim coverage``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from reports.figures.style import new_figure, style, suptitle

CMAP = "cividis"  # perceptually uniform and colour-blind safe
INFEASIBLE = "#DDDDDD"


def _model_label(model: str, params: float | None) -> str:
    if params is None or not math.isfinite(float(params)):
        return model
    p = float(params)
    size = f"{p / 1e9:,.0f}B" if p >= 1e10 else f"{p / 1e9:,.1f}B" if p >= 1e9 else f"{p / 1e6:,.0f}M"
    return f"{model}\n({size})"


def _fmt(x: float) -> str:
    return f"{x / 1e3:,.1f}k" if x >= 1e4 else f"{x:,.0f}"


def draw(df: pd.DataFrame, title: str) -> Figure:
    models = (df.drop_duplicates("model").assign(_p=lambda d: d["params"].fillna(0))
              .sort_values(["_p", "model"])[["model", "params"]]) if len(df) else df
    policies = list(dict.fromkeys(df["policy"]))
    mi = {m: i for i, m in enumerate(models["model"])} if len(df) else {}
    pi = {p: i for i, p in enumerate(policies)}
    grid = np.full((len(policies), len(mi)), np.nan)
    for _, r in df.iterrows():
        if r["feasible"] and r["tokens_per_s"] and float(r["tokens_per_s"]) > 0:
            grid[pi[r["policy"]], mi[r["model"]]] = float(r["tokens_per_s"])
    finite = grid[np.isfinite(grid)]
    with style():
        fig = new_figure(max(6.0, 1.6 + 1.25 * len(mi)), 1.8 + 0.62 * max(len(policies), 1))
        ax = fig.subplots()
        norm = LogNorm(vmin=finite.min(), vmax=max(finite.max(), finite.min() * 1.0001)) if finite.size else None
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=CMAP, norm=norm, aspect="auto")
        cmap = im.get_cmap()
        for _, r in df.iterrows():
            y, x = pi[r["policy"]], mi[r["model"]]
            v = grid[y, x]
            if np.isfinite(v):
                rgba = cmap(norm(v)) if norm is not None else (0, 0, 0, 1)
                light = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] > 0.5
                tfl = r["tflops_per_gpu"]
                text = f"{_fmt(v)} tok/s" + (f"\n{float(tfl):,.0f} TFLOP/s" if tfl is not None and
                                             math.isfinite(float(tfl)) else "")
                ax.text(x, y, text, ha="center", va="center", fontsize=7, color="black" if light else "white")
            else:
                ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=INFEASIBLE, hatch="xx",
                                       edgecolor="#888888", linewidth=0))
                why = str(r["binding"]) if r["binding"] not in (None, "") and r["binding"] == r["binding"] else ""
                ax.text(x, y, "does not fit" + (f"\n{why}" if why else ""), ha="center", va="center", fontsize=7,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0})
        ax.set_xticks(range(len(mi)), [_model_label(m, p) for m, p in zip(models["model"], models["params"],
                                                                           strict=True)] if len(df) else [])
        ax.set_yticks(range(len(policies)), policies)
        ax.set_xlabel("model (parameters)")
        ax.grid(False)
        ax.set_xticks(np.arange(-0.5, len(mi), 1), minor=True)
        ax.set_yticks(np.arange(-0.5, len(policies), 1), minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.tick_params(which="minor", length=0)
        if norm is not None:
            cb = fig.colorbar(im, ax=ax, shrink=0.9)
            cb.set_label("tokens/s (log scale)")
            cb.ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            cb.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _fmt(v)))
            cb.ax.yaxis.set_minor_formatter(NullFormatter())
        fig.legend(handles=[Patch(facecolor=INFEASIBLE, hatch="xx", edgecolor="#888888",
                                  label="does not fit (the pool that binds)")],
                   loc="outside lower center", frameon=False)
        suptitle(fig, title)
    return fig
