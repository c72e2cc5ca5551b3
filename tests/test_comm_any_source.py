"""Receive from any rank (``recv_any``) and wait for the first of several (``wait_any``):
the message that arrives first wins, on the simulator (in simulated time, deterministically)
and on gloo processes (in real time)."""

from __future__ import annotations

import pytest
import torch

from mpgpu_edu.comm import DeadlockError, launch


def first_come(comm, delays: list[float], rounds: int = 1) -> list[tuple[int, float]]:
    """Rank 0 receives ``rounds`` messages from every other rank with ``recv_any``; rank r
    sends its k-th message (value 10 r + k) after ``delays[r]`` seconds of compute."""
    if comm.rank == 0:
        got = []
        for _ in range(rounds * (comm.world_size - 1)):
            buf = torch.zeros(1)
            src = comm.recv_any(buf, list(range(1, comm.world_size)))
            got.append((src, buf.item()))
        return got
    for k in range(rounds):
        with comm.compute("forward", f"step {k}", seconds=delays[comm.rank]):
            pass
        comm.send(torch.tensor([10.0 * comm.rank + k]), 0)
    return []


def first_done(comm, delays: list[float]) -> list[tuple[int, float]]:
    """Rank 0 posts one ``irecv`` per other rank and takes them in the order ``wait_any``
    returns them."""
    if comm.rank == 0:
        peers = list(range(1, comm.world_size))
        bufs = [torch.zeros(1) for _ in peers]
        works = [comm.irecv(b, p) for b, p in zip(bufs, peers)]
        got = []
        while works:
            i = comm.wait_any(works)
            got.append((peers.pop(i), bufs.pop(i).item()))
            works.pop(i)
        return got
    with comm.compute("forward", "work", seconds=delays[comm.rank]):
        pass
    comm.send(torch.tensor([10.0 * comm.rank]), 0)
    return []


def nobody_sends(comm) -> None:
    if comm.rank == 0:
        comm.recv_any(torch.zeros(1), [1, 2])


def in_a_group(comm) -> list[tuple[int, float]]:
    """Ranks 1..3 form a group; its rank 0 (global 1) receives from the others."""
    if comm.rank == 0:
        return []
    sub = comm.group([1, 2, 3])
    return first_come(sub, [0.0, 2e-3, 1e-3])


# ---- the simulator -----------------------------------------------------------------------

@pytest.mark.parametrize("delays,order", [([0, 1e-3, 3e-3], [1, 2]), ([0, 3e-3, 1e-3], [2, 1]),
                                          ([0, 3e-3, 1e-3, 2e-3], [2, 3, 1])])
def test_sim_recv_any_takes_the_first_to_arrive_in_simulated_time(delays, order):
    for _ in range(3):  # the same answer on every run, whatever the threads do
        result = launch(first_come, len(delays), delays)
        assert [src for src, _ in result.results[0]] == order
        assert [v for _, v in result.results[0]] == [10.0 * s for s in order]


def test_sim_recv_any_keeps_each_sources_order_and_repeats_the_fast_one():
    result = launch(first_come, 3, [0, 1e-3, 2.5e-3], 2)
    got = result.results[0]
    assert sorted(got) == [(1, 10.0), (1, 11.0), (2, 20.0), (2, 21.0)]
    assert got[:3] == [(1, 10.0), (1, 11.0), (2, 20.0)]  # rank 1 sends twice before rank 2
    assert result.stats[0].received_from == {1: 8, 2: 8}


def test_sim_recv_any_timeline_has_the_receives_in_arrival_order():
    trace = launch(first_come, 3, [0, 3e-3, 1e-3]).trace
    froms = [e.peer for e in trace.on(0, "comm", "recv")]
    assert froms == [2, 1]


def test_sim_wait_any_returns_the_first_completed():
    for _ in range(3):
        result = launch(first_done, 4, [0, 3e-3, 1e-3, 2e-3])
        assert result.results[0] == [(2, 20.0), (3, 30.0), (1, 10.0)]


def test_sim_recv_any_without_a_sender_is_a_deadlock():
    with pytest.raises(DeadlockError, match="recv from any of ranks"):
        launch(nobody_sends, 3)


def test_sim_recv_any_in_a_group_returns_group_ranks():
    result = launch(in_a_group, 4)
    assert result.results[1] == [(2, 20.0), (1, 10.0)]


def test_sim_recv_any_rejects_itself_and_bad_lists():
    def bad(comm, sources):
        if comm.rank == 0:
            comm.recv_any(torch.zeros(1), sources)

    for sources in ([0, 1], [], [1, 1], [7]):
        with pytest.raises(Exception):  # noqa: B017 - RankError wrapping a ValueError
            launch(bad, 2, sources)


# ---- gloo: real processes ------------------------------------------------------------------

@pytest.mark.gloo
@pytest.mark.parametrize("world_size", [2, 3])
def test_gloo_recv_any_takes_the_first_to_arrive(world_size):
    delays = [0.0, 0.0, 0.3][:world_size]
    result = launch(first_come, world_size, delays, backend="gloo", timeout=30)
    got = result.results[0]
    assert [src for src, _ in got] == list(range(1, world_size))
    assert [v for _, v in got] == [10.0 * s for s in range(1, world_size)]


@pytest.mark.gloo
def test_gloo_wait_any_returns_the_first_completed():
    result = launch(first_done, 3, [0.0, 0.3, 0.0], backend="gloo", timeout=30)
    assert result.results[0] == [(2, 20.0), (1, 10.0)]
