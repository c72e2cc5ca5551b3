"""The compute model: every op on the roofline, a launch per kernel, adds and copies charged.

On a preset each op costs ``max(flops / (peak * efficiency), bytes / memory_Bps) +
launch_overhead_s``; on ``Cluster.uniform`` adds and copies are free, so closed forms hold.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import reduce_scatter
from mpgpu_edu.collectives import cost
from mpgpu_edu.comm import launch
from mpgpu_edu.comm.flops import FlopCount
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.cluster.hardware import GPUS
from mpgpu_edu.ps import train_ps

PRESET = "4xA100-nvlink"


def test_every_gpu_has_a_cited_roofline() -> None:
    for spec in GPUS.values():
        assert 0 < spec.effective_memory_Bps <= spec.memory_Bps
        assert 0 < spec.efficiency < 1 and spec.launch_overhead_s > 0
        assert spec.compute_source.strip()
    assert GPUS["A100-80GB"].memory_Bps == pytest.approx(2039e9)
    assert GPUS["H100-SXM-80GB"].memory_Bps == pytest.approx(3350e9)
    assert GPUS["RTX4090-24GB"].memory_Bps == pytest.approx(1008e9)


def test_op_seconds_is_the_larger_side_plus_a_launch() -> None:
    cluster = Cluster.preset(PRESET)
    launch_s = cluster.launch_overhead_s
    assert cluster.op_seconds(0, 3e9) == pytest.approx(3e9 / cluster.memory_Bps + launch_s)
    big = 1e15
    assert cluster.op_seconds(big, 1e6, "bf16") == pytest.approx(
        cluster.flop_seconds(big, "bf16") + launch_s)
    free = Cluster.uniform(4, 1e-5, 1e9)
    assert free.op_seconds(0, 3e9) == 0.0 and free.memory_seconds(1e12) == 0.0


def test_counter_counts_bytes_kernels_and_skips_views() -> None:
    a, b = torch.ones(1000), torch.ones(1000)
    with FlopCount() as counter:
        a.add_(b)  # reads a and b, writes a
        a.view(10, 100).t()  # views: nothing moves
        a[:500].copy_(b[:500])  # reads 500 floats, writes 500: the destination is not read
    assert counter.kernels == 2
    assert counter.bytes == 3 * 4000 + 2 * 2000
    assert counter.total == 0


def test_attention_flops_are_counted_at_the_input_dtype() -> None:
    q = torch.randn(1, 2, 16, 8, dtype=torch.bfloat16)
    with FlopCount() as counter:
        F.scaled_dot_product_attention(q, q, q)
    assert counter.by_dtype.get("bf16", 0) > 0
    assert counter.by_dtype.get("fp32", 0) == 0


def _ps_run(cluster: Cluster) -> tuple:
    model_fn = functools.partial(make_mlp, [256, 512, 256])
    return launch(train_ps, cluster, model_fn, make_batches(1, 12, 256, 256)), model_fn


def test_the_servers_averaging_takes_its_bytes_over_memory_bandwidth() -> None:
    cluster = Cluster.preset(PRESET)
    run, model_fn = _ps_run(cluster)
    server, workers = cluster.world_size - 1, cluster.world_size - 1
    nbytes = sum(p.numel() for p in model_fn().parameters()) * 4
    update = run.trace.on(server, "compute", "optimizer")
    assert len(update) == 1
    # stack the W gradients (read and write W S), sum them (read W S, write S): at least that
    averaging = cluster.memory_seconds(3 * workers * nbytes + nbytes)
    assert update[0].duration >= averaging
    assert run.trace.idle_fraction(server) < 1.0
    # the textbook cluster keeps it free
    free, _ = _ps_run(Cluster.uniform(4, 1e-5, 1e9))
    assert free.trace.on(server, "compute", "optimizer") == []


def _reduce_scatter(comm, numel: int) -> None:  # noqa: ANN001
    reduce_scatter(comm, torch.ones(numel))


@pytest.mark.parametrize("n", [3, 4])
def test_ring_reduce_scatter_steps_include_the_add(n: int) -> None:
    """Ring reduce-scatter of S bytes on N ranks, each step sending a chunk of s = S/N bytes
    and then adding the received chunk into its own (read 2s, write s):

        T = (N - 1) (alpha + s / beta) + (N - 1) (3 s / memory_Bps + launch_overhead_s)
            + copy_in + copy_out

    where copy_in = 2S / memory_Bps + launch (``reduce_scatter`` clones its input first) and
    copy_out = 2s / memory_Bps + launch (it clones its own chunk at the end)."""
    cluster = Cluster.preset(PRESET)
    numel = 3 * 4 * 2**16  # divisible by 3 and 4: equal chunks
    size, chunk = numel * 4, numel * 4 // n
    route = cluster.route(0, 1)
    add = cluster.op_seconds(0, 3 * chunk)
    copy_in, copy_out = cluster.op_seconds(0, 2 * size), cluster.op_seconds(0, 2 * chunk)
    want = (cost.ring_reduce_scatter_time(n, size, route.alpha_s, route.beta_Bps)
            + (n - 1) * add + copy_in + copy_out)
    sub = Cluster(cluster.name, cluster.gpu, cluster.topology, ",".join(map(str, range(n))))
    trace = launch(_reduce_scatter, sub, numel).trace
    assert trace.makespan == pytest.approx(want, rel=1e-9)
    adds = [e for e in trace.on(0, "compute") if e.label == "elementwise"]
    assert sum(e.duration for e in adds) == pytest.approx((n - 1) * add + copy_in + copy_out)


def test_uniform_cluster_reduce_scatter_is_the_closed_form() -> None:
    cluster = Cluster.uniform(4, 1e-5, 1e9)
    trace = launch(_reduce_scatter, cluster, 4 * 2**10).trace
    assert trace.makespan == pytest.approx(
        cost.ring_reduce_scatter_time(4, 4 * 4 * 2**10, 1e-5, 1e9), rel=1e-12)


def test_attention_backward_is_counted_too() -> None:
    q = torch.randn(1, 2, 16, 8, dtype=torch.bfloat16, requires_grad=True)
    with FlopCount() as counter:
        F.scaled_dot_product_attention(q, q, q).sum().backward()
    forward = 4 * 1 * 2 * 16 * 16 * 8  # two matmuls of (16 x 8) @ (8 x 16), 2 FLOPs each
    assert counter.by_dtype["bf16"] == pytest.approx(forward * 3.5)  # backward: 2.5x forward
    assert counter.by_dtype.get("fp32", 0) == 0


def test_adds_on_the_comm_stream_are_charged_beside_the_compute_stream() -> None:
    """An overlapped all-reduce's adds run on the comm stream, as NCCL's kernels do: they cost
    their memory traffic and a launch on that lane, while the compute stream goes on."""
    cluster = Cluster.preset(PRESET).with_visible("0,1")
    n = 2**24

    def program(comm):
        x, y = torch.empty(n, device="meta"), torch.empty(n, device="meta")
        work = comm.run_async(lambda: x.add_(y))
        with comm.compute("backward", "layer", seconds=1e-3):
            pass
        work.wait()

    trace = launch(program, cluster).trace
    adds = trace.on(0, "comm", "compute")
    assert len(adds) == 1
    assert adds[0].duration == pytest.approx(cluster.op_seconds(0.0, 3 * 4 * n, "fp32"))
    backward = trace.on(0, "compute", "backward")[0]
    assert adds[0].start < backward.end and backward.start < adds[0].end  # side by side
    assert trace.makespan == pytest.approx(max(backward.end, adds[0].end))
