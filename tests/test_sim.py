"""The simulated communicator: semantics, determinism, deadlocks, faults, timing."""

from __future__ import annotations

import time

import pytest
import torch

from mpgpu_edu.cluster import Cluster, Route, SimulatedOutOfMemoryError, Topology
from mpgpu_edu.comm import (DeadlockError, LaunchTimeoutError, MessageMismatchError, RankError,
                            UnmatchedMessageError, launch)
from mpgpu_edu.cluster.hardware import GPUS

ALPHA, BETA = 1e-5, 1e9


def uniform(n: int) -> Cluster:
    return Cluster.uniform(n, alpha_s=ALPHA, beta_Bps=BETA)


def ring_shift(comm, n: int) -> torch.Tensor:
    """Each rank passes its tensor to the right, with isend so that nobody deadlocks."""
    mine = torch.full((n,), float(comm.rank))
    got = torch.empty(n)
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    work = comm.isend(mine, right)
    comm.recv(got, left)
    work.wait()
    return got


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_ring_shift_moves_data_and_costs_one_message(world_size):
    result = launch(ring_shift, uniform(world_size), 250)
    for rank, got in enumerate(result.results):
        assert torch.equal(got, torch.full((250,), float((rank - 1) % world_size)))
    assert result.bytes_sent_per_rank == [1000] * world_size
    assert result.bytes_received_per_rank == [1000] * world_size
    assert result.trace.makespan == pytest.approx(ALPHA + 1000 / BETA, rel=1e-12)


def test_world_size_one_runs_without_messages():
    result = launch(lambda comm: comm.rank * 10 + comm.world_size, uniform(1))
    assert result.results == [1]
    assert result.trace.makespan == 0.0


def test_blocking_send_recv_pair_and_tags_match_in_order():
    def prog(comm):
        if comm.rank == 0:
            comm.send(torch.tensor([1.0]), 1, tag=7)
            comm.send(torch.tensor([2.0]), 1, tag=3)
            return None
        a, b = torch.empty(1), torch.empty(1)
        comm.recv(a, 0, tag=7)
        comm.recv(b, 0, tag=3)
        return a.item(), b.item()

    assert launch(prog, uniform(2)).results[1] == (1.0, 2.0)


def test_recv_in_other_tag_order_is_a_deadlock_with_sync_sends():
    def prog(comm):
        if comm.rank == 0:
            comm.send(torch.tensor([1.0]), 1, tag=7)
            comm.send(torch.tensor([2.0]), 1, tag=3)
        else:
            comm.recv(torch.empty(1), 0, tag=3)
            comm.recv(torch.empty(1), 0, tag=7)

    with pytest.raises(DeadlockError, match="tag 7"):
        launch(prog, uniform(2))


def test_determinism_ten_runs_identical_traces():
    def prog(comm):
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(comm.rank))
        layer = torch.nn.Linear(64, 64)
        with comm.compute("forward", "fwd"), torch.no_grad():
            y = layer(x)
        for step in range(3):
            got = ring_shift(comm, 100 * (step + 1))
        comm.barrier()
        return float(y.sum()) + float(got.sum())

    first = launch(prog, Cluster.preset("4xRTX4090-pcie")).trace.to_dict()
    for _ in range(9):
        assert launch(prog, Cluster.preset("4xRTX4090-pcie")).trace.to_dict() == first


def both_send(comm):
    comm.send(torch.zeros(4), 1 - comm.rank)
    comm.recv(torch.zeros(4), 1 - comm.rank)


def recv_from_silent(comm):
    if comm.rank == 1:
        comm.recv(torch.zeros(2), 0)


def ring_blocking(comm):
    n = comm.world_size
    comm.send(torch.zeros(3), (comm.rank + 1) % n)
    comm.recv(torch.zeros(3), (comm.rank - 1) % n)


def wait_on_never_matched_irecv(comm):
    work = comm.irecv(torch.zeros(1), (comm.rank + 1) % comm.world_size, tag=5)
    work.wait()


def stream_job_waits_forever(comm):
    job = comm.run_async(lambda: comm.recv(torch.zeros(1), 1 - comm.rank, tag=9))
    job.wait()


@pytest.mark.parametrize("prog, world_size, expect", [
    (both_send, 2, "rank 0: send to rank 1"),
    (recv_from_silent, 2, "rank 1: recv from rank 0"),
    (ring_blocking, 3, "rank 2: send to rank 0"),
    (ring_blocking, 5, "rank 4: send to rank 0"),
    (wait_on_never_matched_irecv, 3, "waiting for its recv from rank 1, tag 5"),
    (stream_job_waits_forever, 2, "comm stream"),
])
def test_every_deadlock_shape_is_caught_without_a_timeout(prog, world_size, expect):
    # A DeadlockError, not a LaunchTimeoutError: the simulator sees that every rank is
    # blocked; how fast it says so is a benchmark's business, not a test's.
    with pytest.raises(DeadlockError) as info:
        launch(prog, uniform(world_size), timeout=30)
    assert expect in str(info.value)
    assert "every rank is blocked" in str(info.value)


def test_a_deadlock_lists_every_message_posted_and_never_matched():
    """A receive tagged by the wrong side shows at once: the unmatched irecv is listed beside
    the send each rank blocks in."""
    def prog(comm):
        other = 1 - comm.rank
        got = comm.irecv(torch.zeros(4), other, tag=comm.rank)  # should be the sender's tag
        comm.send(torch.zeros(4), other, tag=comm.rank)
        got.wait()

    with pytest.raises(DeadlockError) as info:
        launch(prog, uniform(2), timeout=30)
    text = str(info.value)
    listed = text.split("Posted and never matched:\n", 1)[1].splitlines()
    assert listed[0] == "  rank 0: recv from rank 1, tag 0, 16 bytes (float32 [4])"
    assert listed[1] == "  rank 1: recv from rank 0, tag 1, 16 bytes (float32 [4])"
    with pytest.raises(DeadlockError) as info:  # only the blocking sends: nothing to add
        launch(both_send, uniform(2), timeout=30)
    assert "Posted and never matched" not in str(info.value)


def test_mismatched_shapes_name_both_ranks():
    def prog(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(4), 1)
        else:
            comm.recv(torch.zeros(5), 0)

    with pytest.raises(MessageMismatchError, match=r"rank 0 sends float32 \[4\].*rank 1"):
        launch(prog, uniform(2))


def test_mismatched_dtype_is_caught():
    def prog(comm):
        t = torch.zeros(4, dtype=torch.float64 if comm.rank else torch.float32)
        comm.send(t, 1) if comm.rank == 0 else comm.recv(t, 0)

    with pytest.raises(MessageMismatchError, match="float64"):
        launch(prog, uniform(2))


def test_exception_in_one_rank_stops_all_and_keeps_its_traceback():
    def prog(comm):
        if comm.rank == 2:
            raise KeyError("the bad key")
        comm.recv(torch.zeros(1), 2)

    with pytest.raises(RankError) as info:
        launch(prog, uniform(3))
    assert info.value.rank == 2
    assert isinstance(info.value.original, KeyError)
    assert "the bad key" in str(info.value) and "Traceback" in str(info.value)


def test_rank_that_swallows_exceptions_is_still_stopped():
    def prog(comm):
        if comm.rank == 0:
            raise ValueError("boom")
        try:
            comm.recv(torch.zeros(1), 0)
        except Exception:  # a learner's broad except must not hide the stop
            return "swallowed"

    with pytest.raises(RankError, match="boom"):
        launch(prog, uniform(2))


def test_endless_rank_is_stopped_by_the_timeout():
    def prog(comm):
        if comm.rank == 0:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            comm.recv(torch.zeros(1), 0)

    with pytest.raises(LaunchTimeoutError, match="rank 1: recv from rank 0"):
        launch(prog, uniform(2), timeout=0.5)


def test_unreceived_message_is_reported():
    def prog(comm):
        if comm.rank == 0:
            comm.isend(torch.zeros(1), 1)

    with pytest.raises(UnmatchedMessageError, match="rank 0: send to rank 1"):
        launch(prog, uniform(2))


def test_bad_peer_names_the_valid_ranks():
    with pytest.raises(RankError, match="ranks 0..1"):
        launch(lambda comm: comm.send(torch.zeros(1), 5), uniform(2))


def test_meta_tensors_cost_time_but_hold_no_data():
    size = 2**30  # 1 GiB of fp32 on 8 ranks, for free

    def prog(comm):
        return ring_shift_meta(comm, size // 4)

    result = launch(prog, uniform(8))
    assert result.results[0].is_meta
    assert result.bytes_sent_per_rank == [size] * 8
    assert result.trace.makespan == pytest.approx(ALPHA + size / BETA, rel=1e-12)


def ring_shift_meta(comm, n: int) -> torch.Tensor:
    mine, got = torch.empty(n, device="meta"), torch.empty(n, device="meta")
    work = comm.isend(mine, (comm.rank + 1) % comm.world_size)
    comm.recv(got, (comm.rank - 1) % comm.world_size)
    work.wait()
    return got


def test_compute_region_counts_flops_and_explicit_seconds():
    def prog(comm):
        a, b = torch.randn(64, 128), torch.randn(128, 32)
        with comm.compute("forward", "matmul"):
            a @ b
        with comm.compute("optimizer", "step", seconds=2e-3):
            pass

    cluster = uniform(1)
    trace = launch(prog, cluster).trace
    fwd, opt = trace.on(0, "compute")
    assert fwd.flops == 2 * 64 * 128 * 32
    assert fwd.duration == pytest.approx(cluster.compute_seconds(fwd.flops))
    assert (opt.kind, opt.start, opt.duration) == ("optimizer", fwd.end, pytest.approx(2e-3))


def test_async_job_overlaps_compute():
    """A job on the comm stream runs while the host computes: the makespan is the max, not
    the sum, of the two."""
    nbytes = 4_000_000

    def prog(comm):
        buf = torch.zeros(nbytes // 4)
        peer = 1 - comm.rank
        job = comm.run_async(lambda: comm.send(buf, peer) if comm.rank == 0
                             else comm.recv(buf, peer))
        with comm.compute("backward", seconds=1e-3):
            pass
        job.wait()

    trace = launch(prog, uniform(2)).trace
    transfer = ALPHA + nbytes / BETA
    assert transfer > 1e-3
    assert trace.makespan == pytest.approx(transfer, rel=1e-12)
    assert trace.on(0, "comm")[0].start == 0.0


def test_message_posted_inside_a_region_splits_it():
    """A send posted from the middle of a compute region (as a backward hook does) starts
    when the compute before it is done, not at the end of the region."""
    def prog(comm):
        a = torch.randn(256, 256)
        with comm.compute("backward"):
            a @ a
            job = comm.run_async(lambda: comm.send(torch.zeros(10), 1) if comm.rank == 0
                                 else comm.recv(torch.zeros(10), 0))
            a @ a
        job.wait()

    trace = launch(prog, uniform(2)).trace
    first, second = trace.on(0, "compute")
    send = trace.on(0, "comm")[0]
    assert send.start == pytest.approx(first.end)
    assert send.start < second.end


def test_group_renumbers_ranks():
    def prog(comm):
        evens = [r for r in range(comm.world_size) if r % 2 == 0]
        odds = [r for r in range(comm.world_size) if r % 2 == 1]
        sub = comm.group(evens if comm.rank % 2 == 0 else odds)
        got = ring_shift(sub, 1) if sub.world_size > 1 else torch.tensor([-1.0])
        return sub.rank, sub.world_size, int(got.item())

    results = launch(prog, uniform(5)).results
    assert results == [(0, 3, 2), (0, 2, 1), (1, 3, 0), (1, 2, 0), (2, 3, 1)]


def test_barrier_costs_log2_rounds_of_alpha():
    result = launch(lambda comm: comm.barrier(), uniform(5))
    assert result.trace.makespan == pytest.approx(3 * ALPHA, rel=1e-12)


def test_memory_records_become_timed_memory_events():
    def prog(comm):
        params = comm.memory.alloc("parameters", 1000, "weights")
        with comm.compute("forward", seconds=1e-3):
            pass
        act = comm.memory.alloc("activations", 500, "saved")
        comm.memory.free(act)
        comm.memory.free(params)

    trace = launch(prog, uniform(1)).trace
    assert [(m.time, m.delta, m.total) for m in trace.memory] == [
        (0.0, 1000, 1000), (1e-3, 500, 1500), (1e-3, -500, 1000), (1e-3, -1000, 0)]
    assert trace.peak_memory(0) == 1500


def test_simulated_oom_names_device_and_breakdown():
    cluster = Cluster.preset("4xRTX4090-pcie")

    def prog(comm):
        comm.memory.alloc("parameters", 20 * 2**30, "weights")
        comm.memory.alloc("optimizer", 8 * 2**30, "adam")

    with pytest.raises(RankError) as info:
        launch(prog, cluster)
    assert isinstance(info.value.original, SimulatedOutOfMemoryError)
    assert "out of memory" in str(info.value) and "parameters" in str(info.value)


def test_logs_carry_simulated_time():
    def prog(comm):
        with comm.compute("forward", seconds=1e-3):
            pass
        comm.log(f"hello from {comm.rank}")

    logs = launch(prog, uniform(2)).logs
    assert logs[1] == ["[    1.0000 ms] hello from 1"]


def test_retime_on_another_cluster():
    result = launch(ring_shift, uniform(4), 250)
    slow = result.retime(Cluster.uniform(4, alpha_s=ALPHA, beta_Bps=BETA / 10))
    assert slow.makespan == pytest.approx(ALPHA + 10000 / BETA, rel=1e-12)


def test_shared_pcie_switch_slows_concurrent_transfers():
    result = launch(ring_shift, "4xRTX4090-pcie-switch", 2**20)
    route = result.cluster.route(0, 1)
    one = route.alpha_s + 4 * 2**20 / route.beta_Bps
    assert result.trace.makespan > 2 * one  # four transfers share one switch uplink


def _one_cap(cap_Bps: float) -> Cluster:
    """Three devices whose transfers all share one cap; each link alone is faster."""
    def route_of(s: int, d: int) -> Route:
        return Route(0.0, 10 * cap_Bps, (), (("cap", cap_Bps),))

    topology = Topology("one-cap", 3, route_of, [], {"all": (0, 1, 2)})
    return Cluster("one-cap", GPUS["H100-SXM-80GB"], topology, efficiency=1.0,
                   launch_overhead_s=0.0)


def _late_second_sender(comm, nbytes):
    t = torch.empty(nbytes // 4, device="meta")
    if comm.rank == 0:
        comm.send(t, 2)
    elif comm.rank == 1:
        with comm.compute("wait", seconds=0.5):
            pass
        comm.send(t, 2)
    else:
        other = torch.empty(nbytes // 4, device="meta")
        a, b = comm.irecv(t, 0), comm.irecv(other, 1)
        a.wait()
        b.wait()


def test_a_shared_cap_is_shared_fairly_not_queued():
    # 1 GB through a 1 GB/s cap from t=0; a second 1 GB joins at t=0.5. Processor sharing:
    # both at 0.5 GB/s until the first finishes at 1.5, then the second alone until 2.0.
    # First-come-first-served would give 1.0 and 2.0.
    trace = launch(_late_second_sender, _one_cap(1e9), 10**9).trace
    ends = sorted(e.end for e in trace.on(2, "comm", "recv"))
    assert ends == pytest.approx([1.5, 2.0], rel=1e-12)


def test_zero_visible_devices_is_refused_clearly():
    with pytest.raises(ValueError, match="no visible devices"):
        launch(ring_shift, Cluster.preset("4xRTX4090-pcie", visible=""), 1)


def test_waiting_twice_on_a_work_returns_at_once() -> None:
    """As with torch.distributed, a work may be waited on again (a DDP hook that waits, then
    ``finish()`` that waits on the same handles): no deadlock, the same result."""
    def program(comm):
        job = comm.run_async(lambda: comm.rank * 10)
        first, again = job.wait(), job.wait()
        tensor = torch.ones(2)
        work = comm.isend(tensor, 1) if comm.rank == 0 else comm.irecv(tensor, 0)
        work.wait()
        work.wait()
        return first, again

    assert launch(program, 2).results == [(0, 0), (10, 10)]


def test_wait_returns_after_the_jobs_trailing_work() -> None:
    """A comm-stream job whose last act is arithmetic (a reduce-scatter's final adds): its
    work is part of the job, so ``wait`` returns after it, not at its last message."""
    def program(comm):
        x, y = torch.ones(4_000_000), torch.zeros(1)

        def job():
            if comm.rank == 0:
                comm.send(y, 1)
            else:
                comm.recv(y, 0)
            return (x * 2 + 1).sum()  # counted as elementwise work on the comm stream

        comm.run_async(job).wait()
        with comm.compute("compute", "after"):
            (x + 1).sum()

    trace = launch(program, Cluster.preset("8xA100-nvlink", visible="0,1")).trace
    for device in range(2):
        adds = [e for e in trace.on(device, "comm") if e.kind == "compute"]
        after = next(e for e in trace.on(device, "compute") if e.label == "after")
        assert adds and after.start >= max(e.end for e in adds) - 1e-12
