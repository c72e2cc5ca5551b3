"""NCCL's ring as the simulator models it (``collectives.nccl_ring``): the same sums as the
course's ring, the same bytes per rank, and the engineering that makes it fast."""

from __future__ import annotations

import pytest
import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_reduce, cost, rail_rings
from mpgpu_edu.collectives.nccl_ring import all_reduce_nccl
from mpgpu_edu.comm import launch


@pytest.mark.parametrize("n, numel, channels", [(2, 1, 3), (3, 101, 4), (4, 1000, 24)])
def test_sums_like_the_ring(n, numel, channels) -> None:
    def program(comm):
        x = torch.arange(numel, dtype=torch.float64) * (comm.rank + 1)
        all_reduce_nccl(comm, x, channels=channels, segment_bytes=64)
        return x

    got = launch(program, Cluster.uniform(n, 1e-6, 1e9)).results
    want = torch.arange(numel, dtype=torch.float64) * n * (n + 1) / 2
    for x in got:
        assert torch.equal(x, want)


def test_rings_in_any_order_and_the_mean() -> None:
    rings = rail_rings(2, 2)

    def program(comm):
        x = torch.full((37,), float(comm.rank))
        all_reduce_nccl(comm, x, op="mean", rings=rings, segment_bytes=16)
        return x

    for x in launch(program, Cluster.uniform(4, 1e-6, 1e9)).results:
        assert torch.allclose(x, torch.full((37,), 1.5))


def test_each_rank_sends_what_one_ring_sends() -> None:
    n, nbytes = 8, 2**26

    def program(comm):
        all_reduce_nccl(comm, torch.empty(nbytes // 4, device="meta"))

    sent = launch(program, Cluster.preset("8xA100-nvlink")).bytes_sent_per_rank
    # 24 slices split unevenly over 8 ranks: a rank's share differs by a few elements, the
    # total does not (every chunk travels N - 1 times in each phase)
    assert sum(sent) == 2 * (n - 1) * nbytes
    assert sent == [pytest.approx(cost.ring_allreduce_bytes_sent(n, nbytes), rel=1e-5)] * n


def test_faster_than_the_courses_ring_on_nvswitch() -> None:
    """The channels and the fused adds keep the links busy: at 256 MiB on 8 H100s NCCL's ring
    reaches more than 90% of the link's effective bandwidth, the step-by-step ring does not."""
    cluster, nbytes = Cluster.preset("8xH100-nvswitch"), 2**28
    beta = cluster.route(0, 1).beta_Bps

    def ours(comm):
        all_reduce(comm, torch.empty(nbytes // 4, device="meta"), algo="ring")

    def nccl(comm):
        all_reduce_nccl(comm, torch.empty(nbytes // 4, device="meta"))

    t_ours = launch(ours, cluster).trace.makespan
    t_nccl = launch(nccl, cluster).trace.makespan
    assert cost.busbw(nbytes, t_nccl, 8) > 0.9 * beta > cost.busbw(nbytes, t_ours, 8)
    # the fused adds launch no kernels: the compute the trace holds is memory traffic only
    trace = launch(nccl, cluster.with_visible("0,1")).trace
    adds = [e for e in trace.on(0, "compute")]
    assert adds and all(e.label == "reduce in the copy" for e in adds)
    assert sum(e.duration for e in adds) == pytest.approx(
        cluster.memory_seconds(3 * 4 * (nbytes // 4 // 2)), rel=1e-6)


def test_refuses_a_real_backend_and_bad_rings() -> None:
    class NotSimulated:
        world_size, rank = 2, 0

    with pytest.raises(TypeError, match="RingAllReduce"):
        all_reduce_nccl(NotSimulated(), torch.zeros(4))

    def program(comm):
        all_reduce_nccl(comm, torch.zeros(4), rings=[[0, 0]])

    with pytest.raises(Exception, match="visit every rank"):
        launch(program, Cluster.uniform(2, 1e-6, 1e9))
