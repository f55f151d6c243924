"""``zero-infinity``'s optimizer step: per optimizer sub-group and rank, CPU Adam in place, or with
``optimizer_device=nvme`` the states read from NVMe, Adam, and written back (pipelined with
``pipeline_io``); with ``param_device=nvme`` the updated 16-bit slice is written to its NVMe home."""

from __future__ import annotations

from policies import kit
from policies.base import Job
from policies.builder import PlanBuilder
from policies.zero_infinity.knobs import Knobs
from policies.zero_infinity.sizes import per_param_bytes
from simulator.phase import Phase


def last_optimizer_tasks(knobs: Knobs, n: int, n_groups: int) -> list[str]:
    """Per rank, the task that ends its optimizer step (what the next step's first fetch waits for)."""
    k = n_groups - 1
    return [f"ow{k}.r{r}" if knobs.optimizer_nvme else f"pw{k}.r{r}" if knobs.param_nvme else f"adam{k}.r{r}"
            for r in range(n)]


def _swap_in_deps(knobs: Knobs, k: int, r: int) -> tuple[list[str], list[str]]:
    """(what the NVMe read of sub-group k waits for, what its Adam waits for besides the read)."""
    if knobs.pipeline_io:  # read k+1 when Adam k starts; Adam k+1 after the write of k-1
        return (kit.read_ahead(k, 2, f"adam{{}}.r{r}") + kit.read_ahead(k, 3, f"ow{{}}.r{r}"),
                kit.read_ahead(k, 2, f"ow{{}}.r{r}"))
    return kit.read_ahead(k, 1, f"ow{{}}.r{r}"), []


def emit_optimizer(b: PlanBuilder, job: Job, knobs: Knobs, n: int, groups: list[list[int]]) -> None:
    layers = job.trace.layers
    db = kit.dtype_bytes(job)
    pp = per_param_bytes(job, knobs)
    last_layer = next(i for i in range(len(layers)) if layers[i].params > 0)  # the last gradient to arrive
    all_grads = [f"gd{last_layer}.last.{kit.gpu(r)}" for r in range(n)]
    if knobs.optimizer_nvme:
        all_grads.append(f"gw{last_layer}.last")
    states = pp["param32"] + pp["optim"]
    for k, grp in enumerate(groups):
        q = sum(layers[i].params for i in grp) / n
        extra = {"sub_group": k, "layers": f"{grp[0]}-{grp[-1]}"}
        for r in range(n):
            adam_deps = all_grads if k == 0 else []
            if knobs.optimizer_nvme:
                rd, after = _swap_in_deps(knobs, k, r)
                kit.swap(b, f"or{k}.r{r}", f"cpu.oread{r}", Phase.OPTIMIZER_SWAP_IN, "nvme", "cpu",
                         q * (states + pp["grad32"]), (all_grads if k == 0 else []) + rd, rank=r,
                         allocs=[(f"osb{k}.r{r}", "cpu")], reads=[(f"param32.r{r}", "nvme")] if pp["param32"] else [],
                         extra=extra)
                adam_deps = adam_deps + after + [f"or{k}.r{r}"]
            kit.cpu_adam(b, f"adam{k}.r{r}", r, adam_deps, q, extra=extra)
            if knobs.param_nvme:
                kit.swap(b, f"pw{k}.r{r}", f"cpu.owrite{r}", Phase.PARAM_SWAP_OUT, "cpu", "nvme", q * db,
                         [f"adam{k}.r{r}"], rank=r, allocs=[(f"pst{k}.r{r}", "cpu")], frees=[(f"pst{k}.r{r}", "cpu")],
                         extra=extra)
            if knobs.optimizer_nvme:
                kit.swap(b, f"ow{k}.r{r}", f"cpu.owrite{r}", Phase.OPTIMIZER_SWAP_OUT, "cpu", "nvme", q * states,
                         [f"adam{k}.r{r}"], rank=r, frees=[(f"osb{k}.r{r}", "cpu")], extra=extra)
