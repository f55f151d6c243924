"""``tiersim report FILE... -o DIR``: a comparison report (report.html, report.md, figures, CSV) from files.

    tiersim report all.json plan.json coverage.json whatif.json replay.json sweep.db -o out/

Accepted inputs (told apart by their ``kind`` key, else their shape; see ``reports.inputs``):
``simulate --json`` outputs (figure 1), plan files (re-simulated: figures 1-4), ``tiersim replay --json``
and ``python -m replay.validation --json`` (figure 7), ``tiersim coverage --json`` (figure 5),
``tiersim whatif --json`` (figure 6) and sweep stores (SQLite; figure 1). A file of another shape is bad
input (exit 2, one line naming it).
"""

from __future__ import annotations

import argparse
import sys

from tiersim.command import Command
from tiersim.errors import UsageError
from tiersim.exit_codes import EXIT_OK
from tiersim.output_files import check_output_dir
from tiersim.report_files import write


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="FILE",
                   help="simulate --json, plan, replay --json, coverage/whatif --json files or sweep stores")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="folder to write report.html, report.md, the figures and their CSV into (created if "
                        "missing; its parent must exist)")
    p.add_argument("--title", help="the report's title (default: from the inputs)")
    p.add_argument("--progress", action="store_true", help="report progress on stderr even when it is not a terminal")


def run(args: argparse.Namespace) -> int:
    from reports.inputs import ReportInputError, load_inputs

    out = check_output_dir("-o", args.output)
    show = args.progress or sys.stderr.isatty()

    def progress(msg: str) -> None:
        if show:
            print(f"report: {msg}", file=sys.stderr)

    try:
        inputs = load_inputs(args.inputs, args.title, progress)
    except ReportInputError as e:
        raise UsageError(str(e)) from None
    paths = write(out, inputs, show)
    figures = sum(1 for p in paths if p.suffix == ".png")
    print(f"report: {out / 'report.html'} ({figures} figure{'s' if figures != 1 else ''}; also report.md, "
          f"PNG, SVG and CSV in {out})")
    return EXIT_OK


COMMAND = Command("report", "write a comparison report (HTML, Markdown, PNG/SVG figures, CSV) from result files",
                  add_args, run)
