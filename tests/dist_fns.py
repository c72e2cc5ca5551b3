"""SPMD functions the gloo tests run in worker processes (which import them by name, so they
live in a module, not inside the tests)."""

from __future__ import annotations

import os
import time

import torch


def whoami(comm) -> tuple[int, int, str]:
    return comm.rank, comm.world_size, str(comm.device)


def ring_shift(comm, n: int) -> torch.Tensor:
    """Each rank passes its tensor to the right, with isend so that nobody deadlocks."""
    mine = torch.full((n,), float(comm.rank))
    got = torch.empty(n)
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    work = comm.isend(mine, right)
    comm.recv(got, left)
    work.wait()
    return got


def tags_out_of_order(comm) -> tuple[float, float] | None:
    """Rank 0 sends tag 7 then tag 3; rank 1 receives tag 3 first. gloo matches by tag."""
    if comm.rank == 0:
        first = comm.isend(torch.tensor([1.0]), 1, tag=7)
        second = comm.isend(torch.tensor([2.0]), 1, tag=3)
        first.wait()
        second.wait()
        return None
    a, b = torch.empty(1), torch.empty(1)
    comm.recv(b, 0, tag=3)
    comm.recv(a, 0, tag=7)
    return a.item(), b.item()


def blocking_pair(comm, numel: int) -> float:
    if comm.rank == 0:
        comm.send(torch.arange(numel, dtype=torch.float32), 1)
        return 0.0
    got = torch.empty(numel)
    comm.recv(got, 0)
    return got.sum().item()


def sub_group(comm) -> tuple[int, int, float] | None:
    """Ranks 0 and 2 form a group, renumbered 0 and 1, and exchange a message in it."""
    if comm.rank == 1:
        return None
    sub = comm.group([0, 2])
    got = torch.zeros(1)
    if sub.rank == 0:
        sub.send(torch.tensor([42.0]), 1)
    else:
        sub.recv(got, 0)
    sub.barrier()
    return sub.rank, sub.world_size, got.item()


def barrier_then_rank(comm) -> int:
    comm.barrier()
    return comm.rank


def overlap(comm, seconds: float) -> float:
    """A message on the comm stream while the program computes: both take ``seconds``."""
    peer = 1 - comm.rank

    def exchange() -> float:
        out, got = torch.full((4,), float(comm.rank)), torch.full((4,), -1.0)
        if comm.rank == 0:
            time.sleep(seconds)  # the receiver waits meanwhile
            comm.send(out, peer)
            return out.sum().item()
        comm.recv(got, peer)
        return got.sum().item()  # 0.0 once rank 0's zeros arrived (else -4.0)

    work = comm.run_async(exchange)
    with comm.compute("forward", "busy"):
        time.sleep(seconds)
    return work.wait()


def measured(comm) -> int:
    with comm.compute("forward", "layer 1"):
        torch.ones(64, 64) @ torch.ones(64, 64)
    token = comm.memory.alloc("activations", 1000, "x")
    comm.memory.free(token)
    comm.log(f"hello from {comm.rank}")
    print(f"printed by rank {comm.rank}")
    ring_shift(comm, 25)
    return comm.rank


def raise_on_rank_1(comm) -> None:
    if comm.rank == 1:
        raise ValueError("rank one is broken")
    comm.recv(torch.empty(1), 1)  # never arrives


def raise_in_async_job(comm) -> None:
    def job() -> None:
        raise KeyError("lost on the comm stream")

    if comm.rank == 0:
        comm.run_async(job)
    comm.recv(torch.empty(1), 1 - comm.rank)  # never arrives: the job's failure ends it


def hang_on_recv(comm) -> None:
    if comm.rank == 1:
        comm.recv(torch.empty(4), 0)  # rank 0 never sends


def exit_rank_1(comm) -> None:
    if comm.rank == 1:
        os._exit(3)
    comm.recv(torch.empty(1), 1)


def pid(comm) -> int:
    return os.getpid()


def unpicklable_result(comm):
    return lambda: comm.rank


def late_wait(comm, seconds: float) -> None:
    """Rank 1 posts irecv, computes, then waits: its recv event spans post to wait."""
    if comm.rank == 0:
        comm.send(torch.ones(8), 1)
        return None
    got = torch.zeros(8)
    work = comm.irecv(got, 0)
    with comm.compute("backward", "while the message arrives"):
        time.sleep(seconds)
    work.wait()
    return got.sum().item()


def size_mismatch(comm, how: str) -> None:
    """Rank 0 sends four float32 values; rank 1 receives them into the wrong buffer."""
    if comm.rank == 0:
        comm.send(torch.ones(4), 1)
        return None
    buffer = {"larger": torch.zeros(6), "smaller": torch.zeros(2),
              "dtype": torch.zeros(4, dtype=torch.float64),
              "shape": torch.zeros(2, 2)}[how.split("-")[-1]]
    if how.startswith("irecv"):
        comm.irecv(buffer, 0).wait()
    elif how.startswith("any"):
        comm.recv_any(buffer, [0])
    else:
        comm.recv(buffer, 0)
    return None


def deadlock(comm) -> None:
    """Both ranks receive first: nobody ever sends."""
    comm.recv(torch.empty(4), 1 - comm.rank)


def fast_ring_sizes_differ(comm, segment_bytes) -> None:
    """Rank r all-reduces 8 + r elements with the fast ring: the ranks disagree."""
    from mpgpu_edu.collectives.ring_fast import RingAllReduce

    RingAllReduce(segment_bytes)(comm, torch.ones(8 + comm.rank))


def fast_ring_numel(comm, numels) -> None:
    """Rank r all-reduces ``numels[r]`` elements with the fast ring."""
    from mpgpu_edu.collectives.ring_fast import RingAllReduce

    RingAllReduce()(comm, torch.ones(numels[comm.rank]))


def fast_ring_agree_then_differ(comm) -> None:
    """Two fast-ring calls on which the ranks agree (the second uses the size-check receive
    the first left posted), then one on which they do not."""
    from mpgpu_edu.collectives.ring_fast import RingAllReduce

    ring = RingAllReduce()
    for _ in range(2):
        ring(comm, torch.ones(8))
    ring(comm, torch.ones(8 + comm.rank))


def fast_ring_sums(comm, numel: int, checked: bool) -> tuple[int, list]:
    """The rank's process id, and the sums of three fast-ring calls on a communicator with
    checks on or off (the rank's own process groups): each rank holds rank + 1."""
    import os

    from mpgpu_edu.collectives.ring_fast import RingAllReduce
    from mpgpu_edu.comm.dist import DistCommunicator

    use = comm if checked else DistCommunicator(comm.lanes, board=comm.board,
                                                check_messages=False)
    ring, sums = RingAllReduce(), []
    for _ in range(3):
        tensor = torch.full((numel,), float(comm.rank + 1))
        ring(use, tensor)
        sums.append(tensor.sum().item())
    return os.getpid(), sums
