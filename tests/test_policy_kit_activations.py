"""``policies.kit.activations``: a saved activation moved off the GPU after its forward and back for its backward."""

from __future__ import annotations

from policies.builder import PlanBuilder
from policies.kit import gpu_streams
from policies.kit.activations import offload_activation, reload_activation
from simulator.phase import Phase
from tiersim.api import JobRequest, make_job


def test_offload_and_reload_move_the_tensor_itself_on_the_gpus_copy_engines() -> None:
    job, _ = make_job("a100", "gpt2", JobRequest(seq_len=128))
    b = PlanBuilder("kit-test", None, job)
    gpu_streams(b, ["gpu0"], extra=(("act_out", "d2h"),))
    b.tensor("act1.gpu0", 1e6, "activation", scope="iteration", layer=1)
    b.segment("micro-steps", 1)
    out = offload_activation(b, "out1.gpu0", "gpu0", "act1.gpu0", ["fwd1.gpu0"], layer=1, rank=0, dst="nvme",
                             stream="gpu0.act_out")
    back = reload_activation(b, "in1.gpu0", "gpu0", "act1.gpu0", [out], layer=1, rank=None)
    tasks = {t.id: t for _, _, ts in b._segments for t in ts}
    assert (out, back) == ("out1.gpu0", "in1.gpu0")
    o, i = tasks[out], tasks[back]
    assert (o.op, o.stream, o.src, o.dst, str(o.tensor)) == ("copy", "gpu0.act_out", "gpu0", "nvme", "act1.gpu0")
    assert (i.op, i.stream, i.src, i.dst, str(i.tensor)) == ("copy", "gpu0.h2d", "cpu", "gpu0", "act1.gpu0")
    for t in (o, i):
        assert t.alloc_dst and t.free_src  # the copy moves the tensor: allocated there, freed here
    assert [str(d) for d in i.deps] == ["out1.gpu0"]
    assert o.tags == {"phase": Phase.ACTIVATION_OFFLOAD, "layer": 1, "rank": 0}
    assert i.tags == {"phase": Phase.ACTIVATION_RELOAD, "layer": 1}
