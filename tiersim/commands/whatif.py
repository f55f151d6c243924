"""``tiersim whatif``: plan a job on a grid of hardware changes; rank the single changes.

    tiersim whatif --hw a100x8 --model 70b --vary host.dram=512GB,1TB,2TB --vary pcie.gen=4,5 --vary nvme.count=1,4

Also holds the flags and helpers that ``max-model`` and ``coverage`` share with it (workload request,
``--budget``, ``--progress``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from planner.job import JobRequest
from tiersim.cli import DEFAULT_HW, DEFAULT_MODEL, UsageError

EXIT_OK, EXIT_INFEASIBLE = 0, 3


# ------------------------------------------------------------------------------------- shared flags


def add_hardware_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hw", default=DEFAULT_HW, help=f"hardware preset or YAML file (default: {DEFAULT_HW})")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=VALUE",
                   help="override a hardware field for every run, e.g. --set host.dram=1TB")


def add_request_args(p: argparse.ArgumentParser) -> None:
    """The workload the search keeps fixed (the search varies micro-batch unless it is given)."""
    p.add_argument("--micro-batch", type=int, help="fix the micro-batch (default: the search picks it)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's context, <= 4096)")
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step over all GPUs "
                                                    "(default: 8 per GPU)")
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--checkpointing", choices=["none", "selective", "full"],
                   help="fix activation checkpointing (default: the search picks it)")
    p.add_argument("--no-flash-attention", dest="flash", action="store_false", default=None)


def add_search_args(p: argparse.ArgumentParser, budget_help: str, objective: bool = True) -> None:
    """Search bounds, cache and output flags, spelled as for ``tiersim plan``."""
    from planner.search import OBJECTIVES

    if objective:
        p.add_argument("--objective", default="tokens_per_s", choices=OBJECTIVES,
                       help="what 'best' means (default: tokens_per_s)")
    p.add_argument("--budget", default=None, metavar="TIME", help=budget_help)
    p.add_argument("--max-candidates", type=int, default=None, metavar="N",
                   help="simulate at most N candidates per search")
    p.add_argument("--workers", type=int, default=1, help="processes simulating in parallel (default 1)")
    p.add_argument("--cache-dir", default=None,
                   help="evaluation cache directory (default: $XDG_CACHE_HOME/tiersim or ~/.cache/tiersim)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--progress", action="store_true",
                   help="print progress on stderr even when it is not a terminal")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def search_options(args: argparse.Namespace) -> dict[str, Any]:
    """budget_s, max_candidates, workers and cache for the planner's calls, validated."""
    from planner.cache import EvalCache, default_cache_dir

    if args.workers < 1:
        raise UsageError(f"--workers {args.workers}: must be at least 1")
    if args.max_candidates is not None and args.max_candidates < 1:
        raise UsageError(f"--max-candidates {args.max_candidates}: must be at least 1")
    return {"budget_s": parse_budget(args.budget), "max_candidates": args.max_candidates, "workers": args.workers,
            "cache": None if args.no_cache else EvalCache(args.cache_dir or default_cache_dir())}


def request_from_args(args: argparse.Namespace) -> JobRequest:
    for flag, value in (("--micro-batch", args.micro_batch), ("--seq-len", args.seq_len),
                        ("--global-batch", args.global_batch)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: must be a positive whole number")
    return JobRequest(micro_batch=args.micro_batch, seq_len=args.seq_len, global_batch=args.global_batch,
                      precision=args.precision, checkpointing=args.checkpointing, flash_attention=args.flash)


def parse_budget(text: str | None, flag: str = "--budget") -> float | None:
    """A wall time as ``tiersim plan --budget`` takes it (60s, 90, 2m, 1h) -> seconds; None stays None."""
    from tiersim.commands.plan import parse_duration

    if text is None:
        return None
    try:
        return parse_duration(text)
    except UsageError as e:
        raise UsageError(str(e).replace("--budget", flag, 1)) from None


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


def dumps(d: dict[str, Any]) -> str:
    from tiersim.commands.simulate import _dumps

    return _dumps(d)


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def fmt_gain(x: float | None) -> str:
    if x is None:
        return "-"
    return "0.0%" if abs(x) < 5e-4 else f"{x * 100:+.1f}%"


# ------------------------------------------------------------------------------------------ whatif


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Plan the job on every combination of hardware changes (the cartesian product of the "
                     "--vary values) and rank each single change from the hardware as given.")
    p.epilog = ("example: tiersim whatif --hw a100x8 --model 70b --vary host.dram=512GB,1TB,2TB "
                "--vary pcie.gen=4,5 --vary nvme.count=1,4.  exit codes: 0 some scenario is feasible, "
                "2 bad input, 3 no scenario is feasible")
    add_hardware_args(p)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model preset/shorthand or file (default: {DEFAULT_MODEL})")
    p.add_argument("--vary", action="append", default=[], metavar="PATH=V1,V2,...",
                   help="a hardware field and the values it takes (repeatable; paths as in --set)")
    p.add_argument("--policies", default=None, metavar="P1,P2,...",
                   help="comma-separated policies to search (default: all)")
    add_request_args(p)
    add_search_args(p, "bound each scenario's search by wall time, e.g. 60s or 2m")


def rate(b: Any) -> str:
    """A Best's tokens/s, with '*' when its search was cut short (the throughput is not proven the best)."""
    return fmt_rate(b.tokens_per_s) + ("*" if b.cut_short and b.feasible else "")


def run(args: argparse.Namespace) -> int:
    from planner.whatif import parse_vary, whatif
    from reports.units import table

    axes = [parse_vary(v) for v in args.vary]
    policies = split_names(args.policies, "--policies", "none,tinypipe") if args.policies else None
    out = whatif(args.hw, args.model, axes, request=request_from_args(args), hw_overrides=args.sets,
                 objective=args.objective, policies=policies, progress=progress_printer(args),
                 **search_options(args))
    any_feasible = out.base.feasible or any(s.best.feasible for s in out.scenarios)
    print(f"tiersim whatif: {out.wall_s:.1f} s wall, {out.n_searches} searches", file=sys.stderr)
    if args.json:
        print(dumps(out.to_dict()))
        return EXIT_OK if any_feasible else EXIT_INFEASIBLE
    b = out.base
    print(f"tiersim whatif: {out.model} on {out.hardware}; {len(out.scenarios)} scenario"
          f"{'s' if len(out.scenarios) != 1 else ''}, {out.n_searches} distinct machines planned")
    base_what = (f"{b.policy}, {rate(b)} tokens/s, "
                 f"{b.tflops_per_gpu:.1f} TFLOP/s per GPU"
                 if b.feasible else f"infeasible ({b.binding})")
    print(f"base (hardware as given{', with --set' if args.sets else ''}): {base_what}")
    if axes:
        paths = [a.path for a in axes]
        rows = []
        for s in out.scenarios:
            r = s.best
            vs = fmt_gain(r.tokens_per_s / b.tokens_per_s - 1) if r.feasible and b.tokens_per_s else "-"
            rows.append([*(s.changes[p] for p in paths), r.policy or "-", "yes" if r.feasible else "no",
                         rate(r), "-" if r.tflops_per_gpu is None else f"{r.tflops_per_gpu:.1f}",
                         vs, r.binding or ""])
        print()
        print(table(rows, [*paths, "best policy", "feasible", "tokens/s", "TFLOP/s/GPU", "vs base", "binding"],
                    "l" * len(paths) + "lrrrrl"))
        print()
        print("sensitivity: each single change from the base")
        srows = [[s.change, rate(s.base), rate(s.best), fmt_gain(s.gain),
                  "yes" if s.makes_feasible else "", s.best.policy or f"infeasible ({s.best.binding})"]
                 for s in out.sensitivity]
        if srows:
            print(table(srows, ["change", "base tokens/s", "tokens/s", "gain", "makes feasible", "best policy"],
                        "lrrrll"))
        else:
            print("  (none: every value equals the base's)")
    for note in out.notes:
        print(f"  note: {note}")
    bests = [out.base, *(x.best for x in out.scenarios), *(x.best for x in out.sensitivity)]
    if any(b.cut_short and b.feasible for b in bests):
        print("* feasible, but the search was cut short by its bounds: the throughput may not be the best")
    if any(b.binding == "budget" for b in bests):
        print("budget: the bounds cut the search before it found a plan or proved that none fits")
    return EXIT_OK if any_feasible else EXIT_INFEASIBLE
