"""``tiersim models list|show NAME``: NAME is a preset, a shorthand, an HF ``config.json`` (or its folder) or a
YAML of dimensions; ``show`` prints the dimensions, the total and active parameter counts, the route that
described the model (``formula``; ``model definition`` for the transformers route) and the notes naming
what the source holds that is not modelled."""

from __future__ import annotations

import argparse

from reports.units import table
from tiersim.catalog import add_list_show_args, need_name, no_name
from tiersim.command import Command
from tiersim.exit_codes import EXIT_OK
from workloads import ModelSpec, list_models, load_model


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        no_name(args, "models")
        rows = []
        for name in list_models():
            m = load_model(name)
            rows.append([name, f"{m.params() / 1e9:.2f}B", f"{m.active_params() / 1e9:.2f}B", str(m.n_layers),
                         str(m.hidden), m.family])
        print(table(rows, ["model", "params", "active", "layers", "hidden", "family"]))
        return EXIT_OK
    m = load_model(need_name(args, "models", list_models()))
    print(table(show_rows(m), align="ll"))
    return EXIT_OK


def show_rows(m: ModelSpec) -> list[list[str]]:
    """``models show``: the dimensions (new fields where they matter), the counts, the route, the notes."""
    dims = m.to_dict()
    dims.pop("notes", None)
    dims.pop("route", None)
    dims.setdefault("head_dim", m.head_dim)
    rows = [[k, _cell(v)] for k, v in dims.items()]
    rows.append(["params", f"{m.params():,}"])
    rows.append(["active_params", f"{m.active_params():,}" + ("" if m.is_moe else " (dense: every parameter)")])
    rows.append(["route", m.route])
    rows += [["note", n] for n in m.notes]
    return rows


def _cell(value: object) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) if value else "-"
    return str(value)


COMMAND = Command("models", "list model presets, or show one (a preset, config.json or YAML)", add_list_show_args,
                  run)
