"""Formatting at the edge: bytes, seconds and rates for people (GB = 1e9 bytes)."""

from __future__ import annotations

from hardware_models.units import gb, secs

__all__ = ["gb", "secs", "pct", "table", "group_numbered"]


def pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def table(rows: list[list[str]], header: list[str] | None = None, align: str = "") -> str:
    """A plain-text table; ``align`` holds 'l' or 'r' per column (default: first left, rest right)."""
    all_rows = ([header] if header else []) + rows
    if not all_rows:
        return ""
    ncol = max(len(r) for r in all_rows)
    widths = [max(len(r[c]) if c < len(r) else 0 for r in all_rows) for c in range(ncol)]
    al = align or ("l" + "r" * (ncol - 1))
    lines = []
    for k, r in enumerate(all_rows):
        cells = []
        for c in range(ncol):
            v = r[c] if c < len(r) else ""
            cells.append(v.ljust(widths[c]) if al[c] == "l" else v.rjust(widths[c]))
        lines.append("  ".join(cells).rstrip())
        if header and k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def group_numbered(rows: list[list[str]]) -> list[list[str]]:
    """Merge runs of rows that differ only in the number of their first cell: eight identical GPU rows
    become one ``gpu0-7 (each)`` row, ``gpu0.nvlink`` .. ``gpu7.nvlink`` one ``gpu0-7.nvlink (each)``."""
    import re

    out: list[list[str]] = []
    run: list[tuple[int, list[str]]] = []
    pattern = re.compile(r"^([a-z_]+)(\d+)(.*)$")

    def flush() -> None:
        if not run:
            return
        if len(run) == 1:
            out.append(run[0][1])
        else:
            m = pattern.match(run[0][1][0])
            assert m is not None
            out.append([f"{m[1]}{run[0][0]}-{run[-1][0]}{m[3]} (each)", *run[0][1][1:]])
        run.clear()

    for row in rows:
        m = pattern.match(row[0])
        if m is None:
            flush()
            out.append(row)
            continue
        n = int(m[2])
        if run:
            m0 = pattern.match(run[-1][1][0])
            assert m0 is not None
            if not (m0[1] == m[1] and m0[3] == m[3] and n == run[-1][0] + 1 and run[-1][1][1:] == row[1:]):
                flush()
        run.append((n, row))
    flush()
    return out
