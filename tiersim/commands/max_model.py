"""``tiersim max-model``: the largest model each policy can train on a machine.

    tiersim max-model --hw a100 --policy synergyscale --shape gpt --hidden 8192          # bisect layers
    tiersim max-model --hw a100x8 --policy all --family llama3-8b --scale width          # a preset, wider
    tiersim max-model --hw dgx2 --policy zero-infinity --shape gpt --hidden 8192 --knob param_device=nvme
"""

from __future__ import annotations

import argparse
import sys

from hardware_models.units import parse_time
from planner.result_json import dumps
from policies import POLICIES
from tiersim.command import Command
from tiersim.errors import UsageError
from tiersim.exit_codes import EXIT_CUT
from tiersim.job_flags import SEARCH, add_hardware_flags, add_workload_flags, request_from_args
from tiersim.search_flags import add_search_args, fmt_rate, progress_printer, search_exit, search_options


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Find the largest model a policy trains on this hardware: a model family grows along one dimension "
        "(layers at a fixed width, or width at a fixed depth) and is bisected until n fits and n+1 does not. "
        "Give either --shape with --hidden (a GPT-3-like or LLaMA-like block, layers bisected) or --family "
        "(a model preset, shorthand or family prefix such as llama3, scaled by --scale).")
    p.epilog = ("exit codes: 0 some policy trains at least the smallest model, 2 bad input, "
                "3 no policy trains even the smallest model, 4 not settled: none is known to fit and the budget "
                "cut a policy before it proved that none does")
    add_hardware_flags(p, SEARCH)
    p.add_argument("--policy", default="all",
                   help="a policy (tiersim policies list) or 'all' for each one (default: all)")
    fam = p.add_mutually_exclusive_group(required=True)
    fam.add_argument("--shape", choices=["gpt", "llama"],
                     help="gpt: GELU, LayerNorm, biases, learned positions, tied embeddings, vocab 50257; "
                          "llama: SwiGLU (LLaMA FFN rule), RMSNorm, rotary, untied, vocab 32000")
    fam.add_argument("--family", metavar="PRESET",
                     help="a model preset or shorthand (llama3-8b, 70b) or family prefix (llama3: its first "
                          "preset) whose blocks are kept")
    p.add_argument("--hidden", type=int, help="with --shape: the model width (a multiple of 128 unless --heads)")
    p.add_argument("--heads", type=int, help="with --shape: attention heads (default: hidden/128)")
    p.add_argument("--kv-heads", type=int, help="with --shape: key/value heads (default: = heads)")
    p.add_argument("--vocab", type=int, help="with --shape: vocabulary size")
    p.add_argument("--scale", choices=["layers", "width"], default=None,
                   help="with --family: grow the layer count (default) or the width (heads of the preset's "
                        "size in steps of one KV-head group, FFN in proportion)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="the largest step count tried: layers (default 4096), or KV-head groups with --scale "
                        "width (default: up to hidden 131072); reaching it is reported as 'cap reached'")
    p.add_argument("--knob", dest="knobs", action="append", default=[], metavar="NAME=VALUE",
                   help="fix a policy knob in every check, e.g. --knob param_device=nvme (the largest model with "
                        "parameters on NVMe); applies to the policies that declare it; repeatable")
    p.add_argument("--max-step-time", metavar="TIME",
                   help="also require a step time at most this long (e.g. 30s); 'time' is then a binding "
                        "constraint (and each check is a full search, slower)")
    add_workload_flags(p, SEARCH)
    add_search_args(p, "max-model", "the whole command (each policy still to do gets an equal share of what is "
                                  "left; a bisection cut there reports the sizes it proved)", objective=False)


def _scaler(args: argparse.Namespace):  # -> planner.maxmodel.Scaler
    from planner.maxmodel import preset_scaler, shape_scaler

    if args.shape:
        if args.hidden is None:
            raise UsageError("--shape needs --hidden N (the model width), e.g. --shape gpt --hidden 8192")
        if args.scale is not None:
            raise UsageError("--scale goes with --family; --shape always bisects layers at the given --hidden")
        for flag, v in (("--hidden", args.hidden), ("--heads", args.heads), ("--kv-heads", args.kv_heads),
                        ("--vocab", args.vocab)):
            if v is not None and v < 1:
                raise UsageError(f"{flag} {v}: must be a positive whole number")
        return shape_scaler(args.shape, args.hidden, hi_cap=args.limit, heads=args.heads, kv_heads=args.kv_heads,
                            vocab=args.vocab)
    for flag, v in (("--hidden", args.hidden), ("--heads", args.heads), ("--kv-heads", args.kv_heads),
                    ("--vocab", args.vocab)):
        if v is not None:
            raise UsageError(f"{flag} goes with --shape; --family keeps the preset's dimensions")
    return preset_scaler(args.family, args.scale or "layers", hi_cap=args.limit)


def run(args: argparse.Namespace) -> int:
    from planner.candidates import check_fixed_knobs
    from planner.deadline import Deadline
    from planner.maxmodel import max_model
    from reports.units import table

    if args.policy != "all" and args.policy not in POLICIES:
        raise UsageError(f"--policy {args.policy!r}: unknown; choose one of {', '.join(POLICIES)} or all")
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit {args.limit}: must be a positive whole number")
    check_fixed_knobs(policies, args.knobs)
    scaler = _scaler(args)
    limit = None
    if args.max_step_time is not None:
        limit = parse_time(args.max_step_time, "--max-step-time")
        if limit <= 0:
            raise UsageError(f"--max-step-time {args.max_step_time}: give a positive time like 30s")
    opts = search_options(args)
    deadline = Deadline.after(opts.pop("budget_s"))
    request = request_from_args(args)
    progress = progress_printer(args)
    outs = [max_model(args.hw, scaler, policy, request=request, hw_overrides=args.sets, max_step_time_s=limit,
                      progress=progress, knobs=args.knobs, deadline=deadline.share(len(policies) - i), **opts)
            for i, policy in enumerate(policies)]
    # cut before it found a fitting size or proved that the smallest does not fit: no verdict
    unsettled = [o.policy for o in outs if o.largest is None and o.cut_short
                 and (o.first_infeasible is None or o.first_infeasible.n > scaler.lo)]
    rc = search_exit(any(o.largest for o in outs), bool(unsettled))
    print("tiersim max-model: " + ", ".join(f"{o.policy} {o.wall_s:.1f} s" for o in outs) + " wall", file=sys.stderr)
    if args.json:
        print(dumps({"kind": "tiersim.max_model", "hardware": args.hw, "overrides": list(args.sets),
                     "knobs": list(args.knobs),
                     "family": scaler.family, "dimension": scaler.dimension, "max_step_time_s": limit,
                     "results": [o.to_dict() for o in outs]}))
        return rc
    fixed = f" knobs {', '.join(args.knobs)};" if args.knobs else ""
    sets = ' with ' + ', '.join(args.sets) if args.sets else ''
    print(f"tiersim max-model: {scaler.family} on {args.hw}{sets};{fixed} "
          f"{scaler.dimension} bisected (n fits, n+1 does not)")
    rows = []
    for o in outs:
        big, nxt = o.largest, o.first_infeasible
        counts = [str(sum(not c.screened for c in o.checks)), str(o.n_screened)]
        if big is None:
            at = f"{o.binding} (already at {nxt.model.n_layers} layers x {nxt.model.hidden})" if nxt else ""
            rows.append([o.policy, "? (budget)" if o.cut_short else "none fits", "-", "-", "-", "-",
                         at or ("not settled (budget)" if o.cut_short else ""), *counts])
            continue
        m = big.model
        above = (f"{o.binding}: {scaler.describe(nxt.n)} ({nxt.model.params() / 1e9:.2f}B)" if nxt
                 else "not settled (budget)" if o.cut_short else "cap reached (the largest size tried fits)")
        step = "-" if big.best.step_time_s is None else f"{big.best.step_time_s:.2f}"
        rows.append([o.policy, f"{m.params() / 1e9:.2f}B", str(m.n_layers), str(m.hidden),
                     fmt_rate(big.best.tokens_per_s), step, above, *counts])
    print(table(rows, ["policy", "largest", "layers", "hidden", "tokens/s", "step s", "binding one step larger",
                       "searched", "screened"], "lrrrrrlrr"))
    for o in outs:
        if o.cut_short:
            print(f"CUT SHORT ({o.policy}): {o.cut_short}")
    if rc == EXIT_CUT:
        names = ", ".join(f"'{p}'" for p in unsettled)
        print(f"NOT SETTLED (exit 4): no policy is known to train the smallest model, and the budget cut {names} "
              "before finding a size that fits or proving that none does (a larger --budget settles it)")
    print("searched: sizes checked by a search that simulates; screened: sizes judged by plan-level checks alone "
          "(a policy's verdict and the memory bounds; a rejection there is final)")
    if limit is None:
        print("tokens/s, step s: the first plan found that fits (memory-frugal order), not the fastest; "
              "`tiersim plan` finds the fastest")
    else:
        print(f"tokens/s, step s: the fastest plan found (each check is a full search for step time <= {limit:g} s)")
    return rc


COMMAND = Command("max-model", "the largest model each policy can train (bisection over layers or width)",
                  add_args, run)
