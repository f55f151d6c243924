"""The table of ``replay/device_check.sh``: what each stage did, read back from the files it left in its folder.

    python -m replay.device_check_table OUT

Reads ``OUT/stages.tsv`` (stage, status, seconds, limit), ``OUT/env.out`` (torch / CUDA / device, JSON),
``OUT/calibrate.out`` (``tiersim calibrate --json``), ``OUT/replay-<policy>.out`` (``tiersim replay --verify
--json``) and ``OUT/validation.json`` (``python -m replay.validation --json``), whichever exist, and writes
``OUT/table.md`` (markdown), also printed. A file a stage did not leave, or left broken, is a line saying so:
the table describes a failed run too. Exit 0 when written, 2 when OUT is not a folder.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _json(path: Path) -> tuple[Any, str]:
    """(the JSON object in ``path``, "") or (None, why not)."""
    if not path.is_file():
        return None, f"{path.name}: not written"
    try:
        return json.loads(path.read_text(encoding="utf-8")), ""
    except (ValueError, OSError) as e:
        return None, f"{path.name}: not JSON ({type(e).__name__})"


def _pct(x: object) -> str:
    if not isinstance(x, int | float) or isinstance(x, bool) or math.isnan(x):
        return "-"
    return "inf" if math.isinf(x) else f"{x * 100:+.1f}%"


def _mb(x: object) -> str:
    return f"{x / 1e6:.2f}" if isinstance(x, int | float) and not isinstance(x, bool) else "-"


def _ms(x: object) -> str:
    return f"{x * 1e3:.1f}" if isinstance(x, int | float) and not isinstance(x, bool) else "-"


def stages_section(out: Path) -> list[str]:
    lines = ["## Stages", "", "| stage | status | seconds | limit (s) |", "|---|---|---:|---:|"]
    path = out / "stages.tsv"
    if not path.is_file():
        return [*lines, "", "stages.tsv: not written"]
    for row in path.read_text(encoding="utf-8").splitlines()[1:]:
        cells = (row.split("\t") + ["", "", "", ""])[:4]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def env_section(out: Path) -> list[str]:
    env, why = _json(out / "env.out")
    if env is None:
        return ["## Machine", "", why]
    return ["## Machine", "", f"mode {env.get('mode')}; device {env.get('device')} (CUDA {env.get('cuda')}, "
            f"{env.get('device_count')} device(s)); torch {env.get('torch')}; Python {env.get('python')}; "
            f"{env.get('platform')}"]


def calibrate_section(out: Path) -> list[str]:
    cal, why = _json(out / "calibrate.out")
    head = ["## Calibration", ""]
    if not isinstance(cal, dict) or not isinstance(cal.get("spec"), dict):
        return [*head, why or "calibrate.out: no spec"]
    spec = cal["spec"]
    gpu, host, pcie = spec.get("gpu", {}), spec.get("host", {}), spec.get("pcie", {})
    peaks = ", ".join(f"{k} {v / 1e12:.2f} TFLOP/s" for k, v in sorted(gpu.get("peak_flops", {}).items())
                      if isinstance(v, int | float))
    rows = [("gpu", f"{gpu.get('model')} x{gpu.get('count')}"), ("peak FLOP/s", peaks or "-"),
            ("hbm_bw", _gbs(gpu.get("hbm_bw"))), ("op overhead", _us(gpu.get("op_overhead"))),
            ("per matmul / per task", f"{_us(gpu.get('gemm_op_overhead'))} / {_us(gpu.get('task_overhead'))}"),
            ("element-wise in a layer", _gbs(gpu.get("elementwise_bw"))),
            ("host Adam", f"{host.get('optimizer_params_per_s', 0) / 1e6:.1f} M params/s"),
            ("written", str(cal.get("output")))]
    if pcie:
        rows.insert(3, ("pcie", f"gen {pcie.get('gen')} x{pcie.get('lanes')}, efficiency {pcie.get('efficiency')}"))
    return [*head, "| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def _gbs(x: object) -> str:
    return f"{x / 1e9:.1f} GB/s" if isinstance(x, int | float) and not isinstance(x, bool) else "-"


def _us(x: object) -> str:
    return f"{x * 1e6:.1f} us" if isinstance(x, int | float) and not isinstance(x, bool) else "-"


def replay_section(out: Path) -> list[str]:
    lines = ["## Replays (`tiersim replay --verify`)", "",
             "| policy | device | verify | sim step ms | measured ms | step error | worst peak error (pool) |",
             "|---|---|---|---:|---:|---:|---|"]
    files = sorted(out.glob("replay-*.out"))
    if not files:
        return [*lines, "", "no replay ran"]
    for f in files:
        d, why = _json(f)
        policy = f.stem.removeprefix("replay-")
        if not isinstance(d, dict):
            lines.append(f"| {policy} | - | - | - | - | - | {why or 'not an object'} |")
            continue
        verify = d.get("verify") or {}
        err = d.get("error") or {}
        peaks = {k: v for k, v in (err.get("peak_bytes") or {}).items() if isinstance(v, int | float)}
        worst = max(peaks, key=lambda k: abs(peaks[k]), default=None)
        lines.append(f"| {policy} | {(d.get('measured') or {}).get('device', '-')} | "
                     f"{'ok' if verify.get('ok') else 'MISMATCH' if verify else '-'} | "
                     f"{_ms((d.get('simulated') or {}).get('step_time_s'))} | "
                     f"{_ms((d.get('measured') or {}).get('step_time_s'))} | {_pct(err.get('step_time'))} | "
                     + (f"{_pct(peaks[worst])} ({worst})" if worst else "-") + " |")
    return lines


def validation_section(out: Path) -> list[str]:
    d, why = _json(out / "validation.json")
    head = ["## Validation matrix (`python -m replay.validation`)", ""]
    if not isinstance(d, dict):
        return [*head, why]
    rows = [r for r in d.get("rows", []) if isinstance(r, dict)]
    lines = [*head, "| case | policy | sim step ms | measured ms | step error | peak error gpu0 / cpu / nvme |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        pe = r.get("peak_error") or {}
        lines.append(f"| {r.get('case')} | {r.get('policy')} | {_ms(r.get('sim_step_s'))} | "
                     f"{_ms(r.get('meas_step_s'))} | {_pct(r.get('step_error'))} | "
                     f"{' / '.join(_pct(pe.get(p)) for p in ('gpu0', 'cpu', 'nvme'))} |")
    s = d.get("summary") or {}
    if s:
        lines += ["", "summary: " + ", ".join(f"{k} {_pct(v) if 'error' in k else v}" for k, v in s.items())]
    return lines


def build(out: Path) -> str:
    parts = [["# tiersim device check", "", f"folder: {out}"], stages_section(out), env_section(out),
             calibrate_section(out), replay_section(out), validation_section(out)]
    return "\n\n".join("\n".join(p) for p in parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("python -m replay.device_check_table OUT: OUT must be the folder replay/device_check.sh wrote",
              file=sys.stderr)
        return 2
    out = Path(args[0])
    text = build(out)
    (out / "table.md").write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
