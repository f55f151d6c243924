"""The fit behind the Ampere and Hopper GPUs' compute price, printed with its residuals
(``python -m tiersim.foundry_fit``).

An A100 or H100 layer task is priced kernel by kernel (``costs.compute``): its linear layers' matmuls on the
generation's GEMM curve, its FlashAttention kernel on the attention curve (``gpu.attention_efficiency``) and its
element-wise operators (norms, activations, residual adds, casts, the loss: ``workloads.ops``, eager PyTorch's
inventory) by their bytes over ``gpu.elementwise_efficiency`` x ``gpu.hbm_bw``. Three shared figures per
generation set that price, fitted here once: the GEMM curve's ceiling, the attention curve's ceiling (both keep
the shape over FLOPs per kernel of the earlier per-kernel derivation, ``hardware_specs.yaml``) and the achieved
fraction of HBM bandwidth. Per row of llm-foundry's MPT benchmark tables (``tiersim/published``): one GPU's
measured seconds per step (the published MFU's FLOPs over MFU x peak) against ``G / gemm + A / attention +
E / fraction``, G, A the kernels' seconds at unit ceilings and E the element-wise bytes over HBM bandwidth;
non-negative least squares on the relative error. Fitted rows: Ampere, the 2023-10 A100-80GB table less the rows
``tiersim validate`` compares; Hopper, the H100 table's 760m, 3b and 13b rows. Held out and printed apart: the
2023-05 A100 table (another software stack, torch 1.13), the other H100 model sizes, and ``tiersim validate``'s
rows. The presets carry the fit rounded to three digits (``tests/test_foundry_fit.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from hardware_models import Curve
from tiersim.validate_runs import LLM_FOUNDRY, foundry_run, run_job
from tiersim.validate_table import TORCH_2_1_TABLES, TableRow, load_rows
from workloads.ops import ATTENTION, GEMM, layer_ops

__all__ = ["AMPERE_SHAPE", "HOPPER_SHAPE", "Features", "Fit", "fit", "row_features"]

# the per-kernel curves' shapes over FLOPs per kernel (hardware_specs.yaml gemm_efficiency_by_generation, each point
# over its curve's ceiling, as derived before this fit): what is fitted is the ceiling each is scaled to
AMPERE_SHAPE = ((1e8, 0.366), (1e9, 0.635), (1e10, 0.827), (1e11, 0.923), (1e12, 0.990), (1e13, 1.0))
HOPPER_SHAPE = ((1e8, 0.280), (1e9, 0.556), (1e10, 0.769), (1e11, 0.893), (1e12, 0.987), (1e13, 1.0))
SHAPES = {"a100_80gb": AMPERE_SHAPE, "h100_80gb": HOPPER_SHAPE}


@dataclass(frozen=True)
class Features:
    """One GPU's work per optimizer step of a row, each part at a unit ceiling, and the published step."""

    gemm_s: float         # the linear layers' kernels at a unit-ceiling curve (seconds x ceiling)
    attention_s: float    # the attention kernels (FlashAttention: forward, backward, recompute), the same way
    elementwise_s: float  # element-wise bytes over full HBM bandwidth (seconds x fraction)
    measured_s: float     # the row's published step


def row_features(row: TableRow) -> Features:
    """One GPU's work per optimizer step of ``row`` (forward, backward, recompute as its table ran it)."""
    run = foundry_run(row.model, row.num_params, row.gpu, row.seq_len, row.micro_batch, row.grad_accum,
                      row.checkpointing, row.mfu, row.hfu, torch_2_1=row.table in TORCH_2_1_TABLES)
    job = run_job(run)
    m, c, hw = job.model, job.config, job.hw
    peak = hw.peak_flops_for(c.precision)
    shape = Curve(SHAPES[row.gpu])  # the curve at a unit ceiling
    phases = ("fwd", "bwd", "recompute") if c.checkpointing == "full" else ("fwd", "bwd")
    ops = [layer_ops(m, c, i, ph) for i in range(m.n_layers + 2) for ph in phases]
    gemm = attention = 0.0
    for o in ops:
        for f, kind in zip(o.matmul_flops, o.kinds or (GEMM,) * len(o.matmul_flops), strict=True):
            if f > 0:
                t = f / (peak * shape(f))
                attention, gemm = (attention + t, gemm) if kind == ATTENTION else (attention, gemm + t)
    ew = sum(o.elementwise_bytes for o in ops) / hw.gpu.hbm_bw
    model_flops = LLM_FOUNDRY.model(float(m.params()), m.n_layers, m.hidden, row.seq_len, m.vocab)
    k = row.grad_accum
    return Features(gemm * k, attention * k, ew * k,
                    model_flops * row.micro_batch * k / (row.mfu * peak))


@dataclass(frozen=True)
class Fit:
    gemm: float        # the GEMM curve's ceiling, fraction of the dense peak
    attention: float   # the attention kernel's ceiling
    elementwise: float  # achieved fraction of HBM bandwidth of the element-wise operators

    def predict(self, f: Features) -> float:
        return f.gemm_s / self.gemm + f.attention_s / self.attention + f.elementwise_s / self.elementwise


def fit(features: Iterable[Features]) -> Fit:
    """Least squares on the relative error of the predicted step (the three inverse ceilings >= 0)."""
    fs = list(features)
    a = np.array([[f.gemm_s / f.measured_s, f.attention_s / f.measured_s, f.elementwise_s / f.measured_s]
                  for f in fs])
    coef, _ = nnls(a, np.ones(len(fs)))
    g, at, ew = (1 / float(x) if x > 0 else float("inf") for x in coef)
    return Fit(g, at, ew)


def _line(name: str, fitted: Fit, feats: Sequence[Features]) -> str:
    errs = [f.measured_s / fitted.predict(f) - 1 for f in feats]  # MFU error, + = simulated faster
    return (f"  {name:46s} n={len(errs):3d}  median {statistics.median(errs) * 100:+5.1f}%  mean |error| "
            f"{statistics.fmean(abs(e) for e in errs) * 100:4.1f}%  range {min(errs) * 100:+.1f}% .. "
            f"{max(errs) * 100:+.1f}%")


def _group(r: TableRow) -> str:
    if r.role == "validate":
        return "held out: in tiersim validate"
    if r.role == "fitted":
        return "fitted"
    return "held out: other model sizes" if r.gpu == "h100_80gb" else "held out: the 2023-05 table (torch 1.13)"


def fits() -> dict[str, tuple[Fit, dict[str, list[tuple[TableRow, Features]]]]]:
    """Per GPU (a100_80gb, h100_80gb): the fit and every row's features by group."""
    out = {}
    for gpu in SHAPES:
        groups: dict[str, list[tuple[TableRow, Features]]] = {}
        for r in load_rows():
            if r.gpu == gpu:
                groups.setdefault(_group(r), []).append((r, row_features(r)))
        out[gpu] = (fit(f for _, f in groups["fitted"]), groups)
    return out


def main() -> None:
    for gpu, (fitted, groups) in fits().items():
        print(f"{gpu}: fitted on {len(groups['fitted'])} rows: GEMM ceiling {fitted.gemm:.3f} and attention kernel "
              f"{fitted.attention:.3f} of the dense peak, element-wise operators at {fitted.elementwise:.3f} of HBM "
              "bandwidth")
        print("  MFU residuals (+ = simulated faster than published):")
        for name in sorted(groups, key=lambda g: (g != "fitted", g)):
            for ck in (False, True):
                sel = [f for r, f in groups[name] if r.checkpointing == ck]
                if sel:
                    print(_line(f"{name}, {'ckpt' if ck else 'no ckpt'}", fitted, sel))


if __name__ == "__main__":
    main()
