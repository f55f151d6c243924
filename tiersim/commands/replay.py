"""``tiersim replay PLAN``: execute a plan for real with torch and compare it with its simulation.

Exit codes: 0 replayed (and, with ``--verify``, the training matches its reference), 1 ``--verify``
found a mismatch (a bug in the runner or the policy, not in the input), 2 bad input (one line on stderr:
unreadable plan, a plan this machine cannot replay, data not where the plan put it), 3 a pool over the
plan's capacity (printed as an answer): checked before anything runs exactly as ``simulate --plan`` checks
it (the same simulation, the same verdict line), and again by the runner's own accounting as it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

from hardware_models import build_topology
from planner.plan_check import check_saved_plan
from planner.result_json import dumps, simulated_json
from simulator import Plan, simulate_plan
from tiersim.command import Command
from tiersim.errors import UsageError
from tiersim.exit_codes import EXIT_INFEASIBLE, EXIT_MISMATCH, EXIT_OK
from tiersim.output_files import check_output_path, write_or_fail
from userfiles.limits import MAX_REPLAY_STEPS


def add_args(p: argparse.ArgumentParser) -> None:
    p.epilog = "exit codes: 0 replayed (and verified), 1 --verify mismatch, 2 bad input, 3 over a pool's capacity"
    p.add_argument("plan", help="a plan file written by `simulate --plan-out`")
    p.add_argument("--steps", type=int, help="training steps to run (default: the plan's; the last is measured)")
    p.add_argument("--nvme-dir", help="directory for the nvme pool's files (default: a temporary directory)")
    p.add_argument("--verify", action="store_true",
                   help="also train the plain way from the same seed and check losses and weights agree")
    p.add_argument("--json", action="store_true", help="print one JSON object (simulated, measured, error)")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace of the replay here")
    p.add_argument("--seed", type=int, default=None, help="seed of the weights and data (default: 1234)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="compute device for the plan's GPU (default: cuda when available)")
    from tiersim.commands.calibrate import add_gemm16_flag

    add_gemm16_flag(p)


def run(args: argparse.Namespace) -> int:
    if not str(args.plan).strip():
        raise UsageError("replay: empty plan path; give a plan file written by --plan-out")
    check_output_path("--trace", args.trace)
    if args.nvme_dir is not None and not Path(args.nvme_dir).is_dir():
        raise UsageError(f"--nvme-dir {args.nvme_dir}: not a directory; create it first")
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.steps is not None and args.steps > MAX_REPLAY_STEPS:
        raise UsageError(f"--steps {args.steps:,} is beyond the bound MAX_REPLAY_STEPS = {MAX_REPLAY_STEPS:,} "
                         "(docs/design.md, 'Bounded inputs'); give at most that many")
    plan = Plan.load(args.plan)
    hw = plan.hardware
    check_saved_plan(plan, args.plan, build_topology(hw).locations)
    if args.steps is not None:
        plan = dataclasses.replace(plan, steps=args.steps)
    simulated = simulate_plan(plan, hw)
    if not simulated.feasible:  # the simulator's capacity verdict, as `simulate --plan` gives it
        return _infeasible(args, simulated)
    if importlib.util.find_spec("torch") is None:
        raise UsageError("replay needs torch: pip install 'tiersim[replay]' (torch==2.13.0)")
    from replay.errors import ReplayError
    from replay.precision import gemm16_forced
    from replay.runner import pick_device

    try:
        device_type = pick_device(args.device).type
    except ReplayError as e:
        raise UsageError(f"{args.plan}: {e}") from None
    with gemm16_forced(getattr(args, "gemm16", None), plan.workload.config.precision, device_type):  # every rank
        return _replay(args, plan, hw, simulated)


def _replay(args: argparse.Namespace, plan: Plan, hw: Any, simulated: Any) -> int:
    from replay.errors import ReplayError, ReplayOom
    from replay.precision import replay_gemm16_lines
    from replay.ranks import plan_gpus
    from replay.runner import DEFAULT_SEED, Runner, measured_result

    seed = DEFAULT_SEED if args.seed is None else args.seed
    world = len(plan_gpus(plan))
    try:
        if world > 1:
            from replay.dist_launch import run_ranks, timing_note
            from replay.dist_merge import replica_spread

            got = run_ranks(plan, hw, device=args.device, nvme_dir=args.nvme_dir, seed=seed, verify=args.verify)
            if got is None:  # a rank other than 0 under torchrun: rank 0 reports for all
                return EXIT_OK
            meas, ranks = got
            accum, replicas, tp = ranks[0].accum, ranks[0].dp_world, ranks[0].tp.world
            note, spread = timing_note(world, meas.device), replica_spread(ranks)
        else:
            runner = Runner(plan, hw, device=args.device, nvme_dir=args.nvme_dir, seed=seed)
            meas = runner.run()
            accum, replicas, note, spread, tp = dict(runner.accum), 1, None, 0.0, 1
    except ReplayOom as e:
        print(f"INFEASIBLE: {e}")
        return EXIT_INFEASIBLE
    except ReplayError as e:
        raise UsageError(f"{args.plan}: {e}") from None
    measured = measured_result(plan, hw, meas)
    from replay.compare import comparison, format_comparison

    extra: dict[str, Any] = {
        "device": meas.device, "wall_s": meas.wall_s, "step_times_s": meas.step_times(), "tasks": len(meas.records),
        "losses": [[s, m, v] for (s, m), v in sorted(meas.losses.items())],
        "real_link_bytes": meas.real_link_bytes, "link_bytes_priced": sum(meas.link_bytes.values()),
        "link_bytes_real": sum(meas.real_link_bytes.values()), "seed": seed, "steps": plan.steps, "ranks": world,
        "timing_note": note, "replica_spread": spread,
        "gemm16": replay_gemm16_lines(plan.workload.config.precision, meas.device.split(":")[0], hw.sources),
    }
    d = comparison(simulated, measured, extra)
    d["verify"] = None
    if args.verify:
        d["verify"] = _verify(plan, seed, accum, replicas, meas, spread, tp)
    if args.trace:
        from reports import write_trace

        write_or_fail("--trace", args.trace, lambda path: write_trace(measured, path))
    if not args.json:  # which 16-bit GEMMs ran (and a spec calibrated on the other path)
        for line in replay_gemm16_lines(plan.workload.config.precision, meas.device.split(":")[0], hw.sources):
            print(line)
    print(dumps(d) if args.json else format_comparison(d))
    if world > 1 and not args.json:
        print(f"ranks: {world} processes ({'NCCL' if meas.device.startswith('cuda') else 'gloo'}), "
              f"{replicas} data-parallel replica(s); replicas' weights differ by at most {spread:.3g}")
    if d["verify"] is not None and not d["verify"].get("weights_gated", True) and not args.json:
        print(f"verify: the weights' error is reported, not held to the tolerance: split sums in "
              f"{plan.workload.config.precision} (tensor parallelism, or a 16-bit gradient reduction over more "
              "than two ranks) round unlike one process's (replay.reference.weights_gated); "
              "plan with --precision fp32 to check the weights")
    if d["verify"] is not None and d["verify"].get("not_compared") and not args.json:
        print(f"verify: not compared: {', '.join(d['verify']['not_compared'])} (their gradient is zero in exact "
              "arithmetic: Adam moves them by rounding noise; replay.reference.noise_only)")
    if note and not args.json:
        print(note)
    if d["verify"] is not None and not d["verify"]["ok"]:
        return EXIT_MISMATCH
    return EXIT_OK


def _verify(plan: Plan, seed: int, accum: dict[int, int], world: int, meas: Any, spread: float,
            tp: int = 1) -> dict[str, Any]:
    """The replay's losses and weights against plain training of the same micro-batches from the same seed
    (the delayed-update reference for a DPU plan); ``world``: the data-parallel replicas (a pipeline's
    stages share their micro-batches); ``tp``: the tensor-parallel ranks of a layer (their sums round
    differently: ``replay.reference.RTOL_TP``); the replicas of a data-parallel replay must agree too."""
    from replay.model import Dims
    from replay.reference import (
        compare,
        host_updated_layers,
        not_compared,
        partitioned_layers,
        rtol_for,
        tied_sync_split,
        train_reference,
        weights_gated,
    )
    from replay.runner import pick_device
    from replay.store import Batching

    delayed = bool(plan.knobs.get("delayed_update", False))
    cfg = plan.workload.config
    batching = Batching(seed, cfg.micro_batch, cfg.seq_len, cfg.precision)
    dims = Dims.from_model(plan.workload.model)
    ref_losses, ref_weights = train_reference(dims, batching, plan.steps, accum,
                                              delayed=delayed, device=pick_device(meas.device), world=world,
                                              host_layers=host_updated_layers(plan, dims.n_layers + 2),
                                              tied_split=tied_sync_split(plan),
                                              partitioned=partitioned_layers(plan, dims.n_layers + 2))
    skip = not_compared(dims, world, tp)
    gated = weights_gated(cfg.precision, tp, world)
    v = compare(meas.losses, meas.weights, ref_losses, ref_weights, "delayed-update" if delayed else "plain",
                rtol_for(world, cfg.precision, tp), skip, gated).to_dict()
    v["tensor_parallel"] = tp
    v["weights_gated"] = gated  # False: tp, or > 2 ranks, in 16 bits: losses only (replay.reference.weights_gated)
    v["not_compared"] = sorted(skip)  # gradients of pure rounding noise (replay.reference.noise_only)
    v["replicas"] = world
    v["replica_spread"] = spread
    if spread > 0.0:  # data parallelism keeps every replica identical: any spread is a bug
        v["ok"] = False
        v["worst"] = f"replicas differ across ranks by {spread:.3g}"
    return v


def _infeasible(args: argparse.Namespace, simulated: Any) -> int:
    """Print the simulator's verdict on a plan that does not fit its machine; nothing is replayed."""
    from reports.text import verdict_line

    if args.json:
        print(dumps({**simulated_json(simulated), "replayed": False}))
    else:
        print(f"Verdict: {verdict_line(simulated)}")
        print(f"replay: not run: {args.plan} does not fit {simulated.hardware} (the check of simulate --plan)")
    return EXIT_INFEASIBLE


COMMAND = Command("replay", "execute a plan for real with torch; compare with its simulation", add_args, run)
