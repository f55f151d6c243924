"""One ``zero-infinity`` micro-step for all ranks: per use of a layer (forward 0..L-1, then backward
L-1..0) its fetch (NVMe -> pinned CPU -> GPU slice -> all-gather, each with its prefetch distance), the
checkpoint reload, the compute, and after a backward the gradients (reduce-scatter, the slice to the CPU
accumulation buffer, and at the accumulation boundary the fp32 slice to NVMe)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from policies import kit
from policies.base import Job
from policies.builder import PlanBuilder
from policies.zero_infinity.knobs import Knobs
from policies.zero_infinity.sizes import offloads_ckpt, per_param_bytes
from simulator.phase import Phase
from workloads.trace import LayerTrace


@dataclass
class MicroStep:
    """Emits one micro-step in the current segment.

    ``sfx`` suffixes this micro-step's ids; ``prev(task_id)`` names a task of the previous micro-step
    (None when there is none in this step); ``boundary``: the accumulation boundary (fp32 gradients go to
    NVMe with optimizer_device=nvme); ``last_opt[r]``: rank r's last optimizer task (the previous step's
    update that the first fetch waits for).
    """

    b: PlanBuilder
    job: Job
    knobs: Knobs
    n: int
    sfx: str
    prev: Callable[[str], str | None]
    boundary: bool
    last_opt: list[str]

    def __post_init__(self) -> None:
        self.gpus = [kit.gpu(r) for r in range(self.n)]
        self.db = kit.dtype_bytes(self.job)
        self.order = kit.UseOrder(len(self.job.trace.layers), self.sfx, self.prev)

    def emit(self) -> None:
        first_fetch = True
        for u, (i, ph) in enumerate(self.order.uses):
            layer = self.job.trace.layers[i]
            if layer.params > 0:
                self.fetch(u, i, ph, first_fetch)
                first_fetch = False
            if ph == "f":
                self.forward(i, layer)
                continue
            if offloads_ckpt(self.job, self.knobs, i):
                self.reload(u, i)
            self.backward(i, layer)
            self.gradients(i, layer)

    # -- fetch: NVMe -> pinned CPU -> GPU slice -> all-gather ------------------------------------------
    def fetch(self, u: int, i: int, ph: str, first_fetch: bool) -> None:
        b, n, k, sfx = self.b, self.n, self.knobs, self.sfx
        s = self.job.trace.layers[i].params / n
        use = kit.use_of(ph)
        opt_dep = [f"{self.last_opt[r]}^1" for r in range(n)] if first_fetch else []
        if k.param_nvme:  # every rank reads its slice at once: one flow of n slices over the shared drives
            kit.swap(b, f"nr{ph}{i}{sfx}", "cpu.pread", Phase.PARAM_SWAP_IN, "nvme", "cpu", n * s * self.db,
                     self.order.window(u, k.nvme_prefetch, self.gpus) + opt_dep, layer=i, use=use,
                     allocs=[(f"pin{ph}{i}.r{r}", "cpu") for r in range(n)],
                     reads=[(f"param16.r{r}", "nvme") for r in range(n)])
        window = self.order.window

        def upload_deps(r: int, g: str) -> list[str]:
            return window(u, k.cpu_prefetch, [g]) + ([f"nr{ph}{i}{sfx}"] if k.param_nvme else opt_dep[r:r + 1])

        kit.sliced_fetch(b, self.gpus, i, ph, s * self.db, self.job.trace.layers[i].params * self.db, upload_deps,
                         sfx=sfx, gather_deps=window(u, k.gather_prefetch, self.gpus),
                         frees_of=lambda r: [(f"pin{ph}{i}.r{r}", "cpu")] if k.param_nvme else [],
                         reads_of=lambda r: [] if k.param_nvme else [(f"param16.r{r}", "cpu")])

    def reload(self, u: int, i: int) -> None:
        """The checkpoint of layer i back from CPU memory before its recomputation (``cpu_prefetch``)."""
        for g in self.gpus:
            kit.move_activation(self.b, f"cki{i}{self.sfx}.{g}", f"{g}.h2d", f"act{i}.{g}", "cpu", g,
                                [f"cko{i}{self.sfx}.{g}"] + self.order.window(u, self.knobs.cpu_prefetch, [g]),
                                phase=Phase.ACTIVATION_RELOAD, layer=i)

    # -- compute ---------------------------------------------------------------------------------------
    def ready(self, i: int, ph: str, g: str, layer: LayerTrace) -> list[str]:
        if layer.params <= 0:
            return []
        return [f"ag{ph}{i}{self.sfx}"] if self.n > 1 else [f"up{ph}{i}{self.sfx}.{g}"]

    def forward(self, i: int, layer: LayerTrace) -> None:
        sfx = self.sfx
        for r, g in enumerate(self.gpus):
            kit.forward(self.b, i, layer, g, r, self.ready(i, "f", g, layer), tid=f"fwd{i}{sfx}.{g}",
                        allocs=[(f"act{i}.{g}", g)], frees=[(f"pgf{i}.{g}", g)] if layer.params > 0 else [])
            if offloads_ckpt(self.job, self.knobs, i):
                kit.move_activation(self.b, f"cko{i}{sfx}.{g}", f"{g}.d2h", f"act{i}.{g}", g, "cpu",
                                    [f"fwd{i}{sfx}.{g}"], phase=Phase.ACTIVATION_OFFLOAD, layer=i, rank=r)

    def backward(self, i: int, layer: LayerTrace) -> None:
        sfx = self.sfx
        for r, g in enumerate(self.gpus):
            deps = self.ready(i, "b", g, layer) + ([f"cki{i}{sfx}.{g}"] if offloads_ckpt(self.job, self.knobs, i)
                                                   else [])
            if layer.recompute_flops > 0:
                kit.recompute(self.b, i, layer, g, r, deps, tid=f"rc{i}{sfx}.{g}")
                deps = []
            kit.backward(self.b, i, layer, g, r, deps, tid=f"bwd{i}{sfx}.{g}", allocs=[(f"gb{i}.{g}", g)],
                         frees=[(f"act{i}.{g}", g)] + ([(f"pgb{i}.{g}", g)] if layer.params > 0 else []))

    # -- gradients: reduce-scatter, slice to the CPU accumulation buffer (and NVMe at the boundary) ----
    def gradients(self, i: int, layer: LayerTrace) -> None:
        b, n, sfx, gpus = self.b, self.n, self.sfx, self.gpus
        if layer.params <= 0:
            for r, g in enumerate(gpus):
                kit.release(b, f"gfree{i}{sfx}.{g}", g, [(f"gb{i}.{g}", g)], layer=i, rank=r)
            return
        s = layer.params / n
        if n > 1:
            kit.reduce(b, f"rs{i}{sfx}", "dp.grad", gpus, layer.params * self.db, [f"bwd{i}{sfx}.{g}" for g in gpus],
                       layer=i, allocs=[(f"gs{i}.{g}", g) for g in gpus], frees=[(f"gb{i}.{g}", g) for g in gpus])
        for r, g in enumerate(gpus):
            kit.offload(b, f"gd{i}{sfx}.{g}", g, s * self.knobs.grad_bytes_per_param,
                        [f"rs{i}{sfx}" if n > 1 else f"bwd{i}{sfx}.{g}"], layer=i, rank=r,
                        frees=[(f"gs{i}.{g}" if n > 1 else f"gb{i}.{g}", g)], reads=[(f"grad.r{r}", "cpu")])
        if self.boundary and self.knobs.optimizer_nvme:  # all ranks' fp32 gradient slices: one flow to the drives
            kit.swap(b, f"gw{i}{sfx}", "cpu.gwrite", Phase.GRAD_SWAP_OUT, "cpu", "nvme",
                     n * s * per_param_bytes(self.job, self.knobs)["grad32"], [f"gd{i}{sfx}.{g}" for g in gpus],
                     layer=i, allocs=[(f"gst{i}.r{r}", "cpu") for r in range(n)],
                     frees=[(f"gst{i}.r{r}", "cpu") for r in range(n)])
