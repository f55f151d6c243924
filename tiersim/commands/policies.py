"""``tiersim policies list|show NAME``: the policies, or one with its knobs."""

from __future__ import annotations

import argparse

from policies import POLICIES, get_policy, knob_help
from reports.units import table
from tiersim.catalog import add_list_show_args, need_name, no_name
from tiersim.command import Command
from tiersim.exit_codes import EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        no_name(args, "policies")
        print(table([[p.name, p.summary] for p in POLICIES.values()], ["policy", "what it does"], "ll"))
        return EXIT_OK
    info = get_policy(need_name(args, "policies", list(POLICIES)))
    print(info.doc.strip())
    print()
    print(table([list(k) for k in knob_help(info)], ["knob", "type", "default"], "lll"))
    return EXIT_OK


COMMAND = Command("policies", "list policies or show one with its knobs", add_list_show_args, run)
