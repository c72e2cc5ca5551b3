"""The simulated ``nn.DataParallel``: same training as one device, and device 0 pays for it."""

from __future__ import annotations

import functools

import pytest
import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import launch
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.dp.dataparallel import train_dataparallel
from mpgpu_edu.replica.reference import train_single

model_fn = functools.partial(make_mlp, [8, 16, 16, 2])
BATCHES = make_batches(3, 10)


def cluster(n: int) -> Cluster:
    return Cluster.preset("4xRTX4090-pcie", visible=",".join(str(d) for d in range(n)))


@pytest.mark.parametrize(("n", "optimizer"), [(1, "sgd"), (2, "adam"), (3, "sgd"),
                                              (4, "adam")])
def test_matches_single_device(n: int, optimizer: str) -> None:
    ref_params, ref_losses = train_single(model_fn, BATCHES, optimizer, lr=0.05)
    result = launch(train_dataparallel, cluster(n), model_fn, BATCHES, optimizer).results[0]
    for name, ref in ref_params.items():
        torch.testing.assert_close(result["params"][name], ref, rtol=1e-5, atol=1e-6)
    assert result["losses"] == pytest.approx(ref_losses, rel=1e-5)


def test_device_0_is_busier_and_fuller_than_the_others() -> None:
    run = launch(train_dataparallel, cluster(4), model_fn, BATCHES, "adam")
    trace = run.trace
    others = range(1, 4)
    # Device 0 sends every shard, every replica and every output gradient, and receives
    # every output and every gradient: its link is busy while the others' mostly wait.
    assert trace.busy(0, "comm") > 2 * max(trace.busy(d, "comm") for d in others)
    # It alone holds the optimizer state and the gathered outputs.
    assert trace.peak_memory(0) > max(trace.peak_memory(d) for d in others)
    peak = trace.peak_memory_by_category(0)
    assert peak["optimizer"] > 0
    assert all(trace.peak_memory_by_category(d)["optimizer"] == 0 for d in others)


def test_every_message_starts_or_ends_at_device_0() -> None:
    """A star around device 0: it sends what all others receive and receives what all
    others send, N - 1 times the traffic of any other device."""
    run = launch(train_dataparallel, cluster(4), model_fn, BATCHES[:1])
    assert all(0 in link for link in run.bytes_per_link())
    sent, received = run.bytes_sent_per_rank, run.bytes_received_per_rank
    assert sent[0] == sum(received[1:]) and received[0] == sum(sent[1:])
    traffic = [s + r for s, r in zip(sent, received)]
    assert traffic[0] > 2.9 * max(traffic[1:])
