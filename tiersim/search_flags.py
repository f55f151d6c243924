"""The flags and helpers of the commands that run plan searches (``plan``, ``whatif``, ``coverage``,
``max-model``): search bounds, the evaluation cache, progress, durations and lists of names.

``--budget`` is a wall-clock promise on the whole command (``planner.deadline``): it returns within it
(plus the moments it takes to stop its workers and print) with the best answer found, and says what was
cut. Every one of these commands has a default budget (:data:`DEFAULT_BUDGETS`, said in its ``--help``);
``--budget none`` lifts it."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from planner.cache import EvalCache, default_cache_dir
from planner.search import OBJECTIVES
from tiersim.errors import UsageError
from tiersim.exit_codes import EXIT_CUT, EXIT_INFEASIBLE, EXIT_OK

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$")
NO_BUDGET = ("none", "off", "unbounded")

#: the wall-clock budget of each searching command when --budget is not given
DEFAULT_BUDGETS = {"plan": "10m", "whatif": "20m", "coverage": "20m", "max-model": "20m"}


#: what --workers runs in parallel, by command (the answer never depends on it)
WORKERS_HELP = {
    "plan": "processes building plans and simulating in parallel (default: 2, or 1 on one core); the answer does "
            "not depend on it",
    "whatif": "machines planned in parallel, one process each (one machine: its candidates) (default: 2, or 1 on "
              "one core); the answer does not depend on it",
    "coverage": "cells searched in parallel, one process each (default: 2, or 1 on one core); the answer does not "
                "depend on it",
    "max-model": "processes building plans and simulating in parallel within each size tried (default 1: its "
                 "searches stop at the first plan that fits, so a second worker mostly waits); the answer does not "
                 "depend on it",
}


def default_workers(command: str = "plan") -> int:
    """--workers when it is not given: 2, or 1 on a one-core machine (a search's workers and the what-if's and
    coverage's parallel searches each hold a 70B plan; more is the user's call); 1 for ``max-model``, whose
    first-feasible searches gained nothing from a second worker (89 s with one, 91 s with two, 2 cores)."""
    return 1 if command == "max-model" else min(2, os.cpu_count() or 1)


def budget_help(command: str, what: str) -> str:
    """The --budget help text of ``command``: the promise, what it bounds and its default."""
    return (f"wall-clock budget of {what}, e.g. 60s, 5m or 1h: the command returns within it with the best "
            f"answer found and says what was cut (default {DEFAULT_BUDGETS[command]}; 'none' for no limit)")


def add_budget_arg(p: argparse.ArgumentParser, command: str, what: str) -> None:
    p.add_argument("--budget", default=DEFAULT_BUDGETS[command], metavar="TIME", help=budget_help(command, what))


def add_search_args(p: argparse.ArgumentParser, command: str, budget_what: str, objective: bool = True) -> None:
    """Search bounds, cache and output flags of ``whatif``, ``coverage`` and ``max-model``, spelled as for
    ``tiersim plan`` (which declares its own help texts and defaults)."""
    if objective:
        p.add_argument("--objective", default="tokens_per_s", choices=OBJECTIVES,
                       help="what 'best' means (default: tokens_per_s)")
    add_budget_arg(p, command, budget_what)
    p.add_argument("--max-candidates", type=int, default=None, metavar="N",
                   help="simulate at most N candidates per search")
    p.add_argument("--workers", type=int, default=default_workers(command),
                   help=WORKERS_HELP[command])
    p.add_argument("--cache-dir", default=None,
                   help="evaluation cache directory (default: $XDG_CACHE_HOME/tiersim or ~/.cache/tiersim)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--progress", action="store_true",
                   help="print progress on stderr even when it is not a terminal")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def check_search_bounds(args: argparse.Namespace) -> None:
    if args.workers < 1:
        raise UsageError(f"--workers {args.workers}: must be at least 1")
    if args.max_candidates is not None and args.max_candidates < 1:
        raise UsageError(f"--max-candidates {args.max_candidates}: must be at least 1")


def cache_from_args(args: argparse.Namespace) -> EvalCache | None:
    """The evaluation cache ``--cache-dir`` names (default directory otherwise); None with ``--no-cache``."""
    return None if args.no_cache else EvalCache(args.cache_dir or default_cache_dir(), warn=_warn)


def _warn(message: str) -> None:
    print(f"tiersim: {message}", file=sys.stderr)


def search_options(args: argparse.Namespace) -> dict[str, Any]:
    """budget_s, max_candidates, workers and cache for the planner's calls, validated."""
    check_search_bounds(args)
    return {"budget_s": parse_budget(args.budget), "max_candidates": args.max_candidates, "workers": args.workers,
            "cache": cache_from_args(args)}


def parse_duration(text: str, flag: str = "--budget") -> float:
    """A wall time (60s, 90, 2m, 1h) -> seconds, more than zero."""
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"{flag} {text!r}: expected a duration such as 60s, 90, 2m or 1h (or none for no limit)")
    value = float(m[1]) * {"s": 1, "sec": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m[2]]
    if value <= 0:
        raise UsageError(f"{flag} {text!r}: must be more than zero")
    return value


def parse_budget(text: str | None, flag: str = "--budget") -> float | None:
    """:func:`parse_duration` of a flag that may be absent (None stays None) or say ``none`` (no limit)."""
    if text is None or text.strip().lower() in NO_BUDGET:
        return None
    return parse_duration(text, flag)


def split_names(text: str, flag: str, example: str) -> list[str]:
    """A comma-separated list of names: none empty, none twice (one line naming ``flag`` otherwise)."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise UsageError(f"{flag} {text!r}: give comma-separated names, none empty, e.g. {flag} {example}")
    dupes = sorted({t for t in items if items.count(t) > 1})
    if dupes:
        raise UsageError(f"{flag}: {dupes[0]!r} is given twice; list each once")
    return items


def progress_printer(args: argparse.Namespace) -> Callable[[str], None] | None:
    """Progress lines on stderr for a person watching (a terminal) or when --progress asks for them."""
    if not (args.progress or sys.stderr.isatty()):
        return None

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    return say


def fmt_rate(x: float | None) -> str:
    """Tokens/s with thousands separators; '-' when there is none."""
    return "-" if x is None else f"{x:,.0f}"


def search_exit(feasible: bool, cut: bool) -> int:
    """A search command's exit code: 0 something fits, 4 nothing evaluated fits but the budget cut the search
    (not settled: a cut is no proof of infeasibility), 3 nothing fits (proven within the search's checks)."""
    if feasible:
        return EXIT_OK
    return EXIT_CUT if cut else EXIT_INFEASIBLE
