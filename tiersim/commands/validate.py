"""``tiersim validate``: prints each case, the mean and max error, and fails above a case's tolerance."""

from __future__ import annotations

import argparse
import json
import statistics

from planner.result_json import versioned
from reports.units import table
from tiersim.command import Command
from tiersim.exit_codes import EXIT_FAILED, EXIT_OK
from tiersim.validate import run_cases


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    outcomes = run_cases()
    errors = [abs(o.error) for o in outcomes]
    failed = [o for o in outcomes if not o.ok]
    if args.json:
        print(json.dumps(versioned({
            "cases": [{"name": o.case.name, "source": o.case.source, "published": o.case.published,
                       "simulated": o.simulated, "unit": o.case.unit, "error": o.error,
                       "tolerance": o.case.tolerance, "ok": o.ok, "note": o.case.note} for o in outcomes],
            "mean_abs_error": statistics.fmean(errors), "max_abs_error": max(errors), "failed": len(failed)}),
            indent=1))
    else:
        rows = [[o.case.name, f"{o.case.published:.4g}", f"{o.simulated:.4g}", o.case.unit,
                 f"{o.error * 100:+.1f}%", f"±{o.case.tolerance * 100:g}%", "ok" if o.ok else "FAIL"]
                for o in outcomes]
        print(table(rows, ["case", "published", "simulated", "unit", "error", "tolerance", ""], "lrrlrrl"))
        print()
        for o in outcomes:
            print(f"- {o.case.name}: {o.case.source}" + (f" ({o.case.note})" if o.case.note else ""))
        print()
        print(f"mean |error| {statistics.fmean(errors) * 100:.1f}%, max |error| {max(errors) * 100:.1f}%, "
              f"{len(failed)} of {len(outcomes)} outside tolerance")
    return EXIT_FAILED if failed else EXIT_OK


COMMAND = Command("validate", "compare the simulator with published figures", add_args, run)
