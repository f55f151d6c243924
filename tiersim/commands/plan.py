"""``tiersim plan``: search every policy, its knobs, micro-batch and checkpointing for the best plan of a job.

    tiersim plan --hw a100x8 --model 70b                          # ranked table, rejections, Pareto front
    tiersim plan --hw a100 --model 7b --objective gpu_memory --top 5
    tiersim plan --hw a100x8 --model 70b --policies zero-offload,tinypipe --budget 60s --plan-out best.json

The job's global batch, sequence length and precision are fixed (flags as for ``simulate``; defaults
picked as there, with micro-batch 1); the search varies micro-batch (and so the accumulation) and
checkpointing unless ``--micro-batch`` / ``--checkpointing`` fix them. Results are cached on disk
(``--cache-dir``, default ``$XDG_CACHE_HOME/tiersim`` or ``~/.cache/tiersim``; ``--no-cache``), so a
repeated query is near-instant. Standard output is the same byte for byte for the same inputs; timing,
cache statistics and progress (on a terminal, or with ``--progress``) go to standard error.

Exit codes: 0 a feasible plan was found, 2 bad input, 3 no candidate is feasible, 4 not settled (the
budget cut the search before any candidate fit or all were ruled out).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from planner.result_json import versioned
from planner.search import CPU_KINDS, GPU_KINDS, OBJECTIVES, Evaluated, SearchOutcome, search
from reports.units import table
from tiersim import deepspeed_cli as ds_cli
from tiersim.command import Command
from tiersim.errors import UsageError
from tiersim.job_flags import DEFAULT_HW, DEFAULT_MODEL, PLAN, add_deepspeed_out_flag, add_job_flags, request_from_args
from tiersim.output_files import check_output_path, write_or_fail
from tiersim.search_flags import (
    WORKERS_HELP,
    add_budget_arg,
    cache_from_args,
    check_search_bounds,
    default_workers,
    parse_budget,
    search_exit,
    split_names,
)
from tiersim.signals import stderr_line


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Search every policy, its knobs, micro-batch and checkpointing for the best plan of a job. "
                     "The job's global batch (default: 8 sequences per GPU), sequence length and precision are "
                     "fixed; micro-batch and checkpointing are searched unless --micro-batch / --checkpointing "
                     "fix them.")
    p.epilog = ("exit codes: 0 a feasible plan was found, 2 bad input, 3 no candidate is feasible, 4 not settled: "
                "the budget cut the search before any candidate fit or all were ruled out")
    add_job_flags(p, PLAN)
    p.add_argument("--objective", choices=OBJECTIVES, default="tokens_per_s",
                   help="what to optimise: tokens_per_s or tflops (highest), gpu_memory or cpu_memory (lowest "
                        "peak); default tokens_per_s")
    p.add_argument("--top", type=int, default=10, help="rows of the ranked table (default 10)")
    p.add_argument("--policies", default=None, help="comma-separated policies to search (default: all)")
    add_budget_arg(p, "plan", "the search")
    p.add_argument("--max-candidates", type=int, default=None, help="simulate at most N candidates")
    p.add_argument("--plan-out", help="write the winning plan (JSON) here, for simulate --plan and tiersim replay")
    add_deepspeed_out_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--cache-dir", default=None, help="evaluation cache directory (default: "
                                                     "$XDG_CACHE_HOME/tiersim or ~/.cache/tiersim)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--workers", type=int, default=default_workers(), help=WORKERS_HELP["plan"])
    p.add_argument("--progress", action="store_true", help="progress on stderr even when it is not a terminal")


def _knobs_text(knobs: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in knobs.items()) or "-"


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def _peak(e: Evaluated, kinds: dict[str, str], want: tuple[str, ...]) -> str:
    return _gb(e.peak_of(want, kinds)) if any(kinds.get(p) in want for p in e.peak_bytes) else "-"


def _row(rank: int, e: Evaluated, kinds: dict[str, str]) -> list[str]:
    return [str(rank), e.policy, _knobs_text(e.knobs), str(e.micro_batch), e.checkpointing,
            f"{e.step_time_s:.3f}", f"{e.tokens_per_s:,.0f}", f"{e.tflops_per_gpu:.1f}",
            _peak(e, kinds, GPU_KINDS), _peak(e, kinds, CPU_KINDS), _peak(e, kinds, ("nvme",))]


HEADER = ["#", "policy", "knobs", "mb", "ckpt", "step s", "tokens/s", "TFLOP/s/GPU", "GPU GB", "CPU GB", "NVMe GB"]


def format_outcome(o: SearchOutcome, top: int, fixed: list[str], hw_arg: str | None = None,
                   sets: list[str] | tuple[str, ...] = ()) -> str:
    w = o.workload
    lines = [f"tiersim plan: {o.model} on {o.hardware}; global batch {w['global_batch']}, seq {w['seq_len']}, "
             f"{w['precision']}; objective {o.objective}"]
    lines += [f"  default picked: {a}" for a in o.assumed]
    lines += [f"  {f}" for f in fixed]
    pruned_pct = 100.0 * o.n_pruned / o.n_candidates if o.n_candidates else 0.0
    lines.append(f"{o.n_candidates} candidates: {o.n_simulated} simulated, {o.n_pruned} rejected without a "
                 f"simulation ({pruned_pct:.1f}%)")
    if o.cut_short:
        lines.append(f"CUT SHORT: {o.cut_short}; the answer is the best of what was evaluated")
    lines.append("")
    if o.ranked:
        shown = o.ranked[:top]
        lines.append(f"Ranked (top {len(shown)} of {len(o.ranked)} simulated feasible; peaks are the busiest pool "
                     "of each kind):")
        lines.append(table([_row(i + 1, e, o.pool_kinds) for i, e in enumerate(shown)], HEADER, "rllrlrrrrrr"))
    elif o.cut_short:
        lines.append("NOT SETTLED: nothing evaluated fits, and the budget cut the search before it proved that "
                     "nothing does (exit 4; a larger --budget settles it).")
    else:
        lines.append("No feasible candidate: every one was rejected (see the reasons below).")
    lines.append("")
    lines.append("Rejected (reason: candidates):")
    lines.append(table([[r, str(n)] for r, n in o.rejected.items()], ["reason", "count"], "lr") if o.rejected
                 else "  none")
    if o.pareto:
        lines.append("")
        lines.append("Pareto front (tokens/s vs GPU memory vs CPU memory):")
        rank = {e.index: i + 1 for i, e in enumerate(o.ranked)}
        lines.append(table([_row(rank[e.index], e, o.pool_kinds) for e in o.pareto], HEADER, "rllrlrrrrrr"))
    if o.best is not None:
        b = o.best
        knobs = "".join(f" --knob {k}={v}" for k, v in b.knobs.items())
        lines.append("")
        lines.append(f"Best: {b.policy} {_knobs_text(b.knobs)}, micro-batch {b.micro_batch}, checkpointing "
                     f"{b.checkpointing}: {b.tokens_per_s:,.0f} tokens/s")
        hw = (hw_arg or o.hardware) + "".join(f" --set {x}" for x in sets)
        lines.append(f"  reproduce: simulate --hw {hw} --model {o.model} --policy {b.policy}{knobs} "
                     f"--micro-batch {b.micro_batch} --checkpointing {b.checkpointing} "
                     f"--global-batch {w['global_batch']} --seq-len {w['seq_len']} --precision {w['precision']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    check_output_path("--plan-out", args.plan_out)
    check_output_path("--deepspeed-out", args.deepspeed_out)
    ds = ds_cli.apply_deepspeed(args, DEFAULT_HW, DEFAULT_MODEL, sets_policy=False)
    if ds is not None:
        ds_cli.print_mapping(ds, to_stderr=True)
    if args.top < 1:
        raise UsageError(f"--top {args.top}: must be at least 1")
    check_search_bounds(args)
    budget = parse_budget(args.budget)
    policies = split_names(args.policies, "--policies", "none,tinypipe") if args.policies is not None else None
    cache = cache_from_args(args)
    show = args.progress or sys.stderr.isatty()

    request = request_from_args(args)
    outcome = search(args.hw or DEFAULT_HW, args.model or DEFAULT_MODEL, request=request, hw_overrides=args.sets,
                     objective=args.objective, policies=policies, budget_s=budget,
                     max_candidates=args.max_candidates, progress=stderr_line if show else None, cache=cache,
                     workers=args.workers, keep_best_plan=bool(args.plan_out or args.deepspeed_out))
    if args.plan_out and outcome.best is not None and outcome.best.plan is not None:
        write_or_fail("--plan-out", args.plan_out, outcome.best.plan.save)
    if args.deepspeed_out:
        ds_cli.write_best_as_deepspeed(args.deepspeed_out, outcome, args.hw or DEFAULT_HW, args.sets)
    fixed = []
    if request.micro_batch is not None or request.checkpointing is not None:
        fixed.append("fixed by flags: " + ", ".join(
            f for f in (f"micro-batch {request.micro_batch}" if request.micro_batch is not None else "",
                        f"checkpointing {request.checkpointing}" if request.checkpointing is not None else "")
            if f))
    if request.micro_batch is None or request.checkpointing is None:
        fixed.append("searched: " + ", ".join(
            f for f in ("micro-batch" if request.micro_batch is None else "",
                        "checkpointing" if request.checkpointing is None else "") if f)
                     + " and each policy's knobs (fix them with --micro-batch / --checkpointing)")
    if args.json:
        print(json.dumps(versioned({**outcome.to_dict(), **({"deepspeed": {"input": ds.to_dict()}} if ds else {})}),
                         indent=1, sort_keys=False))
    else:
        print(format_outcome(outcome, args.top, fixed, args.hw, args.sets))
    print(f"tiersim plan: {outcome.wall_s:.1f} s wall, {outcome.n_simulated} simulated"
          + (f" (+{outcome.n_extra_simulated} speculative)" if outcome.n_extra_simulated else "")
          + (f", cache {outcome.cache_hits} hits / {outcome.cache_misses} misses in {cache.dir}" if cache else "")
          + (f"; plan written to {args.plan_out}" if args.plan_out and outcome.best is not None else ""),
          file=sys.stderr)
    return search_exit(outcome.best is not None, outcome.cut_short is not None)


COMMAND = Command("plan", "search every policy, its knobs, micro-batch and checkpointing for the best plan",
                  add_args, run)
