"""Checks of lesson 01: message cost and collectives built from send and recv.

Every collective case runs the learner's function on the simulator with the built-in
collectives disabled (``from_scratch``); *compute* hands the judge what each rank holds and
sent (``launch_facts``), and *judge* checks values, bytes and messages per rank, who talks
to whom, and the time against the grader's own reference. Structure the numbers cannot show
is recorded in *compute* as plain data too: how many isend/irecv works each rank waited on
(``_WaitLedger``), and whether a returned tensor shares memory with the input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.cluster.topology import LinkInfo, Route, Topology
from mpgpu_edu.collectives import all_reduce_ring
from mpgpu_edu.grading.checks import Case, Evidence
from mpgpu_edu.grading.checks._plain import is_tensor, type_name
from mpgpu_edu.grading.checks._support import (ALPHA, BETA, bytes_of, compute_examples,
                                               evidence, examples, expect, expect_close,
                                               from_scratch, judge_examples, launch_facts,
                                               rank_inputs, run_spmd, showing, uniform)
from mpgpu_edu.lessons.communication import all_reduce_meta, binary_tree_all_reduce, tree_children

Impl = Callable[..., Any]
Facts = dict[str, Any]


# ---- 1.1 point-to-point cost ---------------------------------------------------------------

P2P_SETS: dict[str, list[tuple[Callable[[], Cluster], list[tuple[int, int]], list[int]]]] = {
    "uniform": [(lambda: uniform(2), [(0, 1), (1, 0)], [0, 1, 1000, 10**6])],
    "preset": [(lambda: Cluster.preset("4xRTX4090-pcie"), [(0, 2)], [4096, 2**20])],
    # both PCIe cards on one socket: across the socket link even a lone transfer runs at that
    # link's shared 10 GB/s, which the route's beta_Bps (24 GB/s) does not carry
    "visible": [(lambda: Cluster.preset("8xRTX4090-pcie", visible="5,4"), [(0, 1)], [2**20]),
                (lambda: Cluster.preset("2x8xH100-ib", visible="0,9"), [(1, 0)], [2**20])],
}


def _p2p_program(src: int, dst: int, nbytes: int) -> Callable[..., None]:
    def program(comm: Any) -> None:
        buffer = torch.zeros(nbytes, dtype=torch.uint8)
        if comm.rank == src:
            comm.send(buffer, dst)
        elif comm.rank == dst:
            comm.recv(buffer, src)
    return program


def _p2p_case(name: str, key: str) -> Case:
    def compute(impl: Impl) -> list[Any]:
        return [impl(make(), src, dst, nbytes) for make, pairs, sizes in P2P_SETS[key]
                for src, dst in pairs for nbytes in sizes]

    def judge(got: list[Any]) -> None:
        answers = iter(got)
        for make, pairs, sizes in P2P_SETS[key]:
            cluster = make()
            for src, dst in pairs:
                for nbytes in sizes:
                    value = next(answers)
                    measured = run_spmd(_p2p_program(src, dst, nbytes), cluster).trace.makespan
                    expect(type(value) in (int, float), f"p2p_time should return seconds as a "
                                                        f"float, got {type_name(value)}")
                    expect(abs(value - measured) <= 1e-9 * measured + 1e-15,
                           f"p2p_time({cluster.name}, {src}, {dst}, {nbytes}) returned "
                           f"{value:.6g} s; the simulator measures {measured:.6g} s")
    return Case(name, 1, compute, judge)


# ---- all-reduce: shared parts --------------------------------------------------------------

def _count(number: int, noun: str) -> str:
    """``1 message``, ``3 messages``."""
    return f"{number} {noun}" + ("" if number == 1 else "s")


def fully_connected(n: int) -> Cluster:
    """The uniform cluster's alpha and beta, but a wire of its own for every ordered pair of
    devices (as on a board where every pair of GPUs has direct links): a rank can receive
    from two peers at once at full speed, so a tree whose subtrees work at once is faster."""
    def route_of(s: int, d: int) -> Route:
        return Route(ALPHA, BETA, (f"wire{s}-{d}",))

    links = [LinkInfo(f"gpu{a}", f"gpu{b}", "direct", BETA) for a in range(n)
             for b in range(a + 1, n)]
    topology = Topology("fully_connected", n, route_of, links, {"all": tuple(range(n))})
    return Cluster(f"fully-connected-{n}", uniform(n).gpu, topology, None,
                   efficiency=1.0, launch_overhead_s=0.0, memory_Bps=0.0)


class _WaitLedger:
    """A rank's communicator that counts the isend/irecv works it hands out and the ones
    waited on (plain numbers for the judge); everything else goes to the real one."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.started: list[str] = []
        self.waited: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def _watch(self, what: str, work: Any) -> Any:
        ledger, index = self, len(self.started)
        self.started.append(what)

        class Watched:
            inner, number = work, index

            def wait(self) -> Any:
                result = work.wait()
                ledger.waited.add(index)
                return result
        return Watched()

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Any:
        return self._watch("isend", self._comm.isend(tensor, dst, tag))

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Any:
        return self._watch("irecv", self._comm.irecv(tensor, src, tag))

    def wait_any(self, works: Any) -> int:
        index = self._comm.wait_any([getattr(w, "inner", w) for w in works])
        if hasattr(works[index], "number"):
            self.waited.add(works[index].number)
        return index

    def summary(self) -> dict[str, int]:
        unwaited = [what for i, what in enumerate(self.started) if i not in self.waited]
        return {"isend": self.started.count("isend"), "irecv": self.started.count("irecv"),
                "isend_unwaited": unwaited.count("isend"),
                "irecv_unwaited": unwaited.count("irecv")}

def _all_reduce_program(impl: Impl, inputs: list[torch.Tensor]) -> Callable[..., Any]:
    def program(comm: Any) -> tuple[torch.Tensor, Any]:
        tensor = inputs[comm.rank].clone()
        returned = impl(comm, tensor)
        return tensor, returned
    return program


def _all_reduce_facts(impl: Impl, exercise: str, n: int, numel: int, seed: int = 0,
                      with_trace: bool = False,
                      cluster: Callable[[int], Cluster] = uniform) -> Facts:
    """compute: the learner's all-reduce on ``n`` ranks of ``cluster(n)`` (uniform)."""
    inputs = rank_inputs(n, numel, seed)
    with from_scratch(impl, exercise):
        result = run_spmd(_all_reduce_program(impl, inputs), cluster(n))
    return launch_facts(result, with_trace)


def _waits_facts(impl: Impl, exercise: str, n: int, numel: int) -> Facts:
    """compute: the learner's all-reduce through ``_WaitLedger``: what each rank holds, and
    how many of its isend/irecv works it waited on."""
    inputs = rank_inputs(n, numel)
    ledgers: list[Any] = [None] * n

    def program(comm: Any) -> tuple[torch.Tensor, Any]:
        ledgers[comm.rank] = _WaitLedger(comm)
        tensor = inputs[comm.rank].clone()
        return tensor, impl(ledgers[comm.rank], tensor)

    with from_scratch(impl, exercise):
        result = run_spmd(program, uniform(n))
    facts = launch_facts(result)
    facts["works"] = [ledger.summary() for ledger in ledgers]
    return facts


def _waits_case(exercise: str, points: int, sizes: list[tuple[int, int]]) -> Case:
    def compute(impl: Impl) -> list[Facts]:
        return [_waits_facts(impl, exercise, n, numel) for n, numel in sizes]

    def judge(runs: list[Facts]) -> None:
        for facts, (n, numel) in zip(runs, sizes):
            _judge_sums(facts, n, numel)
            for rank, works in enumerate(facts["works"]):
                for kind in ("isend", "irecv"):
                    left = works[f"{kind}_unwaited"]
                    expect(left == 0,
                           f"N={n}: rank {rank} started {_count(works[kind], kind)} and "
                           f"returned without waiting on {left} of them; until its work is "
                           f"waited on, an {kind}'s tensor may still be in flight (on gloo "
                           f"or NCCL it can be read or overwritten too early)")
    return Case("waits: every isend and irecv is waited on before returning", points,
                compute, judge)


def _judge_sums(facts: Facts, n: int, numel: int, seed: int = 0) -> None:
    inputs = rank_inputs(n, numel, seed)
    want = torch.stack(inputs).sum(0)
    for rank, (tensor, returned) in enumerate(facts["results"]):
        if (is_tensor(tensor) and torch.equal(tensor, inputs[rank]) and n > 1
                and not torch.equal(want, inputs[rank])):
            hint = " (you returned the result instead)" if is_tensor(returned) else ""
            expect(False, f"rank {rank}'s tensor is unchanged: the all-reduce works in "
                          f"place{hint}")
        expect_close(tensor, want, f"rank {rank} of {n}, {numel} elements")


def _sums_case(name: str, points: int, exercise: str, sizes: list[tuple[int, int]]) -> Case:
    def compute(impl: Impl) -> list[Facts]:
        return [_all_reduce_facts(impl, exercise, n, numel) for n, numel in sizes]

    def judge(runs: list[Facts]) -> None:
        for facts, (n, numel) in zip(runs, sizes):
            _judge_sums(facts, n, numel)
    return Case(name, points, compute, judge)


def _hidden_case(exercise: str, facts_of: Callable[..., Facts], judge_one: Callable[..., None],
                 numel: tuple[int, int] = (1, 40), points: int = 1) -> Case:
    """Random world sizes 1..7 (3, 5, 6 and 7 always among them) and sizes; the judge
    reports the first failing example."""
    fixed = [{"world_size": n, "numel": m, "values": 1} for n, m in ((3, 10), (5, 7), (6, 13),
                                                                    (7, 9))]
    cases = examples(14, int(exercise.replace(".", "")), world_size=(1, 7), numel=numel,
                     values=(0, 3)) + fixed

    def compute(impl: Impl) -> list[dict]:
        return compute_examples(lambda world_size, numel, values: facts_of(
            impl, exercise, world_size, numel, values), cases)

    def judge(records: list[dict]) -> None:
        judge_examples(records, lambda facts, world_size, numel, values: judge_one(
            facts, world_size, numel, values))
    return Case("hidden: random sizes and world sizes 1-7", points, compute, judge, hidden=True)


# ---- 1.2 naive ------------------------------------------------------------------------------

def _judge_naive_traffic(facts: Facts, n: int, numel: int) -> None:
    size = bytes_of(numel)
    stats = facts["stats"]
    expect(stats[0]["bytes_received"] == (n - 1) * size
           and stats[0]["bytes_sent"] == (n - 1) * size,
           f"rank 0 should receive and send (N-1) x {size} bytes, it received "
           f"{stats[0]['bytes_received']} and sent {stats[0]['bytes_sent']}")
    for rank in range(1, n):
        expect(stats[rank]["sent_to"] == {0: size},
               f"rank {rank} should send its {size} bytes to rank 0 only, it sent "
               f"{stats[rank]['sent_to']} (bytes per peer)")
        expect(stats[rank]["bytes_received"] == size,
               f"rank {rank} should receive the sum once ({size} bytes), it received "
               f"{stats[rank]['bytes_received']}")
    exchanged = stats[0]["messages_sent"] + stats[0]["messages_received"]
    expect(exchanged == 2 * (n - 1), f"rank 0 should exchange 2(N-1) = {2 * (n - 1)} messages,"
                                     f" it exchanged {exchanged}")


def _naive_traffic() -> Case:
    def compute(impl: Impl) -> Facts:
        return _all_reduce_facts(impl, "1.2", 4, 1000)

    def judge(facts: Facts) -> None:
        _judge_sums(facts, 4, 1000)
        _judge_naive_traffic(facts, 4, 1000)
    return Case("traffic: everything goes through rank 0", 1, compute, judge)


def _judge_naive_hidden(facts: Facts, world_size: int, numel: int, seed: int) -> None:
    _judge_sums(facts, world_size, numel, seed)
    if world_size > 1:
        _judge_naive_traffic(facts, world_size, numel)


# ---- 1.3 ring (and 1.7, which must move the ring's bytes) -----------------------------------

def _judge_ring_traffic(facts: Facts, n: int, numel: int, padded: bool = False) -> None:
    chunk = -(-numel // n)  # ceil(numel / N)
    low = 2 * (n - 1) * bytes_of(chunk if padded else numel // n)
    high = 2 * (n - 1) * bytes_of(chunk)
    if padded:
        want = (f"padded to N chunks of ceil(numel/N) = ceil({numel}/{n}) = {chunk} elements, "
                f"it sends 2(N-1) = {2 * (n - 1)} chunks of {bytes_of(chunk)} bytes, {low} "
                f"bytes")
    else:
        want = f"a ring sends 2(N-1)/N of the tensor, {low}..{high} bytes"
    for rank, stats in enumerate(facts["stats"]):
        right = (rank + 1) % n
        if n > 1:
            expect(set(stats["sent_to"]) == {right},
                   f"N={n}: rank {rank} sent to ranks {sorted(stats['sent_to'])}; on a ring it "
                   f"sends to its right neighbour {right} only")
        expect(low <= stats["bytes_sent"] <= high,
               f"N={n}, {numel} elements ({bytes_of(numel)} bytes): rank {rank} sent "
               f"{stats['bytes_sent']} bytes; {want}")
        expect(stats["messages_sent"] == 2 * (n - 1),
               f"N={n}: rank {rank} sent {_count(stats['messages_sent'], 'message')}; a ring "
               f"takes 2(N-1) = {2 * (n - 1)} steps of one message each")


RING_TRAFFIC = [(4, 1000), (3, 1000), (5, 12), (6, 1001)]


def _traffic_case(name: str, points: int, exercise: str, padded: bool = False) -> Case:
    def compute(impl: Impl) -> list[Facts]:
        return [_all_reduce_facts(impl, exercise, n, numel) for n, numel in RING_TRAFFIC]

    def judge(runs: list[Facts]) -> None:
        for facts, (n, numel) in zip(runs, RING_TRAFFIC):
            _judge_sums(facts, n, numel)
            _judge_ring_traffic(facts, n, numel, padded)
    return Case(name, points, compute, judge)


def _time_case(name: str, exercise: str, reference: Impl, what: str,
               runs: list[tuple[int, int]], why: str, points: int = 2,
               cluster: Callable[[int], Cluster] = uniform, faster: str = "") -> Case:
    """On every run (N, numel) the learner's all-reduce must give the right sums and take at
    most 1.1 x the reference's time; with ``faster`` (what a much faster one must be), also
    at least 0.9 x. A run that crashes fails the case like any other."""
    def compute(impl: Impl) -> list[Facts]:
        return [_all_reduce_facts(impl, exercise, n, numel, with_trace=True, cluster=cluster)
                for n, numel in runs]

    def judge(all_facts: list[Facts]) -> Evidence:
        shown = Evidence()
        for facts, (n, numel) in zip(all_facts, runs):
            _judge_sums(facts, n, numel)
            inputs = rank_inputs(n, numel)
            ref = run_spmd(lambda comm: reference(comm, inputs[comm.rank].clone()), cluster(n))
            shown = evidence({"yours": facts["trace"],
                              f"reference ({what})": ref.trace.to_dict()})
            yours_ms, ref_ms = facts["makespan"] * 1e3, ref.trace.makespan * 1e3
            where = (f"your all-reduce of {numel} elements ({bytes_of(numel)} bytes) on {n} "
                     f"ranks of {cluster(n).name} takes {yours_ms:.3f} ms, the {what} "
                     f"{ref_ms:.3f} ms")
            with showing(shown):
                expect(facts["makespan"] <= 1.1 * ref.trace.makespan, f"{where}: {why}")
                expect(not faster or facts["makespan"] >= 0.9 * ref.trace.makespan,
                       f"{where}, faster than {faster}")
        return shown
    return Case(name, points, compute, judge)


# ---- every all-reduce also runs on meta tensors, as the lesson's figures do -----------------

def _meta_case(exercise: str, runs: tuple[tuple[int, int], ...] = ((4, 1000), (3, 10))) -> Case:
    """The lesson's figures run the learner's all-reduce on meta tensors (shapes without
    data, so that 1 GiB costs nothing): a buffer made with ``torch.zeros(n)`` instead of
    ``tensor.new_zeros(n)`` lives on the CPU, and copying a meta tensor into it fails."""
    def compute(impl: Impl) -> list[Facts]:
        out: list[Facts] = []
        for n, numel in runs:
            try:
                with from_scratch(impl, exercise):
                    run_spmd(all_reduce_meta, uniform(n), impl, numel)
            except NotImplementedError as exc:
                if "meta" not in str(exc):
                    raise  # the stub itself
                out.append({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
            except Exception as exc:  # noqa: BLE001 - only a failure that meta tensors cause
                if "meta" not in str(exc):
                    raise
                out.append({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
            else:
                out.append({"error": ""})
        return out

    def judge(all_facts: list[Facts]) -> None:
        for facts, (n, numel) in zip(all_facts, runs):
            expect(not facts["error"],
                   f"on {n} ranks with a meta tensor of {numel} elements (shapes without "
                   f"data: what the lesson's figures run) your function raised "
                   f"{facts['error']}. Make every buffer where the input lives: "
                   f"tensor.new_zeros(...), tensor.new_empty(...), or device=tensor.device")
    return Case("runs on meta tensors, as the lesson's figures do", 1, compute, judge)


# ---- 1.6 tree --------------------------------------------------------------------------------

def _judge_tree_traffic(facts: Facts, n: int, numel: int) -> None:
    size = bytes_of(numel)
    for rank, stats in enumerate(facts["stats"]):
        peers = tree_children(rank, n) + ([(rank - 1) // 2] if rank > 0 else [])
        want = {peer: size for peer in sorted(peers)}
        got = {int(k): v for k, v in sorted(stats["sent_to"].items())}
        expect(got == want, f"N={n}: rank {rank} sent {got} (bytes per peer); in the binary "
                            f"tree it sends the whole tensor ({size} bytes) once to each of "
                            f"its parent and children {sorted(peers)}")
        expect(stats["messages_sent"] == len(peers) and
               stats["messages_received"] == len(peers),
               f"N={n}: rank {rank} sent {_count(stats['messages_sent'], 'message')} and "
               f"received {stats['messages_received']}; with parent and children "
               f"{sorted(peers)} it sends and receives {len(peers)}")


def _tree_traffic() -> Case:
    sizes = [(7, 100), (6, 30), (5, 9), (4, 8), (2, 3)]

    def compute(impl: Impl) -> list[Facts]:
        return [_all_reduce_facts(impl, "1.6", n, numel) for n, numel in sizes]

    def judge(runs: list[Facts]) -> None:
        for facts, (n, numel) in zip(runs, sizes):
            _judge_sums(facts, n, numel)
            _judge_tree_traffic(facts, n, numel)
    return Case("traffic: each rank talks to its parent and children only", 3, compute, judge)


def _judge_tree_hidden(facts: Facts, world_size: int, numel: int, seed: int) -> None:
    _judge_sums(facts, world_size, numel, seed)
    _judge_tree_traffic(facts, world_size, numel)


def _judge_ring_hidden(padded: bool) -> Callable[..., None]:
    def judge_one(facts: Facts, world_size: int, numel: int, seed: int) -> None:
        _judge_sums(facts, world_size, numel, seed)
        _judge_ring_traffic(facts, world_size, numel, padded)
    return judge_one


# ---- 1.4 reduce-scatter, 1.5 all-gather ---------------------------------------------------

def _collective_facts(impl: Impl, exercise: str, n: int, shape: tuple[int, ...],
                      seed: int = 0) -> Facts:
    """compute: what each rank's input and returned value are afterwards, and (``shares``)
    whether each returned tensor shares memory with the rank's input tensor."""
    inputs = _inputs(n, shape, seed)
    shares: list[Any] = [None] * n

    def program(comm: Any) -> tuple[torch.Tensor, Any]:
        tensor = inputs[comm.rank].clone()
        got = impl(comm, tensor)
        parts = got if isinstance(got, (list, tuple)) else [got]
        shares[comm.rank] = [isinstance(p, torch.Tensor) and _same_memory(p, tensor)
                             for p in parts]
        return tensor, got

    with from_scratch(impl, exercise):
        result = run_spmd(program, uniform(n))
    facts = launch_facts(result)
    facts["shares"] = shares
    return facts


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _inputs(n: int, shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    numel = 1
    for dim in shape:
        numel *= dim
    return [t.reshape(shape) for t in rank_inputs(n, numel, seed)]


def _judge_reduce_scatter(facts: Facts, n: int, shape: tuple[int, ...], seed: int = 0) -> None:
    inputs = _inputs(n, shape, seed)
    chunks = torch.tensor_split(torch.stack(inputs).sum(0).reshape(-1), n)
    for rank, (tensor, got) in enumerate(facts["results"]):
        expect(is_tensor(tensor) and torch.equal(tensor, inputs[rank]),
               f"N={n}: rank {rank}'s input tensor was changed; reduce-scatter must leave it "
               "as it was")
        expect_close(got, chunks[rank], f"N={n}, shape {list(shape)}, rank {rank}'s chunk")


def _judge_all_gather(facts: Facts, n: int, shape: tuple[int, ...], seed: int = 0) -> None:
    inputs = _inputs(n, shape, seed)
    for rank, (tensor, got) in enumerate(facts["results"]):
        expect(is_tensor(tensor) and torch.equal(tensor, inputs[rank]),
               f"rank {rank}'s input tensor was changed")
        expect(isinstance(got, list) and len(got) == n,
               f"rank {rank} should return a list of {n} tensors, got {type_name(got)}"
               + (f" of length {len(got)}" if isinstance(got, list) else ""))
        for source in range(n):
            expect_close(got[source], inputs[source],
                         f"N={n}: rank {rank}'s entry {source} (rank {source}'s tensor)")


def _judge_new_tensors(facts: Facts, n: int, shape: tuple[int, ...], seed: int = 0) -> None:
    _judge_all_gather(facts, n, shape, seed)
    for rank, shares in enumerate(facts["shares"]):
        for entry, shared in enumerate(shares):
            expect(not shared, f"N={n}: rank {rank}'s entry {entry} is its input tensor itself "
                               f"(or a view of it), not a new tensor: changing one changes "
                               f"the other")


def _values_case(name: str, exercise: str, judge_one: Callable[..., None],
                 runs: list[tuple[int, tuple[int, ...]]], points: int = 2) -> Case:
    def compute(impl: Impl) -> list[Facts]:
        return [_collective_facts(impl, exercise, n, shape) for n, shape in runs]

    def judge(all_facts: list[Facts]) -> None:
        for facts, (n, shape) in zip(all_facts, runs):
            judge_one(facts, n, shape)
    return Case(name, points, compute, judge)


def _judge_half_traffic(facts: Facts, n: int, want: int, what: str) -> None:
    for rank, stats in enumerate(facts["stats"]):
        expect(set(stats["sent_to"]) == {(rank + 1) % n} and stats["bytes_sent"] == want
               and stats["messages_sent"] == n - 1,
               f"rank {rank} sent {_count(stats['messages_sent'], 'message')}, "
               f"{stats['bytes_sent']} "
               f"bytes to {sorted(stats['sent_to'])}; a ring {what} sends N-1 = {n - 1} "
               f"messages, {want} bytes, to rank {(rank + 1) % n}")


def _half_traffic_case(name: str, points: int, exercise: str, judge_one: Callable[..., None],
                       what: str) -> Case:
    n, numel = 4, 1000

    def compute(impl: Impl) -> Facts:
        return _collective_facts(impl, exercise, n, (numel,))

    def judge(facts: Facts) -> None:
        judge_one(facts, n, (numel,))
        per = numel // n if exercise == "1.4" else numel
        _judge_half_traffic(facts, n, (n - 1) * bytes_of(per), what)
    return Case(name, points, compute, judge)


def _half_hidden(exercise: str, judge_one: Callable[..., None]) -> Case:
    def facts_of(impl: Impl, ex_id: str, n: int, numel: int, seed: int) -> Facts:
        return _collective_facts(impl, ex_id, n, (numel,), seed)

    def judge_hidden(facts: Facts, world_size: int, numel: int, seed: int) -> None:
        judge_one(facts, world_size, (numel,), seed)
        for rank, stats in enumerate(facts["stats"]):
            expect(stats["messages_sent"] == world_size - 1,
                   f"N={world_size}: rank {rank} sent "
                   f"{_count(stats['messages_sent'], 'message')}, not "
                   f"N-1 = {world_size - 1}")
    return _hidden_case(exercise, facts_of, judge_hidden, numel=(1, 30))


# ---- the cases ---------------------------------------------------------------------------

CASES: dict[str, list[Case]] = {
    "1.1": [
        _p2p_case("uniform cluster: alpha + n / beta", "uniform"),
        _p2p_case("PCIe preset: matches a simulated send", "preset"),
        _p2p_case("logical ids under CUDA_VISIBLE_DEVICES", "visible"),
    ],
    "1.2": [
        _sums_case("sums in place on 4 ranks", 1, "1.2", [(4, 100)]),
        _sums_case("world sizes 1, 2, 3, 5", 1, "1.2", [(1, 5), (2, 5), (3, 7), (5, 11)]),
        _naive_traffic(),
        _meta_case("1.2"),
        _hidden_case("1.2", _all_reduce_facts, _judge_naive_hidden),
    ],
    "1.3": [
        _sums_case("sums in place on 4 ranks", 1, "1.3", [(4, 1000)]),
        _meta_case("1.3"),
        _sums_case("any size: uneven chunks, fewer elements than ranks", 2, "1.3",
                   [(3, 10), (5, 3), (2, 1), (1, 4)]),
        _traffic_case("traffic: 2(N-1)/N of the tensor, to the right neighbour", 2, "1.3"),
        _waits_case("1.3", 1, [(4, 1000), (3, 10)]),
        _time_case("time: every link busy at once", "1.3", all_reduce_ring, "ring",
                   [(4, 2**18 + 3)], "do all ranks send at the same time?"),
        _hidden_case("1.3", _all_reduce_facts, _judge_ring_hidden(padded=False)),
    ],
    "1.4": [
        _values_case("each rank gets its chunk of the sum", "1.4", _judge_reduce_scatter,
                     [(4, (12,)), (3, (10,)), (5, (3,)), (1, (4,)), (3, (2, 5))]),
        _half_traffic_case("traffic: (N-1)/N of the tensor, to the right neighbour", 3, "1.4",
                           _judge_reduce_scatter, "reduce-scatter"),
        _half_hidden("1.4", _judge_reduce_scatter),
    ],
    "1.5": [
        _values_case("every rank gets every tensor", "1.5", _judge_all_gather,
                     [(4, (2, 3)), (3, (5,)), (1, (2,)), (5, (1,))]),
        _values_case("new tensors: no entry is the caller's tensor", "1.5",
                     _judge_new_tensors, [(4, (2, 3)), (1, (2,))], points=1),
        _half_traffic_case("traffic: N-1 tensors, to the right neighbour", 1, "1.5",
                           _judge_all_gather, "all-gather"),
        _half_hidden("1.5", _judge_all_gather),
    ],
    "1.6": [
        _sums_case("sums in place, N = 1 to 7", 2, "1.6",
                   [(1, 4), (2, 5), (3, 6), (4, 4), (5, 3), (6, 7), (7, 10)]),
        _tree_traffic(),
        _meta_case("1.6"),
        _time_case("time: both subtrees at once, on a fully connected cluster", "1.6",
                   binary_tree_all_reduce, "reference binary tree", [(7, 4096), (6, 4096)],
                   "on this cluster a rank can take both children's messages (and send to "
                   "both) at once: does it wait for one before it starts on the other, or wait "
                   "for ranks outside its subtree?", cluster=fully_connected,
                   faster="a binary tree can be: does it follow the tree?"),
        _hidden_case("1.6", _all_reduce_facts, _judge_tree_hidden, points=2),
    ],
    "1.7": [
        _sums_case("sums in place, any size", 2, "1.7",
                   [(4, 1000), (3, 10), (5, 3), (2, 1), (1, 4)]),
        _traffic_case("traffic: 2(N-1)/N of the tensor, to the right neighbour", 3, "1.7",
                      padded=True),
        _meta_case("1.7"),
        _time_case("time: as fast as the ring", "1.7", all_reduce_ring, "ring",
                   [(4, 2**18 + 3)], "do all ranks send at the same time?"),
        _hidden_case("1.7", _all_reduce_facts, _judge_ring_hidden(padded=True), points=2),
    ],
}
