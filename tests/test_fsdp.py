"""ZeRO-3 / FSDP from scratch: equal to one device, 1/N of the parameters per rank, the
collectives it promises, and prefetch that hides the gathers; on the simulator and on gloo."""

from __future__ import annotations

import pytest
import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import launch
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.dp.fsdp import flat_shard, train_fsdp, wrap_fsdp
from mpgpu_edu.replica.reference import train_single

SIZES = (8, 32, 32, 3)  # 5 layers: Linear, ReLU, Linear, ReLU, Linear (32*8+32 = 288, ...)
BATCHES = make_batches(3, 10, SIZES[0], SIZES[-1], seed=3)


def model_fn():
    return make_mlp(SIZES, seed=0)


def assert_matches(results, optimizer: str, steps: int | None = None) -> None:
    ref_params, ref_losses = train_single(model_fn, BATCHES, optimizer, 0.05, steps)
    for result in results:  # every rank gathers the same full parameters
        for name, expected in ref_params.items():
            torch.testing.assert_close(result["state"][name], expected, rtol=1e-5, atol=1e-6)
    losses = [sum(step) for step in zip(*(r["losses"] for r in results))]
    assert losses == pytest.approx(ref_losses, rel=1e-5)


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_equals_single_device(world_size: int, prefetch: bool, optimizer: str) -> None:
    """3 and 5 ranks: neither the 10 samples nor the layers' sizes divide evenly (padding)."""
    run = launch(train_fsdp, world_size, model_fn(), BATCHES, optimizer, 0.05, prefetch)
    assert_matches(run.results, optimizer)


def test_flat_shards_cover_the_layer_once() -> None:
    params = [torch.arange(7.0).view(7, 1), torch.arange(7.0, 10.0)]  # 10 elements
    shards = [flat_shard(params, r, 3) for r in range(3)]
    assert [s.numel() for s in shards] == [4, 4, 4]  # padded to 12
    assert torch.equal(torch.cat(shards)[:10], torch.arange(10.0))
    assert torch.equal(torch.cat(shards)[10:], torch.zeros(2))


def _shapes(comm, model):
    replica = wrap_fsdp(comm, model)
    return [tuple(p.shape) for p in replica.parameters()]


def test_each_rank_holds_one_nth() -> None:
    run = launch(_shapes, 4, model_fn())
    layer_sizes = [8 * 32 + 32, 32 * 32 + 32, 32 * 3 + 3]
    expected = [(-(-n // 4),) for n in layer_sizes]
    assert all(shapes == expected for shapes in run.results)
    assert model_fn().state_dict()["0.weight"].shape == (32, 8)  # the module is untouched


def category_peak(trace, device: int, category: str) -> int:
    return max(trace.memory_timeline(device)[1][category], default=0)


def _one_step(comm, model, batches, prefetch):
    return train_fsdp(comm, model, batches, "sgd", 0.05, prefetch, steps=1)["losses"]


def _run_step(prefetch: bool, world_size: int = 4):
    cluster = Cluster.preset("8xA100-nvlink", visible=",".join(map(str, range(world_size))))
    model = make_mlp((256, 1024, 1024, 1024, 256), seed=0)
    batches = make_batches(1, 64, 256, 256, seed=1)
    return launch(_one_step, cluster, model, batches, prefetch)


def test_three_collectives_per_layer_and_their_bytes() -> None:
    """Per step and layer: all-gather in forward, all-gather in backward, reduce-scatter:
    each rank sends 3 (N-1)/N of the layer's (padded) bytes on a ring, plus full_state's
    final all-gather (one more (N-1)/N)."""
    n = 4
    run = _run_step(False, n)
    layers = [256 * 1024 + 1024, 1024 * 1024 + 1024, 1024 * 1024 + 1024, 1024 * 256 + 256]
    padded = sum(-(-e // n) * n for e in layers) * 4
    for stats in run.stats:
        assert stats.bytes_sent == pytest.approx(4 * (n - 1) / n * padded, rel=1e-9)


def test_prefetch_hides_the_gathers_and_holds_one_more_layer() -> None:
    plain, ahead = _run_step(False), _run_step(True)
    assert ahead.trace.makespan < plain.trace.makespan
    peak_plain = max(category_peak(plain.trace, d, "comm_buffers") for d in range(4))
    peak_ahead = max(category_peak(ahead.trace, d, "comm_buffers") for d in range(4))
    assert peak_ahead > peak_plain  # two gathered layers at once instead of one


def _phase_end(trace, kind: str) -> float:
    return max(e.end for e in trace.events if e.kind == kind)


def test_prefetch_hides_the_gathers_in_forward_too() -> None:
    """A ReLU between the Linear layers has nothing to gather: forward prefetch looks past it
    to the next layer with parameters, so forward ends sooner, not only backward."""
    plain, ahead = _run_step(False), _run_step(True)
    assert _phase_end(ahead.trace, "forward") < 0.9 * _phase_end(plain.trace, "forward")
    plain_start, ahead_start = (min(e.start for e in run.trace.events if e.device == 0
                                    and e.kind == "forward" and e.label == "layer 2")
                                for run in (plain, ahead))
    assert ahead_start < plain_start  # layer 2's gather ran while layer 0 computed


def test_memory_per_rank_is_the_shards_and_one_layer() -> None:
    """Parameters recorded per rank are 1/N of the model (plus padding); the gathered full
    parameters never exceed the largest layer without prefetch."""
    run = _run_step(False)
    model_bytes = sum(p.numel() for p in make_mlp((256, 1024, 1024, 1024, 256)).parameters()) * 4
    largest = (1024 * 1024 + 1024) * 4
    for d in range(4):
        params = category_peak(run.trace, d, "parameters")
        assert params == pytest.approx(model_bytes / 4, rel=1e-3)
        assert 0 < category_peak(run.trace, d, "comm_buffers") <= largest


@pytest.mark.gloo
@pytest.mark.parametrize("prefetch", [False, True])
def test_equals_single_device_on_gloo(prefetch: bool) -> None:
    run = launch(train_fsdp, 3, model_fn(), BATCHES, "adam", 0.05, prefetch, backend="gloo",
                 timeout=120)
    assert_matches(run.results, "adam")
