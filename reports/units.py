"""Formatting at the edge: bytes, seconds and rates for people (GB = 1e9 bytes)."""

from __future__ import annotations


def gb(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


def secs(x: float) -> str:
    if x >= 1:
        return f"{x:,.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:,.2f} ms"
    return f"{x * 1e6:,.1f} us"


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
