"""Tensor parallelism: each split layer equals its unsplit layer, forward and backward."""

from __future__ import annotations

import pipeline_fns
import pytest
import torch
from torch import nn

from mpgpu_edu.comm import launch
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.tensor import (ColumnParallelConv2d, ColumnParallelLinear, ParallelMLP,
                              RowParallelLinear, copy_to_parallel, gather_from_parallel,
                              megatron_mlp, reduce_from_parallel, scatter_to_parallel,
                              shard_sizes)
from mpgpu_edu.tensor.runner import run_demo, train_tensor_parallel

torch.manual_seed(0)
CASES = {  # kind: (the unsplit layer, an input)
    "column": (nn.Linear(6, 10), torch.randn(4, 6)),
    "row": (nn.Linear(10, 5), torch.randn(4, 10)),
    "mlp": (make_mlp([6, 12, 5], seed=1), torch.randn(4, 6)),
    "naive_mlp": (make_mlp([6, 12, 5], seed=1), torch.randn(4, 6)),
    "conv": (nn.Conv2d(3, 64, 3, padding=1), torch.randn(2, 3, 6, 6)),  # the seed's 64
}
# Which dim of each parameter is split (None: every rank holds it whole).
SPLIT = {"column": {"weight": 0, "bias": 0}, "row": {"weight": 1, "bias": None},
         "mlp": {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1, "fc2.bias": None},
         "naive_mlp": {"0.weight": 0, "0.bias": 0, "2.weight": 1, "2.bias": None},
         "conv": {"weight": 0, "bias": 0}}
UNSPLIT_NAME = {"fc1.weight": "0.weight", "fc1.bias": "0.bias", "fc2.weight": "2.weight",
                "fc2.bias": "2.bias"}


def expected(kind: str):
    full, x = CASES[kind]
    full.zero_grad()
    x = x.clone().requires_grad_()
    y = full(x)
    weights = torch.linspace(-1, 1, y.numel()).view_as(y)
    (y * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in full.named_parameters()}
    return y.detach(), x.grad, grads, weights


def check(kind: str, results: list, world_size: int) -> None:
    y, x_grad, grads, _ = expected(kind)
    for rank, got in enumerate(results):
        torch.testing.assert_close(got["y"], y, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["x_grad"], x_grad, rtol=1e-5, atol=1e-5)
        for name, grad in got["grads"].items():
            full_grad = grads[UNSPLIT_NAME.get(name, name)]
            dim = SPLIT[kind][name]
            want = full_grad if dim is None else torch.tensor_split(full_grad, world_size,
                                                                    dim)[rank]
            torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", list(CASES))
def test_split_layer_equals_unsplit_layer(kind, world_size):
    """N=3 splits 10, 12 and 64 features unevenly: tensor_split sizes, padded all-gathers."""
    full, x = CASES[kind]
    weights = expected(kind)[3]
    result = launch(pipeline_fns.layer_forward_backward, world_size, kind, full, x, weights)
    check(kind, result.results, world_size)


def test_seed_example_64_channels_are_4_devices_x_16():
    full, x = CASES["conv"]

    def shapes(comm):
        layer = ColumnParallelConv2d.from_conv(comm, full)
        return tuple(layer.weight.shape), tuple(layer(x).shape)

    result = launch(shapes, 4)
    assert result.results == [((16, 3, 3, 3), (2, 64, 6, 6))] * 4
    # forward: each rank receives the other ranks' 3 x 16 channels (an all-gather)
    channel_bytes = 2 * 16 * 6 * 6 * 4
    assert result.bytes_received_per_rank == [3 * channel_bytes] * 4


def test_parallel_mlp_moves_less_than_the_naive_split():
    """Column then row: one all-reduce of the output forward, one of the input's gradient
    backward. The naive split also all-gathers the hidden layer both ways."""
    full, x = CASES["mlp"]
    weights = expected("mlp")[3]
    megatron = launch(pipeline_fns.layer_forward_backward, 4, "mlp", full, x, weights)
    naive = launch(pipeline_fns.layer_forward_backward, 4, "naive_mlp", full, x, weights)
    n = 4
    ring = 2 * (n - 1) / n  # of the tensor, per rank, for a ring all-reduce
    expected_bytes = ring * (4 * 5 * 4) + ring * (4 * 6 * 4)  # output fwd, input grad bwd
    assert megatron.bytes_sent_per_rank == [pytest.approx(expected_bytes)] * n
    assert all(a < b for a, b in zip(megatron.bytes_sent_per_rank, naive.bytes_sent_per_rank))


def test_f_and_g_are_each_others_transpose():
    """f: identity forward, all-reduce backward. g: all-reduce forward, identity backward."""
    def prog(comm):
        x = torch.full((3,), float(comm.rank + 1), requires_grad=True)
        f_out = copy_to_parallel(x, comm)
        (f_out * (comm.rank + 1)).sum().backward()
        f_grad = x.grad.clone()
        x.grad = None
        g_out = reduce_from_parallel(x, comm)
        (g_out * (comm.rank + 1)).sum().backward()
        return f_out.detach(), f_grad, g_out.detach(), x.grad

    for rank, (f_out, f_grad, g_out, g_grad) in enumerate(launch(prog, 3).results):
        assert torch.equal(f_out, torch.full((3,), float(rank + 1)))
        assert torch.equal(f_grad, torch.full((3,), 6.0))  # 1 + 2 + 3
        assert torch.equal(g_out, torch.full((3,), 6.0))
        assert torch.equal(g_grad, torch.full((3,), float(rank + 1)))


@pytest.mark.parametrize(("world_size", "hidden"), [(1, 8), (2, 8), (4, 8), (4, 7), (4, 3),
                                                    (5, 12)])
def test_megatron_mlp_equals_the_unsplit_block(world_size, hidden):
    """Forward, x's gradient on every rank, each rank's shards of the weight gradients, b2's
    whole gradient; any hidden size (tensor_split shards, even an empty one); one all-reduce
    of the output forward and one of x's gradient backward (2(N-1) x S bytes in all each)."""
    g = torch.Generator().manual_seed(world_size * 100 + hidden)
    x, dy = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 4, generator=g)
    params = {"w1": torch.randn(hidden, 5, generator=g), "b1": torch.randn(hidden, generator=g),
              "w2": torch.randn(4, hidden, generator=g), "b2": torch.randn(4, generator=g)}
    split_dim = {"w1": 0, "b1": 0, "w2": 1, "b2": None}
    full = {k: v.clone().requires_grad_() for k, v in params.items()}
    x_full = x.clone().requires_grad_()
    want = nn.functional.linear(nn.functional.gelu(nn.functional.linear(
        x_full, full["w1"], full["b1"])), full["w2"], full["b2"])
    want.backward(dy)

    def prog(comm):
        mine = {k: (v if split_dim[k] is None else torch.tensor_split(v, comm.world_size,
                                                                      split_dim[k])[comm.rank])
                .clone().requires_grad_() for k, v in params.items()}
        x_mine = x.clone().requires_grad_()
        out = megatron_mlp(comm, x_mine, mine["w1"], mine["b1"], mine["w2"], mine["b2"])
        forward_sent = comm.stats.bytes_sent
        out.backward(dy)
        return (out.detach(), x_mine.grad, {k: v.grad for k, v in mine.items()},
                forward_sent, comm.stats.bytes_sent - forward_sent)

    results = launch(prog, world_size).results
    for rank, (out, x_grad, grads, _, _) in enumerate(results):
        torch.testing.assert_close(out, want.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x_grad, x_full.grad, rtol=1e-5, atol=1e-5)
        for k, grad in grads.items():
            whole = full[k].grad
            torch.testing.assert_close(grad, whole if split_dim[k] is None else torch.tensor_split(
                whole, world_size, split_dim[k])[rank], rtol=1e-5, atol=1e-5)
    assert sum(r[3] for r in results) == 2 * (world_size - 1) * dy.numel() * 4
    assert sum(r[4] for r in results) == 2 * (world_size - 1) * x.numel() * 4


def test_scatter_then_gather_is_the_identity_for_uneven_slices():
    x = torch.arange(14.0).view(2, 7)

    def prog(comm):
        mine = scatter_to_parallel(x, comm, dim=1)
        return mine, gather_from_parallel(mine, comm, 1, shard_sizes(7, comm.world_size))

    results = launch(prog, 3).results
    assert [tuple(m.shape) for m, _ in results] == [(2, 3), (2, 2), (2, 2)]
    assert all(torch.equal(back, x) for _, back in results)


def test_uneven_shards_follow_tensor_split():
    def prog(comm):
        return (tuple(ColumnParallelLinear(comm, 4, 6).weight.shape),
                tuple(RowParallelLinear(comm, 6, 4).weight.shape))

    assert launch(prog, 4).results == [((2, 4), (4, 2)), ((2, 4), (4, 2)),
                                       ((1, 4), (4, 1)), ((1, 4), (4, 1))]
    assert shard_sizes(6, 4) == [2, 2, 1, 1]


def test_training_equals_single_device():
    report = run_demo("sim", 4, 3, "sgd")
    assert report["strategy"] == "tp" and len(report["losses"]) == 3
    assert report["losses"] == pytest.approx(report["reference_losses"], rel=1e-5)
    assert report["max_abs_param_diff"] < 1e-6


@pytest.mark.parametrize("world_size", [1, 3])
def test_adam_training_equals_single_device(world_size):
    report = run_demo("sim", world_size, 2, "adam")
    assert report["losses"] == pytest.approx(report["reference_losses"], rel=1e-5)
    assert report["max_abs_param_diff"] < 1e-5


def test_train_records_memory_by_category():
    mlp, data = make_mlp([8, 64, 2]), make_batches(2, 16, 8, 2)
    trace = launch(train_tensor_parallel, 4, mlp, data).trace
    times, series = trace.memory_timeline(0)
    sharded = (64 * 8 + 64) // 4 + (2 * 64) // 4 + 2  # fc1 rows, fc2 columns, fc2's bias
    assert series["parameters"][-1] == 4 * sharded


@pytest.mark.parametrize("make, message", [
    (lambda comm: ColumnParallelConv2d.from_conv(comm, nn.Conv2d(4, 8, 3, groups=2)),
     "groups=1"),
    (lambda comm: ParallelMLP.from_mlp(comm, nn.Sequential(nn.Linear(2, 2))),
     "Linear, activation, Linear"),
])
def test_unsupported_layers_are_refused(make, message):
    with pytest.raises(Exception, match=message):
        launch(make, 1)


@pytest.mark.parametrize("kwargs, message", [
    ({"world_size": 65}, "cannot split 64 hidden features over 65 ranks"),
    ({"sizes": (8, 2)}, "give three sizes"),
    ({"steps": 0}, "at least 1"),
])
def test_run_demo_bad_input(kwargs, message):
    args = {"backend": "sim", "world_size": 2, "steps": 1, "optimizer": "sgd", **kwargs}
    with pytest.raises(ValueError, match=message):
        run_demo(**args)


@pytest.mark.gloo
def test_gloo_split_layers_equal_unsplit_layers():
    cases = [(kind, *CASES[kind], expected(kind)[3]) for kind in CASES]
    result = launch(pipeline_fns.layer_checks, 2, cases, backend="gloo", timeout=60)
    for i, kind in enumerate(CASES):
        check(kind, [r[i] for r in result.results], 2)
