"""``tiersim calibrate -o local.yaml [--dir D] [--base PRESET] [--precision bf16] [--json]``: measure this
machine (torch) and write a hardware description the simulator loads (``simulate --hw local.yaml ...``).

Measured: GEMM FLOP/s over op sizes as the replay computes a linear layer in ``--precision`` (autocast over
fp32 weights, ``replay.precision``; -> gpu.peak_flops of every dtype, gpu.gemm_efficiency of that precision),
copy bandwidth between the runner's pools gpu0 <-> cpu (-> pcie), a large copy on the device (-> gpu.hbm_bw)
and in host memory (-> host.dram_bw), sequential disk read/write of `--dir` with the page cache avoided (->
nvme), the torch.optim.Adam rate (-> host.optimizer_params_per_s), DRAM size and cores, and the per-operator
figures that price a layer operator by operator (-> gpu.op_overhead from the replay's decoder block at tiny
size, gpu.elementwise_bw derived from one probe block; CPU-only: gpu.shares_host), and in ``--precision`` the
rates of a linear layer's backward products (-> gpu.gemm_backward_efficiency) and of the attention kernel
forward and backward (-> gpu.attention_efficiency, gpu.attention_backward_efficiency). Progress goes to stderr;
stdout gets a summary, or with ``--json`` one JSON object ``{"output", "measurements", "spec"}``.
Every figure's citation is in the file's ``sources``. Exit codes: 0 written, 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from hardware_models import HardwareSpec, fmt_bandwidth, fmt_bytes, fmt_flops, load_hardware, spec_from_dict
from planner.result_json import versioned
from tiersim.command import Command
from tiersim.errors import UsageError
from tiersim.exit_codes import EXIT_OK
from tiersim.job_flags import add_calibration_precision_flag
from tiersim.output_files import check_output_path, write_or_fail

__all__ = ["COMMAND", "MAX_RANKS", "add_args", "check_calibrate_args", "run", "write_spec"]

MAX_RANKS = 8  # processes on one host; more would only measure oversubscription


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, help="the hardware YAML file to write")
    p.add_argument("--dir", default=None, help="directory whose disk is measured (default: a temporary one)")
    p.add_argument("--base", default=None,
                   help="preset whose unmeasured fields (prices of links this machine lacks) are kept")
    add_calibration_precision_flag(p)
    p.add_argument("--ranks", type=int, default=1,
                   help="CPU-only: measure what N ranks (one process each, gloo) share -- cores, the all-reduce "
                        "rate, copies -- and write an N-GPU spec that prices N-rank plans (default 1)")
    add_gemm16_flag(p)
    p.add_argument("--json", action="store_true", help="also print the measurements as one JSON object")


def add_gemm16_flag(p: argparse.ArgumentParser) -> None:
    """``--gemm16``: how 16-bit GEMMs run (replay.precision.gemm16_path), for calibrate, replay and validation."""
    p.add_argument("--gemm16", choices=("auto", "native", "emulated"), default="auto",
                   help="16-bit GEMMs: native, or emulated as fp32 products of 16-bit operands rounded to 16 bits "
                        "(same numbers, fp32 speed); default auto: native unless measured slower on this device "
                        "(CUDA: native)")


def _progress(line: str) -> None:
    print(f"calibrate: {line}", file=sys.stderr, flush=True)


def check_calibrate_args(args: argparse.Namespace) -> HardwareSpec | None:
    """Fail before measuring: output path writable, --dir an existing writable directory, --base known."""
    out = str(args.output or "")
    check_output_path("calibrate -o", out)
    p = Path(out)
    parent = p.parent
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"calibrate: -o {out}: not writable; pick another path")
    if args.dir is not None:
        if not Path(args.dir).is_dir():
            raise UsageError(f"calibrate: --dir {args.dir}: not a directory; create it first")
        if not os.access(args.dir, os.W_OK):
            raise UsageError(f"calibrate: --dir {args.dir}: not writable; pick a directory you can write")
    ranks = getattr(args, "ranks", 1)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= MAX_RANKS:
        raise UsageError(f"calibrate --ranks {ranks}: give 1 to {MAX_RANKS} (processes on this machine)")
    return load_hardware(args.base) if args.base else None


def write_spec(path: str | os.PathLike[str], data: dict[str, Any]) -> HardwareSpec:
    """Validate `data` (the preset structure) and write it as YAML; returns the spec as loaded back."""
    import yaml

    data = _rounded(data)
    spec = spec_from_dict(data, file=str(path))
    header = ("# Written by `tiersim calibrate`: measured figures of this machine (see sources:).\n"
              "# Units: bytes, seconds, FLOP/s, bytes/s (raw numbers).\n")
    class _Dumper(yaml.SafeDumper):
        pass

    def _list(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.Node:
        flow = all(isinstance(v, int | float) for v in value)  # curve points [flops, fraction] on one line
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)

    _Dumper.add_representer(list, _list)
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000,
                     allow_unicode=True)
    # whole or not at all (tiersim.output_files); an OSError is one line naming the flag
    write_or_fail("calibrate -o", str(path), lambda tmp: Path(tmp).write_text(header + body, encoding="utf-8"))
    return spec


def _rounded(value: Any, key: str = "") -> Any:
    """Floats to 6 significant digits (measurement noise is far larger), sources untouched."""
    if isinstance(value, dict):
        return {k: (v if k == "sources" else _rounded(v, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, key) for v in value]
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


def run(args: argparse.Namespace, sizes: Any = None) -> int:
    """The command; `sizes` (a replay.calibrate.CalibrationSizes) lets tests measure tiny sizes."""
    base = check_calibrate_args(args)
    if importlib.util.find_spec("torch") is None:
        raise UsageError("calibrate needs torch: pip install 'tiersim[replay]' (torch==2.13.0)")
    import torch

    from replay.precision import gemm16_forced

    device_type = "cuda" if torch.cuda.is_available() else "cpu"  # replay.calibrate's pick of the device
    # the path measured is the path the replay takes (the calibrated precision's pick, in every rank too)
    with gemm16_forced(getattr(args, "gemm16", None), getattr(args, "precision", "bf16"), device_type):
        return _run(args, sizes, base)


def _run(args: argparse.Namespace, sizes: Any, base: HardwareSpec | None) -> int:
    from replay.calibrate import calibrate
    from replay.calibrate_spec import spec_dict

    _progress("measuring this machine (progress on stderr)")
    from replay.errors import ReplayError

    precision = getattr(args, "precision", "bf16")
    n_ranks = getattr(args, "ranks", 1)
    try:
        cal = calibrate(args.dir, sizes, progress=_progress, precision=precision)
    except ReplayError as e:
        raise UsageError(str(e)) from None
    ranks = None
    if n_ranks > 1:
        if cal.device != "cpu":
            raise UsageError(f"calibrate --ranks {n_ranks}: measures CPU-only ranks (processes sharing this host); "
                             f"this machine has {cal.gpu_count} CUDA device(s): calibrate without --ranks")
        from replay.calibrate_ranks import measure_ranks

        _progress(f"{n_ranks} ranks: gloo all_reduce, compute and copies with every rank at once")
        from replay.calibrate import CalibrationSizes

        try:
            ranks = measure_ranks(n_ranks, precision, **(sizes or CalibrationSizes()).ranks_kwargs())
        except RuntimeError as e:
            raise UsageError(str(e)) from None
        _progress(f"{n_ranks} ranks: all_reduce {ranks.collective_bw / 1e9:.2f} GB/s per direction, latency "
                  f"{ranks.collective_latency_s * 1e6:.0f} us; each rank computes at {ranks.compute_share:.2f} of "
                  f"its solo rate; copies {ranks.copy_shared_total / 1e9:.2f} GB/s in all")
    data = spec_dict(cal, base.to_dict() if base is not None else None, args.base, ranks)
    spec = write_spec(args.output, data)
    _progress(f"done in {cal.wall_s:.1f} s; wrote {args.output}")
    if args.json:
        obj: dict[str, Any] = {"output": str(args.output), "measurements": cal.to_dict(), "spec": spec.to_dict()}
        if ranks is not None:  # --ranks N > 1: what the N ranks measured together
            obj["ranks"] = ranks.to_dict()
        print(json.dumps(versioned(obj), indent=1))
        return EXIT_OK
    g, h, pc, nv = spec.gpu, spec.host, spec.pcie, spec.nvme
    peaks = ", ".join(f"{k} {fmt_flops(v)}" for k, v in g.peak_flops.items())
    lines = [
        f"wrote {args.output} ({spec.name}); use: simulate --hw {args.output} --model gpt2",
        f"  gpu: {g.model} x{g.count}, memory {fmt_bytes(g.memory_bytes)}"
        + (" (budget: a quarter of DRAM)" if cal.device == "cpu" else ""),
        f"  peak: {peaks}; gemm efficiency {g.gemm_efficiency.points[0][1]:.2f} at "
        f"{g.gemm_efficiency.points[0][0]:.0e} FLOP .. {g.gemm_efficiency.points[-1][1]:.2f} at "
        f"{g.gemm_efficiency.points[-1][0]:.0e}",
        *_kind_lines(g),
        f"  hbm_bw {fmt_bandwidth(g.hbm_bw)}; launch overhead {cal.launch_overhead_s * 1e6:.1f} us",
        f"  per operator {g.op_overhead_s * 1e6:.1f} us"
        + (f" (per matmul {g.gemm_op_overhead_s * 1e6:.1f} us)" if g.gemm_op_overhead_s is not None else "")
        + (f", per task {g.task_overhead_s * 1e6:.1f} us" if g.task_overhead_s is not None else "")
        + "; element-wise in a layer "
        f"{fmt_bandwidth(g.elementwise_bw or g.hbm_bw)}" + ("; compute shares the host's cores" if g.shares_host
                                                             else "")
        if g.op_overhead_s is not None else "  per-operator figures: not measured",
        f"  host: {h.cores} cores, {fmt_bytes(h.dram_bytes)} DRAM, dram_bw {fmt_bandwidth(h.dram_bw)}, "
        f"Adam {h.optimizer_params_per_s / 1e6:.1f} M params/s ({cal.optimizer_variant})",
        f"  pcie (gpu0<->cpu): {fmt_bandwidth(pc.per_direction_bw)} one way (gen {pc.gen} x{pc.lanes} "
        f"eff {pc.efficiency:.3f}), duplex {pc.duplex_fraction:.2f}",
    ]
    if nv is not None:
        lines.append(f"  disk ({cal.disk.method}) {cal.disk.directory}: read {fmt_bandwidth(nv.read_bw)}, "
                     f"write {fmt_bandwidth(nv.write_bw)}, free {fmt_bytes(nv.capacity_bytes)}")
    lines.extend(f"  note: {n}" for n in cal.notes)
    print("\n".join(lines))
    return EXIT_OK


def _kind_lines(g: Any) -> list[str]:
    """One line per measured kernel-kind curve: its efficiency at its first and last size."""
    out = []
    for name, curve in (("backward products", g.gemm_backward_efficiency), ("attention", g.attention_efficiency),
                        ("attention backward", g.attention_backward_efficiency)):
        if curve is not None:
            (x0, e0), (x1, e1) = curve.points[0], curve.points[-1]
            out.append(f"  {name}: efficiency {e0:.2f} at {x0:.0e} FLOP .. {e1:.2f} at {x1:.0e}")
    return out


COMMAND = Command("calibrate", "measure this machine and write a hardware spec (torch)", add_args, run)
