"""``tiersim hardware list|show NAME [--set PATH=VALUE]``."""

from __future__ import annotations

import argparse

from hardware_models import describe, list_presets, load_hardware
from reports.units import table
from tiersim.catalog import add_list_show_args, need_name, no_name
from tiersim.command import Command
from tiersim.errors import UsageError
from tiersim.exit_codes import EXIT_OK
from tiersim.job_flags import add_set_flag


def add_args(p: argparse.ArgumentParser) -> None:
    add_list_show_args(p)
    add_set_flag(p, None)


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        no_name(args, "hardware")
        if args.sets:
            raise UsageError("'hardware list' takes no --set; use 'tiersim hardware show NAME --set PATH=VALUE'")
        rows = []
        for name in list_presets():
            hw = load_hardware(name)
            rows.append([name, f"{hw.gpu.count}x {hw.gpu.model}", hw.description])
        print(table(rows, ["preset", "GPUs", "description"], "lll"))
        return EXIT_OK
    print(describe(load_hardware(need_name(args, "hardware", list_presets()), args.sets)))
    return EXIT_OK


COMMAND = Command("hardware", "list or show hardware presets", add_args, run)
