"""Writing a report folder (report.html, report.md, figures, CSV) from a command: ``tiersim report`` and
``simulate --report DIR``. The report is drawn into a temporary folder beside DIR and its files renamed
into DIR once all are written (``tiersim.output_files.atomic_folder``): an interruption leaves none of it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from reports.contents import ReportInputs
from tiersim.errors import UsageError
from tiersim.output_files import atomic_folder
from tiersim.signals import stderr_line


def write(out: Path, inputs: ReportInputs, show: bool) -> list[Path]:
    """Write the report; progress on stderr when ``show``; a bad folder is one UsageError line."""
    from reports.build import write_report  # matplotlib: imported only when a report is written

    t0 = time.perf_counter()
    if show:
        stderr_line(f"report: drawing figures into {out} ...")
    try:
        with atomic_folder(out) as tmp:  # the whole report or none of it (tiersim.output_files)
            paths = [out / p.relative_to(tmp) for p in write_report(tmp, inputs)]
    except OSError as e:
        raise UsageError(f"report folder {out}: cannot write ({e.strerror or e})") from None
    if show:
        stderr_line(f"report: {len(paths)} files in {time.perf_counter() - t0:.1f} s")
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
