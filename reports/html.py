"""``report.html``: one self-contained page (figures embedded as base64 PNG, CSS inline; no server, no
external file, opens from disk)."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from reports.charts import Written
    from reports.contents import ReportInputs

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #111; line-height: 1.4; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #333; margin-top: 0.4em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.8em 0; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.files { font-size: 0.8em; color: #555; } nav ul { columns: 2; font-size: 0.9em; }
"""


def figure_html(w: Written) -> str:
    b64 = base64.b64encode(w.png_bytes).decode("ascii")
    c = w.chart
    return (f'<figure id="{c.name}" data-figure="{c.number}">\n'
            f'<img src="data:image/png;base64,{b64}" alt="{html.escape(c.title)}">\n'
            f"<figcaption><b>Figure {c.number}.</b> {html.escape(c.caption)} "
            f'<span class="files">Files: <a href="{w.png.name}">{w.png.name}</a>, <a href="{w.svg.name}">'
            f'{w.svg.name}</a>, data <a href="{w.csv.name}">{w.csv.name}</a></span></figcaption>\n</figure>')


def table_html(df: pd.DataFrame) -> str:
    return df.to_html(index=False, border=0, escape=True, na_rep="-")


def write_html(path: Path, inputs: ReportInputs, written: Sequence[Written],
               tables: Sequence[tuple[str, pd.DataFrame]]) -> Path:
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             f"<title>{html.escape(inputs.title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
             f"<h1>{html.escape(inputs.title)}</h1>"]
    if inputs.sources:
        parts.append("<p>Inputs: " + ", ".join(f"<code>{html.escape(s)}</code>" for s in inputs.sources) + "</p>")
    if written:
        parts.append("<nav><ul>" + "".join(f'<li><a href="#{w.chart.name}">Figure {w.chart.number}: '
                                           f"{html.escape(w.chart.title)}</a></li>" for w in written)
                     + "</ul></nav>")
    for title, df in tables:
        parts += [f"<h2>{html.escape(title)}</h2>", table_html(df)]
    for number in sorted({w.chart.number for w in written}):
        group = [w for w in written if w.chart.number == number]
        parts.append(f"<h2>Figure {number}: {html.escape(SECTION[number])}</h2>")
        parts += [figure_html(w) for w in group]
    parts += ["</body>", "</html>", ""]
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


SECTION = {1: "policy comparison", 2: "memory over one step", 3: "timeline of one step",
           4: "link utilisation over one step", 5: "coverage", 6: "what-if sensitivity",
           7: "simulated vs measured"}
