"""Parameter servers: synchronous and sharded equal single-device training, the server's link
is the bottleneck; asynchronous updates do not wait and pay with staleness."""

from __future__ import annotations

import functools

import pytest
import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import RankError, launch
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.ps import async_ps, sync_ps_step_seconds, train_ps, train_ps_sharded
from mpgpu_edu.replica.reference import train_single

model_fn = functools.partial(make_mlp, [8, 16, 16, 2])
BATCHES = make_batches(3, 10)  # uneven shards over 3 and 4 workers


def assert_matches(result: dict, reference: tuple[dict, list]) -> None:
    ref_params, ref_losses = reference
    for name, ref in ref_params.items():
        torch.testing.assert_close(result["params"][name], ref, rtol=1e-5, atol=1e-6)
    assert result["losses"] == pytest.approx(ref_losses, rel=1e-5)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_sync_matches_single_device(n: int, optimizer: str) -> None:
    reference = train_single(model_fn, BATCHES, optimizer, lr=0.05)
    for result in launch(train_ps, n, model_fn, BATCHES, optimizer).results:
        assert_matches(result, reference)


@pytest.mark.parametrize(("n", "servers", "optimizer"), [(3, 2, "sgd"), (5, 2, "adam"),
                                                         (6, 3, "sgd")])
def test_sharded_matches_single_device(n: int, servers: int, optimizer: str) -> None:
    reference = train_single(model_fn, BATCHES, optimizer, lr=0.05)
    results = launch(train_ps_sharded, n, model_fn, BATCHES, servers, optimizer).results
    for result in results[: n - servers]:  # the workers' replicas
        assert_matches(result, reference)
    shards = torch.cat([r["shard"] for r in results[n - servers:]])  # the servers' shards
    assert torch.allclose(shards, torch.cat([p.reshape(-1) for p in reference[0].values()]),
                          rtol=1e-5, atol=1e-6)


def test_a_parameter_server_needs_a_worker() -> None:
    with pytest.raises(RankError, match="needs at least 2 ranks"):
        launch(train_ps, 1, model_fn, BATCHES)


def test_more_workers_than_samples_is_a_clear_error() -> None:
    with pytest.raises(RankError, match="batch of 3 samples cannot be split over 4 workers"):
        launch(train_ps, 5, model_fn, make_batches(1, 3))


# ---- the server's link ----------------------------------------------------------------------
BIG = functools.partial(make_mlp, [32, 128, 128, 2])  # 84 KB of parameters: bytes dominate
BIG_BYTES = sum(p.numel() * 4 for p in BIG().parameters())
BETA = 1e9


def gradient_recv_busy(trace, device: int) -> float:  # noqa: ANN001
    """Seconds the device spent receiving gradient-sized messages (overlaps merged)."""
    spans = sorted((e.start, e.end) for e in trace.on(device, "comm", "recv")
                   if e.nbytes >= BIG_BYTES // 4)
    total, end = 0.0, float("-inf")
    for s, e in spans:
        total += max(0.0, e - max(s, end))
        end = max(end, e)
    return total


def test_server_receive_time_grows_linearly_with_workers() -> None:
    busy = {}
    for n in (2, 3, 5):
        run = launch(train_ps, Cluster.uniform(n, 1e-5, BETA), BIG, make_batches(1, 24, 32, 2))
        busy[n] = gradient_recv_busy(run.trace, n - 1)
        assert run.bytes_received_per_rank[n - 1] >= (n - 1) * BIG_BYTES
    per_worker = BIG_BYTES / BETA  # the server's one link takes the gradients one at a time
    assert busy[3] - busy[2] == pytest.approx(per_worker, rel=0.01)
    assert busy[5] - busy[2] == pytest.approx(3 * per_worker, rel=0.01)


def test_sharding_spreads_the_load_over_the_servers() -> None:
    batches = make_batches(1, 24, 32, 2)
    one = launch(train_ps, Cluster.uniform(5, 1e-5, BETA), BIG, batches)  # 4 workers
    two = launch(train_ps_sharded, Cluster.uniform(6, 1e-5, BETA), BIG, batches, 2)  # 4 too
    assert max(two.bytes_received_per_rank[4:]) < 0.51 * one.bytes_received_per_rank[4]
    assert two.trace.makespan < 0.6 * one.trace.makespan


# ---- asynchronous ---------------------------------------------------------------------------
ASYNC_BATCHES = make_batches(8, 16)
UNEQUAL = [1e-3, 1e-3, 4e-3]  # two fast workers and a slow one


def test_async_does_not_wait_for_the_slow_worker() -> None:
    cluster = Cluster.uniform(4, 1e-5, BETA)
    result = async_ps(cluster, model_fn, ASYNC_BATCHES, 20, UNEQUAL, staleness_bound=8)
    nbytes = sum(p.numel() * 4 for p in model_fn().parameters())
    sync_step = sync_ps_step_seconds(cluster, UNEQUAL, nbytes)
    assert result.updates_per_second > 1 / sync_step  # steps per second
    assert result.updates_per_second > len(UNEQUAL) / sync_step  # gradients per second
    assert max(result.staleness) > 0
    for fast in (0, 1):  # the fast workers compute almost all the time
        assert result.trace.utilisation(fast) > 0.9
    assert result.trace.on(3, "compute", "optimizer")  # the server's updates are on the trace


def test_ssp_holds_a_fast_worker_and_drops_nothing() -> None:
    cluster = Cluster.uniform(4, 1e-5, BETA)
    result = async_ps(cluster, model_fn, ASYNC_BATCHES, 20, UNEQUAL, staleness_bound=1)
    free = async_ps(cluster, model_fn, ASYNC_BATCHES, 20, UNEQUAL, staleness_bound=10**6)
    assert result.held > 0 and result.held_seconds > 0 and free.held == 0
    counts = [result.workers.count(w) for w in range(3)]
    assert max(counts) - min(counts) <= 2  # nobody more than bound + 1 gradients ahead
    assert free.workers.count(0) > 2 * free.workers.count(2)  # unbounded: the fast run ahead
    assert len(result.losses) == 20  # every gradient computed is applied
    assert max(result.staleness) < max(free.staleness)
    assert result.trace.utilisation(0) < 0.8 < free.trace.utilisation(0)  # held: it idles


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_ssp_program_on_recv_any_applies_every_gradient_within_the_bound(bound: int) -> None:
    from mpgpu_edu.ps import ssp_program

    speeds = [1e-3, 1.5e-3, 3e-3]
    runs = [launch(ssp_program, Cluster.uniform(4, 1e-5, BETA), speeds, 8, 5, bound)
            for _ in range(2)]
    log = runs[0].results[-1]
    assert log["workers"] == runs[1].results[-1]["workers"]  # deterministic
    clock = [0, 0, 0]
    for w in log["workers"]:
        clock[w] += 1
        # a gradient is computed only once its worker was within the bound
        assert clock[w] - 1 - min(clock) <= bound + 1
    assert clock == [5, 5, 5]
    assert (log["held"] > 0) == (bound < 4)
    assert sum(log["held_by"]) == log["held"]  # per worker, and the slowest is never held
    assert log["held_by"][2] == 0 and (log["held_by"][0] > 0) == (bound < 4)
    # gradient k of worker w is 0.5 |p - w|^2's: the server applied all 15 of them
    assert torch.isfinite(log["params"]).all()


def test_ssp_program_charges_the_server_for_every_update() -> None:
    from mpgpu_edu.ps import ssp_program

    speeds, cluster = [1e-3, 3e-3], Cluster.uniform(3, 1e-5, BETA)
    given = launch(ssp_program, cluster, speeds, 8, 4, 1, 0.1, 50e-6).trace
    updates = given.on(2, "compute", "optimizer")
    assert len(updates) == 8 and all(e.duration == pytest.approx(50e-6) for e in updates)
    assert given.busy(2) == pytest.approx(8 * 50e-6)
    a100 = Cluster.preset("8xA100-nvlink").with_visible("0,1,2")
    measured = launch(ssp_program, a100, speeds, 8, 4, 1).trace  # timed by the simulator
    assert len(measured.on(2, "compute", "optimizer")) == 8
    assert measured.busy(2) >= 8 * a100.launch_overhead_s > 0  # a kernel each, at least


def test_async_is_deterministic() -> None:
    cluster = Cluster.uniform(4, 1e-5, BETA)
    a, b = (async_ps(cluster, model_fn, ASYNC_BATCHES, 10, UNEQUAL) for _ in range(2))
    assert (a.losses, a.staleness, a.workers, a.seconds) == (b.losses, b.staleness,
                                                             b.workers, b.seconds)


def test_loss_decreases_with_small_staleness_and_suffers_with_large() -> None:
    def final_loss(n_workers: int) -> tuple[float, list[int], list[float]]:
        cluster = Cluster.uniform(n_workers + 1, 1e-5, BETA)
        result = async_ps(cluster, model_fn, ASYNC_BATCHES, 40, [1e-3] * n_workers,
                          staleness_bound=100, lr=0.2)
        return sum(result.losses[-5:]) / 5, result.staleness, result.losses

    small, small_staleness, losses = final_loss(2)
    large, large_staleness, _ = final_loss(8)
    assert max(small_staleness) == 1 and max(large_staleness) == 7
    assert small < 0.6 * losses[0]  # still learns
    assert large > 2 * small  # stale gradients hurt


def test_async_needs_a_worker_and_one_time_per_worker() -> None:
    with pytest.raises(ValueError, match="at least 2 devices"):
        async_ps(Cluster.uniform(1, 1e-5, BETA), model_fn, ASYNC_BATCHES, 5)
    with pytest.raises(ValueError, match="one time per worker"):
        async_ps(Cluster.uniform(3, 1e-5, BETA), model_fn, ASYNC_BATCHES, 5, [1e-3])


# ---- gloo ---------------------------------------------------------------------------------
@pytest.mark.gloo
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_sync_matches_single_device_on_gloo(optimizer: str) -> None:
    run = launch(train_ps, 3, model_fn, BATCHES, optimizer, backend="gloo", timeout=120)
    reference = train_single(model_fn, BATCHES, optimizer, lr=0.05)
    for result in run.results:
        assert_matches(result, reference)
