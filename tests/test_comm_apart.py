"""The simulator with every rank in a process of its own (``comm.apart``): the same op lists,
trace and results as the threaded simulator, each rank seeing only its own inputs, errors
and deadlocks reported as on the threaded one, and no process left behind."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_reduce_ring
from mpgpu_edu.comm import (DeadlockError, LaunchTimeoutError, MessageMismatchError, RankError,
                            launch, ops)
from mpgpu_edu.comm.apart import RemoteError, run_apart


def _cluster(n: int) -> Cluster:
    return Cluster.uniform(n, alpha_s=1e-5, beta_Bps=1e9)


def _normal(op_lists: dict) -> dict:
    """Op lists with each handle renamed by its first appearance in its list (handles are
    numbered by a launch-wide counter, in whatever order the ranks post)."""
    out = {}
    for key, op_list in op_lists.items():
        names: dict[int, int] = {}
        rows = []
        for op in op_list:
            if isinstance(op, (ops.Post, ops.Wait)):
                op = dataclasses.replace(op, handle=names.setdefault(op.handle, len(names)))
            rows.append(op)
        out[key] = rows
    return out


def _everything(comm, inputs):
    """A program that uses every method: messages, waits, regions, the comm stream,
    memory, logs, recv_any, wait_any, a group and a barrier."""
    t = inputs[comm.rank].clone()
    all_reduce_ring(comm, t)
    with comm.compute("forward", "matmul"):
        x = t.reshape(2, -1) @ torch.ones(t.numel() // 2, 3)
    token = comm.memory.alloc("activations", 1000, "x")
    job = comm.run_async(lambda: all_reduce_ring(comm, x) or comm.rank)
    assert job.wait() == comm.rank
    comm.memory.free(token)
    n, me = comm.world_size, comm.rank
    got = torch.zeros(1)
    if me == 0 and n > 1:
        sources = list(range(1, n))
        firsts = [comm.recv_any(got, sources, tag=5) for _ in sources]
        works = [comm.irecv(torch.zeros(1), src, tag=6) for src in sources]
        first = comm.wait_any(works)
        for w in works:
            w.wait()
    elif me > 0:
        comm.send(torch.full((1,), float(me)), 0, tag=5)
        comm.send(torch.full((1,), float(me)), 0, tag=6)
        firsts, first = [], -1
    else:
        firsts, first = [], -1
    evens = comm.group([r for r in range(n) if r % 2 == me % 2])
    e = torch.ones(4) * me
    all_reduce_ring(evens, e)
    comm.barrier()
    t.add_(1)  # elementwise work after the last message: timed at the end
    comm.log(f"rank {me} done")
    return t, x, sorted(firsts), first, e


@pytest.mark.parametrize("n", [1, 2, 4])
def test_the_same_run_as_the_threaded_simulator(n: int) -> None:
    inputs = [torch.arange(8.0) * (r + 1) for r in range(n)]
    threads = launch(_everything, _cluster(n), inputs)
    apart = run_apart(_everything, _cluster(n), (inputs,))
    assert _normal(apart.op_lists) == _normal(threads.op_lists)
    assert apart.trace.to_dict() == threads.trace.to_dict()
    assert apart.logs == threads.logs
    assert [s.to_dict() for s in apart.stats] == [s.to_dict() for s in threads.stats]
    for mine, theirs in zip(apart.results, threads.results):
        assert torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])
        assert mine[2:4] == list(theirs[2:4]) and torch.equal(mine[4], theirs[4])
    assert [repr(ledger) for ledger in apart.ledgers] == [repr(ledger)
                                                            for ledger in threads.ledgers]


def test_a_rank_sees_only_its_own_inputs() -> None:
    inputs = [torch.full((3,), float(r + 1)) for r in range(3)]
    nested = [{"w": torch.ones(2) * r} for r in range(3)]
    modules = [torch.nn.Linear(2, 2) for _ in range(3)]
    with torch.no_grad():
        for r, module in enumerate(modules):
            module.weight.fill_(r + 1)
            module.bias.fill_(r + 1)

    def peek(comm, inputs, nested, modules):
        return ([t.sum().item() for t in inputs], [d["w"].sum().item() for d in nested],
                [sum(p.sum().item() for p in m.parameters()) for m in modules])

    result = run_apart(peek, _cluster(3), (inputs, nested, modules),
                       hide=[inputs, nested, modules])
    for rank, (sums, ws, params) in enumerate(result.results):
        assert sums == [3.0 * (rank + 1) if r == rank else 0.0 for r in range(3)]
        assert ws == [2.0 * rank if r == rank else 0.0 for r in range(3)]
        assert params == [6.0 * (rank + 1) if r == rank else 0.0 for r in range(3)]
    assert [t[0].item() for t in inputs] == [1.0, 2.0, 3.0]  # the launcher's copy is intact


_SHARED: list[int] = []


def test_ranks_share_no_memory() -> None:
    """What one rank writes into a module's state, another does not see (threads would)."""
    def write_then_read(comm):
        _SHARED.append(comm.rank)
        comm.barrier()
        return list(_SHARED)

    result = run_apart(write_then_read, _cluster(3))
    assert result.results == [[0], [1], [2]]
    assert _SHARED == []


def _children() -> set[int]:
    """The pids of this process's living children (from every thread's list in /proc)."""
    found = set()
    for task in os.listdir("/proc/self/task"):
        text = open(f"/proc/self/task/{task}/children").read()
        found.update(int(pid) for pid in text.split())
    return found


@pytest.fixture
def no_process_left():
    """The test leaves no child process of its own behind."""
    before = _children()
    yield
    assert _children() <= before


class Odd(Exception):
    pass


def test_errors_come_back_as_the_rank_raised_them(no_process_left: None) -> None:
    def raises(comm, kind):
        if comm.rank == 1:
            raise {"value": ValueError("bad value"), "todo": NotImplementedError("todo"),
                   "odd": Odd("an odd one")}[kind]
        comm.recv(torch.zeros(2), 1)

    with pytest.raises(RankError) as info:
        run_apart(raises, _cluster(2), ("value",))
    assert info.value.rank == 1 and type(info.value.original) is ValueError
    assert "bad value" in str(info.value) and 'raise {"value"' in str(info.value)
    with pytest.raises(RankError) as info:
        run_apart(raises, _cluster(2), ("todo",))
    assert type(info.value.original) is NotImplementedError
    with pytest.raises(RankError) as info:
        run_apart(raises, _cluster(2), ("odd",))
    assert isinstance(info.value.original, RemoteError)
    assert str(info.value.original) == "Odd: an odd one"


def test_deadlocks_mismatches_and_a_dead_rank(no_process_left: None) -> None:
    def deadlock(comm):
        comm.recv(torch.zeros(2), (comm.rank + 1) % comm.world_size)

    with pytest.raises(DeadlockError, match="rank 2: recv from rank 0"):
        run_apart(deadlock, _cluster(3))

    def mismatch(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(3), 1)
        else:
            comm.recv(torch.zeros(2), 0)

    with pytest.raises(MessageMismatchError):
        run_apart(mismatch, _cluster(2))

    def exits(comm):
        if comm.rank == 0:
            os._exit(3)
        comm.recv(torch.zeros(2), 0)

    with pytest.raises(RankError, match="process ended"):
        run_apart(exits, _cluster(2))


def test_a_timeout_stops_every_rank_process(no_process_left: None) -> None:
    def spins(comm):
        if comm.rank == 0:
            while True:
                pass
        comm.recv(torch.zeros(1), 0)

    with pytest.raises(LaunchTimeoutError, match="rank 0: running Python code"):
        run_apart(spins, _cluster(2), timeout=1.0)


def test_what_a_rank_prints_comes_back(capsys: pytest.CaptureFixture) -> None:
    def says(comm):
        print(f"hello from rank {comm.rank}")

    run_apart(says, _cluster(2))
    out = capsys.readouterr().out
    assert "hello from rank 0" in out and "hello from rank 1" in out


def test_a_message_of_learner_type_arrives_as_plain_data() -> None:
    class Sneaky(list):
        def __eq__(self, other):
            return True

    class Mine:
        pass

    def returns(comm):
        return Sneaky([1]), Mine(), torch.ones(2)

    result = run_apart(returns, _cluster(1))
    sneaky, mine, tensor = result.results[0]
    assert type(sneaky) is list and sneaky == [1] and sneaky != [2]
    assert mine == {"__unplain__": "Mine"} and type(tensor) is torch.Tensor


def test_tamper_changes_every_message_that_carries_data() -> None:
    inputs = [torch.arange(6.0) + r for r in range(3)]

    def ring(comm, inputs):
        t = inputs[comm.rank].clone()
        all_reduce_ring(comm, t)
        return t

    plain = run_apart(ring, _cluster(3), (inputs,))
    changed = run_apart(ring, _cluster(3), (inputs,), tamper=True)
    assert plain.tampered is False and changed.tampered is True
    assert all(not torch.equal(a, b) for a, b in zip(plain.results, changed.results))

    def on_meta(comm):
        t = torch.empty(6, device="meta")
        all_reduce_ring(comm, t)
        return t.shape[0]

    assert run_apart(on_meta, _cluster(3), tamper=True).tampered is False


def _started_after(comm):
    """The same work, its job started once the gradient exists."""
    grad = torch.zeros(4)
    with comm.compute("backward", "layer", seconds=1e-3):
        grad.copy_(torch.ones(4, 4) @ torch.full((4,), float(comm.rank + 1)))
    job = comm.run_async(lambda: all_reduce_ring(comm, grad))
    with comm.compute("backward", "layer", seconds=1e-3):
        torch.ones(4, 4) @ torch.ones(4)
    job.wait()
    return grad


def test_jobs_in_order_end_before_the_program_goes_on(no_process_left: None) -> None:
    """With ``jobs_in_order`` a comm-stream job runs to its end before ``run_async`` returns,
    in real time only: an honest job gives the same op lists and timeline as without it,
    and a job that waits for what the program does afterwards never ends."""
    import threading

    def gated(comm):
        gate, grad = threading.Event(), torch.zeros(4)

        def job():
            gate.wait()  # until the program has computed the gradient
            all_reduce_ring(comm, grad)

        work = comm.run_async(job)
        with comm.compute("backward", "layer", seconds=1e-3):
            grad.copy_(torch.ones(4, 4) @ torch.full((4,), float(comm.rank + 1)))
        gate.set()
        work.wait()
        return grad

    free = run_apart(gated, _cluster(2))
    sends = [e for e in free.trace.events if e.kind == "send"]
    work = [e for e in free.trace.events if e.kind == "backward"]
    assert sends and work and min(e.start for e in sends) < min(e.end for e in work)
    assert torch.equal(free.results[0], torch.full((4,), 12.0))  # 4 * (1 + 2): right values
    with pytest.raises(LaunchTimeoutError, match="waiting for comm-stream job 0 to end"):
        run_apart(gated, _cluster(2), timeout=2.0, jobs_in_order=True)
    honest = run_apart(_started_after, _cluster(2))
    ordered = run_apart(_started_after, _cluster(2), jobs_in_order=True)
    assert _normal(ordered.op_lists) == _normal(honest.op_lists)
    assert ordered.trace.to_dict() == honest.trace.to_dict()
    assert all(torch.equal(a, b) for a, b in zip(ordered.results, honest.results))
