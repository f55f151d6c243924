"""``report.md``: the same report as Markdown, linking the PNG figures written beside it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from reports.charts import Written
    from reports.contents import ReportInputs


def table_markdown(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of a DataFrame (no extra dependency)."""

    def cell(x: object) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    rule = "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(df.columns))) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def write_markdown(path: Path, inputs: ReportInputs, written: Sequence[Written],
                   tables: Sequence[tuple[str, pd.DataFrame]]) -> Path:
    from reports.html import SECTION

    out = [f"# {inputs.title}", ""]
    if inputs.sources:
        out += ["Inputs: " + ", ".join(f"`{s}`" for s in inputs.sources), ""]
    for title, df in tables:
        out += [f"## {title}", "", table_markdown(df), ""]
    for number in sorted({w.chart.number for w in written}):
        out += [f"## Figure {number}: {SECTION[number]}", ""]
        for w in written:
            if w.chart.number == number:
                c = w.chart
                out += [f"![{c.title}]({w.png.name})", "",
                        f"*Figure {number}.* {c.caption} ([SVG]({w.svg.name}), [data]({w.csv.name}))", ""]
    path.write_text("\n".join(out), encoding="utf-8")
    return path
