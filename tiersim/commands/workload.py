"""``tiersim workload check --model NAME``: the workload formulas against torch on the meta device.

Builds the replay model's embedding, one block (all blocks are identical) and head at full size on
torch's meta device (no memory, no compute) and compares parameter bytes, forward/backward FLOPs
(``FlopCounterMode``) and saved-activation bytes (``saved_tensors_hooks``) with the formula trace;
see :mod:`replay.meta_check`. Differences are reported with their reasons, not failures.

Exit codes: 0 the check ran (whatever it found), 2 bad input (one line on stderr: unknown model,
bad micro-batch or sequence length, a model replay cannot build, torch missing).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from typing import Any

from planner.result_json import versioned
from policies.job import DEFAULT_SEQ_CAP
from tiersim.command import Command
from tiersim.errors import UsageError
from tiersim.exit_codes import EXIT_OK
from tiersim.job_flags import positive_int
from workloads import load_model


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["check"])
    p.add_argument("--model", required=True, help="model preset/shorthand, config.json or YAML")
    p.add_argument("--micro-batch", type=positive_int, default=1)
    p.add_argument("--seq-len", type=positive_int, default=None,
                   help=f"default: the model's context, capped at {DEFAULT_SEQ_CAP}")
    p.add_argument("--json", action="store_true")


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{unit}"
    return f"{value:.4g}"


def _diff(rel: float | None) -> str:
    if rel is None:
        return "n/a"
    if rel == 0:
        return "0"
    return f"{rel * 100:+.2f}%"


def render(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [f"workload check: {result['model']}  micro-batch {cfg['micro_batch']}  seq {cfg['seq_len']}  "
             f"{cfg['precision']}  (torch meta device; {result['blocks']['count']} identical blocks, "
             "1 measured)", ""]
    header = f"{'layer':<10} {'item':<24} {'formula':>10} {'torch':>10} {'diff':>9}  note"
    lines += [header, "-" * len(header)]
    for r in result["rows"]:
        mark = "" if r["ok"] is None else (" ok" if r["ok"] else " !!")
        lines.append(f"{r['layer']:<10} {r['item']:<24} {_fmt(r['formula']):>10} {_fmt(r['torch']):>10} "
                     f"{_diff(r['rel_diff']):>9}{mark}  {r['note']}")
    lines.append("")
    lines += [f"note: {n}" for n in result["notes"]]
    lines.append("units: bytes for param/activation/element-wise rows, FLOP for FLOPs rows, a count for operators; "
                 "diff = torch/formula - 1; "
                 "ok/!! only where a tolerance applies")
    lines.append(f"verdict: {result['verdict']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    seq = args.seq_len if args.seq_len is not None else min(model.max_pos, DEFAULT_SEQ_CAP)
    if importlib.util.find_spec("torch") is None:
        raise UsageError("workload check needs torch: pip install 'tiersim[replay]' (torch==2.13.0)")
    from replay.meta_check import dims_of, meta_check

    try:
        dims_of(model)
    except ValueError as e:
        raise UsageError(f"--model {args.model}: {e}") from None
    result = meta_check(model, args.micro_batch, seq).to_dict()
    if args.json:
        print(json.dumps(versioned(result), indent=1))
    else:
        print(render(result))
    return EXIT_OK


COMMAND = Command("workload", "check the workload formulas against torch on the meta device", add_args, run)
