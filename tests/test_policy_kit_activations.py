"""``policies.kit.move_activation``: a saved activation moved off the GPU after its forward and back for its
backward (lazytrain's per-layer CPU/NVMe placement, zero-infinity's and synergyscale's offload)."""

from __future__ import annotations

from policies.builder import PlanBuilder
from policies.kit import gpu_streams, move_activation
from simulator.phase import Phase
from tiersim.api import JobRequest, make_job


def test_move_activation_moves_the_tensor_itself_out_and_back() -> None:
    job, _ = make_job("a100", "gpt2", JobRequest(seq_len=128))
    b = PlanBuilder("kit-test", None, job)
    gpu_streams(b, ["gpu0"], extra=(("act_out", "d2h"),))
    b.tensor("act1.gpu0", 1e6, "activation", scope="iteration", layer=1)
    b.segment("micro-steps", 1)
    out = move_activation(b, "out1.gpu0", "gpu0.act_out", "act1.gpu0", "gpu0", "nvme", ["fwd1.gpu0"],
                          phase=Phase.ACTIVATION_OFFLOAD, layer=1, rank=0)
    back = move_activation(b, "in1.gpu0", "gpu0.h2d", "act1.gpu0", "nvme", "gpu0", [out],
                           phase=Phase.ACTIVATION_RELOAD, layer=1)
    tasks = {t.id: t for _, _, ts in b._segments for t in ts}
    assert (out, back) == ("out1.gpu0", "in1.gpu0")
    o, i = tasks[out], tasks[back]
    assert (o.op, o.stream, o.src, o.dst, str(o.tensor)) == ("copy", "gpu0.act_out", "gpu0", "nvme", "act1.gpu0")
    assert (i.op, i.stream, i.src, i.dst, str(i.tensor)) == ("copy", "gpu0.h2d", "nvme", "gpu0", "act1.gpu0")
    for t in (o, i):
        assert t.alloc_dst and t.free_src  # the copy moves the tensor: allocated there, freed here
    assert [str(d) for d in o.deps] == ["fwd1.gpu0"] and [str(d) for d in i.deps] == ["out1.gpu0"]
    assert o.tags == {"phase": Phase.ACTIVATION_OFFLOAD, "layer": 1, "rank": 0}
    assert i.tags == {"phase": Phase.ACTIVATION_RELOAD, "layer": 1}
