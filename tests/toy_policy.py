"""``toy-dp``: data parallelism with the optimizer on the GPUs or on the CPU (the worked example of
``docs/policy-authoring.md``; tests/test_policy_toy.py registers it and runs it through simulate, plan and
replay).

Idea: every rank holds the 16-bit parameters and computes its share of the batch; each layer's gradients
are reduced across the data-parallel ranks as soon as its backward ends. Where the optimizer runs is the
decision this policy makes:

- ``optimizer=gpu``: fp32 master weights, Adam moments and the gradients stay on every GPU (replicated,
  16 bytes/param; ZeRO stage 0); gradients are all-reduced; each GPU steps its whole copy.
- ``optimizer=cpu``: master weights and Adam moments live in host memory, partitioned over the ranks;
  gradients are reduce-scattered and each rank's partition is offloaded (at most
  ``GRAD_BUCKETS_IN_FLIGHT`` buckets in flight per GPU); CPU Adam updates each layer's partitions, which
  are uploaded and all-gathered (ZeRO-Offload's step).

Knobs:
- ``optimizer`` (gpu | cpu, default gpu): where the optimizer step and its states are.
- ``tp`` (int, default 1): tensor-parallel degree; data parallelism runs over ``n_gpus / tp`` ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from policies.base import Job, PlanInfeasible, PolicyInfo, gpu_pool, pow2_divisors
from policies.builder import PlanBuilder
from policies.kit import (
    Grads,
    Layout,
    check_tp,
    cpu_update_by_layer,
    declare_streams,
    dtype_bytes,
    emit_microstep,
    gpu_step,
    workspace,
)
from simulator import Plan

NAME = "toy-dp"
GRAD_BUCKETS_IN_FLIGHT = 2


@dataclass(frozen=True)
class Knobs:
    optimizer: Literal["gpu", "cpu"] = "gpu"
    tp: int = 1


def gpu_state_bytes(job: Job, knobs: Knobs) -> dict[str, float]:
    """Persistent bytes per GPU by kind: the 16-bit parameters, and with the GPU optimizer its states."""
    p = float(job.trace.params) / knobs.tp
    out = {"param16": dtype_bytes(job) * p}
    if knobs.optimizer == "gpu":
        out.update(grad=dtype_bytes(job) * p, param32=4.0 * p, optim=8.0 * p)
    return out


def plan(job: Job, knobs: Knobs) -> Plan:
    check_tp(job, knobs.tp, NAME)
    lay = Layout(job.n_gpus, knobs.tp)
    on_cpu = knobs.optimizer == "cpu"
    b = PlanBuilder(NAME, knobs, job)
    declare_streams(b, lay, cpu_adam=on_cpu)
    states = gpu_state_bytes(job, knobs)
    pool = gpu_pool(job)
    if sum(states.values()) > pool.capacity_bytes:
        raise PlanInfeasible(NAME, pool.name, sum(states.values()), pool.capacity_bytes, "the model states")
    for r, g in enumerate(lay.gpus()):
        for kind, nbytes in states.items():
            b.tensor(f"{kind}.{g}", nbytes, kind, home=g, persistent=True)
        if on_cpu:  # this rank's partition of the master weights, Adam moments and fp32 gradients
            for kind, per_param in (("param32", 4.0), ("optim", 8.0), ("grad32", 4.0)):
                b.tensor(f"{kind}.r{r}", per_param * job.trace.params / lay.n, kind, home="cpu", persistent=True)
    workspace(b, job, lay)
    accum = job.accumulation(lay.dp)
    layers = range(len(job.trace.layers))
    b.segment("micro-steps", accum)
    if on_cpu:
        ready = {i: [f"ag{i}.d{j}^1" for j in range(lay.tp)] if lay.dp > 1 else [f"up{i}.{g}^1" for g in lay.gpus()]
                 for i in layers}
        emit_microstep(b, job, lay, Grads("reduce_scatter", bucket=True, offload=True,
                                          buckets_in_flight=GRAD_BUCKETS_IN_FLIGHT), gather_params=False,
                       param_ready=ready)
        b.segment("optimizer", 1)
        cpu_update_by_layer(b, job, lay, upload_bytes_per_param=dtype_bytes(job), staged=False,
                            first_deps={r: [f"d2h0.{g}"] for r, g in enumerate(lay.gpus())})
    else:
        ready = {i: [f"opt.{g}^1" for g in lay.gpus()] for i in layers}
        emit_microstep(b, job, lay, Grads("all_reduce", bucket=False, offload=False), gather_params=False,
                       param_ready=ready)
        b.segment("optimizer", 1)
        for r, g in enumerate(lay.gpus()):
            last = f"red0.d{r % lay.tp}" if lay.dp > 1 else f"bwd0.{g}"
            gpu_step(b, f"opt.{g}", f"{g}.compute", [last], job.trace.params / lay.tp, rank=r)
    return b.build(steps=2, notes=[f"optimizer on the {knobs.optimizer}, {lay.dp} data-parallel rank(s) x "
                                   f"tp={lay.tp}, {accum} micro-step(s) per step"],
                   info={"accumulation": accum, "dp": lay.dp, "tp": lay.tp})


POLICY = PolicyInfo(NAME, "toy: data parallel, optimizer on the GPUs or the CPU (knob)", Knobs, plan, __doc__ or "",
                    search_grid=lambda n: {"optimizer": ("gpu", "cpu"), "tp": pow2_divisors(n, 2)})
