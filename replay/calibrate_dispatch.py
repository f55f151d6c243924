"""The host's side of a layer task on a CUDA device, as the runner issues it (``tiersim calibrate``).

On CUDA the host issues a task's operators ahead of the device and the runner synchronises once at the task's
end, so a small layer's task costs what the host spends, not what its kernels take. That cost is not one
figure per operator: a matmul under autocast (its casts, its dispatch) costs several times an element-wise
operator, and the task itself (``torch.func.functional_call`` around the layer, the synchronisation at its end)
costs a fixed amount. One figure per operator, measured on one block, misprices a block with another mix of
operators (seen on one H200: the LLaMA probe's 24 us per operator against GPT-2 tasks at 55-69 us per operator).

:func:`measure_dispatch` times tasks the way the runner runs them (replay.store: fresh parameter leaves,
``functional_call`` under the precision's autocast, ``autograd.grad`` for the backward, a synchronisation at the
end) on tiny decoder blocks of two operator mixes (LLaMA: rotary positions, SwiGLU, RMSNorm; GPT-2: GELU,
LayerNorm, biases), one and two blocks per task, forward with and without autograd recording and backward,
and fits ``t = task + n_matmuls * gemm_op + n_other * op`` (non-negative least squares over the tasks; the
operator counts are ``workloads.ops``'s, the inventory the simulator prices). :func:`fit_dispatch` is the fit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import nnls
from torch.func import functional_call

from replay.model import Block, Dims
from replay.precision import Precision

# (family, blocks per task) of the probe tasks; each is timed forward (no_grad and recorded) and backward
PROBES: tuple[tuple[str, int], ...] = (("llama", 1), ("llama", 2), ("gpt2", 1), ("gpt2", 2))
TOKENS = 4
HIDDEN = 16


@dataclass(frozen=True)
class DispatchFit:
    """Seconds: once per task, per matmul or attention operator, per other operator; and how well it fits."""

    task_s: float
    gemm_op_s: float
    op_s: float
    worst_error: float  # largest |fit - measured| / measured over the probe tasks
    points: tuple[tuple[int, int, float], ...]  # (matmuls, other operators, seconds) per probe task


def fit_dispatch(points: Sequence[tuple[int, int, float]]) -> DispatchFit:
    """Non-negative least squares of ``seconds = task + n_matmuls * gemm_op + n_other * op`` over ``points``
    (matmuls, other operators, seconds); at least three tasks with independent counts."""
    if len(points) < 3:
        raise ValueError(f"fit_dispatch needs at least 3 tasks, got {len(points)}")
    a = np.array([[1.0, float(m), float(o)] for m, o, _ in points])
    y = np.array([float(t) for _, _, t in points])
    if np.linalg.matrix_rank(a) < 3:
        raise ValueError("fit_dispatch: the tasks' operator counts do not tell the three figures apart")
    # relative residuals: weight each task by 1/seconds, so a long task does not outvote a short one
    w = 1.0 / np.maximum(y, 1e-12)
    coef, _ = nnls(a * w[:, None], y * w)
    pred = a @ coef
    worst = float(np.max(np.abs(pred - y) / np.maximum(y, 1e-12)))
    return DispatchFit(float(coef[0]), float(coef[1]), float(coef[2]), worst,
                       tuple((int(m), int(o), float(t)) for m, o, t in points))


def _probe_model(family: str):  # type: ignore[no-untyped-def]
    from workloads import ModelSpec

    if family == "gpt2":
        return ModelSpec(name="probe-gpt2", family="gpt2", n_layers=1, hidden=HIDDEN, n_heads=2, n_kv_heads=2,
                         ffn=4 * HIDDEN, vocab=32, max_pos=64, tied_embeddings=True, mlp="gelu", norm="layernorm",
                         bias=True, learned_pos=True)
    return ModelSpec(name="probe-llama", family="llama", n_layers=1, hidden=HIDDEN, n_heads=2, n_kv_heads=2,
                     ffn=2 * HIDDEN, vocab=32, max_pos=64, tied_embeddings=False, mlp="swiglu", norm="rmsnorm",
                     bias=False, learned_pos=False)


MedianTime = Callable[[Callable[[], object], torch.device, int], float]


def measure_dispatch(device: torch.device, precision: str, repeats: int,
                     median_time: MedianTime) -> tuple[DispatchFit, str]:
    """Time the probe tasks on ``device`` as the runner runs them and fit the three figures (see the module's
    docstring); ``median_time(fn, device, repeats)`` times one call (synchronised)."""
    from workloads import WorkloadConfig
    from workloads.ops import layer_ops

    cfg = WorkloadConfig(micro_batch=1, seq_len=TOKENS, precision=precision)
    prec = Precision(precision, device.type)
    points: list[tuple[int, int, float]] = []
    for family, k in PROBES:
        model = _probe_model(family)
        blocks = torch.nn.Sequential(*[Block(Dims.from_model(model)) for _ in range(k)]).to(device)
        base = {n: p.detach() for n, p in blocks.named_parameters()}
        x = torch.randn(1, TOKENS, HIDDEN, device=device)
        held: dict[str, object] = {}

        def forward(record: bool, blocks: torch.nn.Module = blocks, base: dict = base, x: torch.Tensor = x,
                    held: dict = held) -> None:
            if not record:
                with torch.no_grad(), prec.autocast():
                    functional_call(blocks, base, (x,))
                return
            params = {n: p.detach().requires_grad_(True) for n, p in base.items()}
            xin = x.detach().requires_grad_(True)
            with torch.enable_grad(), prec.autocast():
                held["graph"] = (functional_call(blocks, params, (xin,)), xin, params)

        def backward(held: dict = held, forward: Callable[[bool], None] = forward) -> None:
            if "graph" not in held:
                forward(True)
            y, xin, params = held.pop("graph")  # type: ignore[misc]
            torch.autograd.grad(y, [xin, *params.values()], torch.ones_like(y))

        ops = {phase: layer_ops(model, cfg, 1, phase) for phase in ("fwd", "bwd")}
        counts = {phase: (k * len(o.matmul_flops), k * (o.n_ops - len(o.matmul_flops))) for phase, o in ops.items()}
        points.append((*counts["fwd"], median_time(functools.partial(forward, False), device, repeats)))
        points.append((*counts["fwd"], median_time(functools.partial(forward, True), device, repeats)))
        # the backward alone: each timed call runs a forward first (untimed: it is synchronised before)
        points.append((*counts["bwd"], _backward_time(forward, backward, device, repeats)))
    fit = fit_dispatch(points)
    how = (f"fitted: tasks as the runner runs them (torch.func.functional_call under the {precision} autocast, "
           f"autograd.grad for the backward, one synchronisation per task) on {device.type}: tiny LLaMA and GPT-2 "
           f"decoder blocks (hidden {HIDDEN}, {TOKENS} tokens), 1 and 2 per task, forward with and without autograd "
           "recording and backward, median of repeats; seconds = task + matmuls x gemm_op + other operators x op "
           f"(non-negative least squares, operator counts of workloads.ops): task {fit.task_s * 1e6:.1f} us, "
           f"per matmul {fit.gemm_op_s * 1e6:.1f} us, per other operator {fit.op_s * 1e6:.1f} us; the worst task "
           f"off the fit by {fit.worst_error * 100:.0f}% ("
           + ", ".join(f"{m}+{o} ops {t * 1e6:.0f} us" for m, o, t in fit.points) + ")")
    return fit, how


def _backward_time(forward: Callable[[bool], None], backward: Callable[[], None], device: torch.device,
                   repeats: int) -> float:
    import statistics
    import time

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    forward(True)
    backward()
    times = []
    for _ in range(max(repeats, 10)):
        forward(True)
        sync()
        t0 = time.perf_counter()
        backward()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
