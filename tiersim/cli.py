"""Command line: ``tiersim simulate|hardware|models|policies|validate`` and ``simulate`` on its own.

Exit codes: 0 success (feasible), 2 bad input (one line on stderr), 3 infeasible (printed as an answer).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from hardware_models import HardwareInputError
from policies import KnobError, PlanInfeasible
from simulator import PlanError
from workloads import WorkloadInputError

EXIT_OK, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 2, 3
INPUT_ERRORS = (HardwareInputError, WorkloadInputError, PlanError, KnobError)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def _add_job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hw", default="a100x8", help="hardware preset or YAML file (default: a100x8)")
    p.add_argument("--model", default="70b", help="model preset/shorthand, config.json or YAML (default: 70b)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=VALUE",
                   help="override a hardware field, e.g. --set host.dram=1TB --set pcie.gen=5")
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step over all GPUs")
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--checkpointing", choices=["none", "selective", "full"])
    p.add_argument("--no-flash-attention", dest="flash", action="store_false", default=None)


def build_parser(prog: str = "tiersim") -> argparse.ArgumentParser:
    ap = _Parser(prog=prog, description="Simulate and plan LLM training across GPU HBM, CPU DRAM and NVMe.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sim = sub.add_parser("simulate", help="simulate one training step of a policy")
    _add_simulate_args(sim)
    hw = sub.add_parser("hardware", help="list or show hardware presets")
    hw.add_argument("action", choices=["list", "show"])
    hw.add_argument("name", nargs="?")
    hw.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=VALUE")
    mo = sub.add_parser("models", help="list or show model presets")
    mo.add_argument("action", choices=["list", "show"])
    mo.add_argument("name", nargs="?")
    po = sub.add_parser("policies", help="list policies or show one with its knobs")
    po.add_argument("action", choices=["list", "show"])
    po.add_argument("name", nargs="?")
    va = sub.add_parser("validate", help="compare the simulator with published figures")
    va.add_argument("--json", action="store_true")
    return ap


def _add_simulate_args(p: argparse.ArgumentParser) -> None:
    _add_job_args(p)
    p.add_argument("--policy", default="zero-offload", help="policy name (tiersim policies list)")
    p.add_argument("--knob", dest="knobs", action="append", default=[], metavar="NAME=VALUE",
                   help="policy knob (tiersim policies show NAME)")
    p.add_argument("--plan", dest="plan_in", help="simulate this plan file instead of planning")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plan-out", help="write the plan (JSON) here")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace of the simulated step here")
    p.add_argument("--check", action="store_true", help="also check the simulator's invariants")
    p.add_argument("--no-extrapolate", dest="extrapolate", action="store_false",
                   help="simulate every micro-step even in a steady state")


def main(argv: Sequence[str] | None = None) -> int:
    return _run(build_parser(), argv)


def simulate_main(argv: Sequence[str] | None = None) -> int:
    """The ``simulate`` entry point: ``simulate --hw a100x8 --model 70b --policy tinypipe``."""
    p = _Parser(prog="simulate", description="Simulate one training step (same as `tiersim simulate`).")
    _add_simulate_args(p)
    args = sys.argv[1:] if argv is None else list(argv)
    return _run(p, args, command="simulate")


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None, command: str | None = None) -> int:
    args = parser.parse_args(argv)
    cmd = command or args.cmd
    try:
        if cmd == "simulate":
            from tiersim.commands.simulate import run_simulate
            return run_simulate(args)
        if cmd == "hardware":
            from tiersim.commands.catalog import run_hardware
            return run_hardware(args)
        if cmd == "models":
            from tiersim.commands.catalog import run_models
            return run_models(args)
        if cmd == "policies":
            from tiersim.commands.catalog import run_policies
            return run_policies(args)
        if cmd == "validate":
            from tiersim.commands.validate import run_validate
            return run_validate(args)
    except INPUT_ERRORS as e:
        print(f"tiersim: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PlanInfeasible as e:
        if getattr(args, "json", False):
            print(json.dumps({"feasible": False, "infeasible": e.to_dict(), "oom": None}, indent=1))
        else:
            print(f"INFEASIBLE: {e}")
        return EXIT_INFEASIBLE
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:
        print(f"tiersim: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    parser.error(f"unknown command {cmd!r}")


if __name__ == "__main__":
    raise SystemExit(main())
