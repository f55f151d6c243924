"""``tiersim models list|show NAME``."""

from __future__ import annotations

import argparse

from reports.units import table
from tiersim.catalog import add_list_show_args, need_name, no_name
from tiersim.command import Command
from tiersim.exit_codes import EXIT_OK
from workloads import list_models, load_model


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        no_name(args, "models")
        rows = []
        for name in list_models():
            m = load_model(name)
            rows.append([name, f"{m.params() / 1e9:.2f}B", str(m.n_layers), str(m.hidden), m.family])
        print(table(rows, ["model", "params", "layers", "hidden", "family"]))
        return EXIT_OK
    m = load_model(need_name(args, "models", list_models()))
    rows = [[k, str(v)] for k, v in m.to_dict().items()]
    rows.append(["params", f"{m.params():,}"])
    print(table(rows, align="ll"))
    return EXIT_OK


COMMAND = Command("models", "list or show model presets", add_list_show_args, run)
