"""Writing a report folder (report.html, report.md, figures, CSV) from a command: ``tiersim report`` and
``simulate --report DIR``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from reports.contents import ReportInputs
from tiersim.errors import UsageError


def write(out: Path, inputs: ReportInputs, show: bool) -> list[Path]:
    """Write the report; progress on stderr when ``show``; a bad folder is one UsageError line."""
    from reports.build import write_report  # matplotlib: imported only when a report is written

    t0 = time.perf_counter()
    if show:
        print(f"report: drawing figures into {out} ...", file=sys.stderr)
    try:
        paths = write_report(out, inputs)
    except OSError as e:
        raise UsageError(f"report folder {out}: cannot write ({e.strerror or e})") from None
    if show:
        print(f"report: {len(paths)} files in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return paths


def write_report_for(args: argparse.Namespace, items: list[Any], title: str | None = None) -> None:
    """``--report DIR``: the report of these results (Results simulated here, or result dicts)."""
    if args.report is None:
        return
    from reports.inputs import default_title

    inputs = ReportInputs(items=list(items))
    inputs.title = title or default_title(inputs)
    paths = write(Path(args.report), inputs, sys.stderr.isatty())
    line = f"report: {Path(args.report) / 'report.html'} ({sum(1 for p in paths if p.suffix == '.png')} figures)"
    if not args.json:
        print(line)
    elif sys.stderr.isatty():
        print(line, file=sys.stderr)
