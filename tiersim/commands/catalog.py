"""``tiersim hardware|models|policies list|show``."""

from __future__ import annotations

import argparse

from policies import POLICIES, get_policy, knob_help
from reports.units import table
from tiersim.cli import UsageError


def _need_name(args: argparse.Namespace, what: str, known: list[str]) -> str:
    if not args.name:
        raise UsageError(f"'{what} show' needs a NAME, e.g. 'tiersim {what} show {known[0]}'; known: "
                         f"{', '.join(known)}")
    return str(args.name)


def _no_name(args: argparse.Namespace, what: str) -> None:
    if args.name:
        raise UsageError(f"'{what} list' takes no NAME; to see one, run 'tiersim {what} show {args.name}'")


def run_hardware(args: argparse.Namespace) -> int:
    from hardware_models import describe, list_presets, load_hardware

    if args.action == "list":
        _no_name(args, "hardware")
        if args.sets:
            raise UsageError("'hardware list' takes no --set; use 'tiersim hardware show NAME --set PATH=VALUE'")
        rows = []
        for name in list_presets():
            hw = load_hardware(name)
            rows.append([name, f"{hw.gpu.count}x {hw.gpu.model}", hw.description])
        print(table(rows, ["preset", "GPUs", "description"], "lll"))
        return 0
    print(describe(load_hardware(_need_name(args, "hardware", list_presets()), args.sets)))
    return 0


def run_models(args: argparse.Namespace) -> int:
    from workloads import list_models, load_model

    if args.action == "list":
        _no_name(args, "models")
        rows = []
        for name in list_models():
            m = load_model(name)
            rows.append([name, f"{m.params() / 1e9:.2f}B", str(m.n_layers), str(m.hidden), m.family])
        print(table(rows, ["model", "params", "layers", "hidden", "family"]))
        return 0
    m = load_model(_need_name(args, "models", list_models()))
    rows = [[k, str(v)] for k, v in m.to_dict().items()]
    rows.append(["params", f"{m.params():,}"])
    print(table(rows, align="ll"))
    return 0


def run_policies(args: argparse.Namespace) -> int:
    if args.action == "list":
        _no_name(args, "policies")
        print(table([[p.name, p.summary] for p in POLICIES.values()], ["policy", "what it does"], "ll"))
        return 0
    info = get_policy(_need_name(args, "policies", list(POLICIES)))
    print(info.doc.strip())
    print()
    print(table([list(k) for k in knob_help(info)], ["knob", "type", "default"], "lll"))
    return 0
