"""Checks of lesson 01: message cost and collectives built from send and recv.

Every collective case runs the learner's function on the simulator with the built-in
collectives disabled (``from_scratch``) and checks values, bytes and messages per rank, who
talks to whom, and for the ring the time against the package's ``all_reduce_ring``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_reduce_ring
from mpgpu_edu.grading.checks import Case, Evidence
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, from_scratch,
                                               property_check, rank_inputs, run_spmd, showing,
                                               uniform)

Impl = Callable[..., Any]


# ---- 1.1 point-to-point cost ---------------------------------------------------------------

def _p2p_program(src: int, dst: int, nbytes: int) -> Callable[..., None]:
    def program(comm: Any) -> None:
        buffer = torch.zeros(nbytes, dtype=torch.uint8)
        if comm.rank == src:
            comm.send(buffer, dst)
        elif comm.rank == dst:
            comm.recv(buffer, src)
    return program


def _p2p_against_sim(impl: Impl, cluster: Cluster, pairs: list[tuple[int, int]],
                     sizes: list[int]) -> None:
    for src, dst in pairs:
        for nbytes in sizes:
            measured = run_spmd(_p2p_program(src, dst, nbytes), cluster).trace.makespan
            got = impl(cluster, src, dst, nbytes)
            expect(isinstance(got, (int, float)), f"p2p_time should return seconds as a "
                                                  f"float, got {type(got).__name__}")
            expect(abs(got - measured) <= 1e-9 * measured + 1e-15,
                   f"p2p_time({cluster.name}, {src}, {dst}, {nbytes}) returned {got:.6g} s; "
                   f"the simulator measures {measured:.6g} s")


def _p2p_uniform(impl: Impl) -> None:
    _p2p_against_sim(impl, uniform(2), [(0, 1), (1, 0)], [0, 1, 1000, 10**6])


def _p2p_preset(impl: Impl) -> None:
    _p2p_against_sim(impl, Cluster.preset("4xRTX4090-pcie"), [(0, 2)], [4096, 2**20])


def _p2p_visible(impl: Impl) -> None:
    _p2p_against_sim(impl, Cluster.preset("8xRTX4090-pcie", visible="4,0"), [(0, 1)],
                     [2**20])
    _p2p_against_sim(impl, Cluster.preset("2x8xH100-ib", visible="0,9"), [(1, 0)], [2**20])


# ---- all-reduce: shared parts --------------------------------------------------------------

def _all_reduce_program(impl: Impl, inputs: list[torch.Tensor]) -> Callable[..., Any]:
    def program(comm: Any) -> tuple[torch.Tensor, Any]:
        tensor = inputs[comm.rank].clone()
        returned = impl(comm, tensor)
        return tensor, returned
    return program


def _run_all_reduce(impl: Impl, exercise: str, n: int, numel: int, seed: int = 0,
                    cluster: Cluster | None = None) -> Any:
    inputs = rank_inputs(n, numel, seed)
    want = torch.stack(inputs).sum(0)
    with from_scratch(impl, exercise):
        result = run_spmd(_all_reduce_program(impl, inputs), cluster or uniform(n))
    for rank, (tensor, returned) in enumerate(result.results):
        if torch.equal(tensor, inputs[rank]) and n > 1 and not torch.equal(want, inputs[rank]):
            hint = (" (you returned the result: write it into the tensor instead)"
                    if isinstance(returned, torch.Tensor) else "")
            expect(False, f"rank {rank}'s tensor is unchanged: the all-reduce works in "
                          f"place{hint}")
        expect_close(tensor, want, f"rank {rank} of {n}, {numel} elements")
    return result


def _sums(exercise: str, sizes: list[tuple[int, int]]) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        for n, numel in sizes:
            _run_all_reduce(impl, exercise, n, numel)
    return run


def _all_reduce_property(exercise: str) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        from hypothesis import strategies as st

        def body(world_size: int, numel: int, seed: int) -> None:
            _run_all_reduce(impl, exercise, world_size, numel, seed)

        property_check(body, world_size=st.integers(1, 6), numel=st.integers(1, 40),
                       seed=st.integers(0, 3))
    return run


# ---- 1.2 naive ------------------------------------------------------------------------------

def _naive_traffic(impl: Impl) -> None:
    n, numel = 4, 1000
    size = bytes_of(numel)
    result = _run_all_reduce(impl, "1.2", n, numel)
    stats = result.stats
    expect(stats[0].bytes_received == (n - 1) * size and stats[0].bytes_sent == (n - 1) * size,
           f"rank 0 should receive and send (N-1) x {size} bytes, it received "
           f"{stats[0].bytes_received} and sent {stats[0].bytes_sent}")
    for rank in range(1, n):
        expect(dict(stats[rank].sent_to) == {0: size},
               f"rank {rank} should send its {size} bytes to rank 0 only, it sent "
               f"{dict(stats[rank].sent_to)} (bytes per peer)")
        expect(stats[rank].bytes_received == size,
               f"rank {rank} should receive the sum once ({size} bytes), it received "
               f"{stats[rank].bytes_received}")
    expect(stats[0].messages_sent + stats[0].messages_received == 2 * (n - 1),
           f"rank 0 should exchange 2(N-1) = {2 * (n - 1)} messages, it exchanged "
           f"{stats[0].messages_sent + stats[0].messages_received}")


# ---- 1.3 ring -------------------------------------------------------------------------------

def _ring_traffic(impl: Impl) -> None:
    for n, numel in [(4, 1000), (3, 1000), (5, 12)]:
        result = _run_all_reduce(impl, "1.3", n, numel)
        low, high = (2 * (n - 1) * bytes_of(numel // n),
                     2 * (n - 1) * bytes_of(-(-numel // n)))
        for rank, stats in enumerate(result.stats):
            right = (rank + 1) % n
            expect(set(stats.sent_to) == {right},
                   f"N={n}: rank {rank} sent to ranks {sorted(stats.sent_to)}; on a ring it "
                   f"sends to its right neighbour {right} only")
            expect(low <= stats.bytes_sent <= high,
                   f"N={n}, {bytes_of(numel)} bytes: rank {rank} sent {stats.bytes_sent} bytes;"
                   f" a ring sends 2(N-1)/N of the tensor, {low}..{high} bytes")
            expect(stats.messages_sent == 2 * (n - 1),
                   f"N={n}: rank {rank} sent {stats.messages_sent} messages; a ring takes "
                   f"2(N-1) = {2 * (n - 1)} steps of one message each")


def _ring_time(impl: Impl) -> Evidence:
    n, numel = 4, 2**18
    yours = _run_all_reduce(impl, "1.3", n, numel)

    def reference(comm: Any) -> None:
        all_reduce_ring(comm, torch.ones(numel))

    ref = run_spmd(reference, uniform(n))
    with showing(Evidence(traces={"yours": yours.trace,
                                  "reference (ring)": ref.trace})) as evidence:
        expect(yours.trace.makespan <= 1.1 * ref.trace.makespan,
               f"your all-reduce of 1 MiB on 4 ranks takes {yours.trace.makespan * 1e3:.3f} "
               f"ms, the ring {ref.trace.makespan * 1e3:.3f} ms: do all ranks send at the "
               "same time (isend before recv)?")
    return evidence


# ---- 1.4 reduce-scatter, 1.5 all-gather ---------------------------------------------------

def _run_reduce_scatter(impl: Impl, n: int, numel: int, seed: int = 0) -> Any:
    inputs = rank_inputs(n, numel, seed)
    chunks = torch.tensor_split(torch.stack(inputs).sum(0), n)

    def program(comm: Any) -> tuple[torch.Tensor, Any]:
        tensor = inputs[comm.rank].clone()
        return tensor, impl(comm, tensor)

    with from_scratch(impl, "1.4"):
        result = run_spmd(program, uniform(n))
    for rank, (tensor, got) in enumerate(result.results):
        expect(torch.equal(tensor, inputs[rank]),
               f"N={n}: rank {rank}'s input tensor was changed; reduce-scatter must leave it "
               "as it was (work on a copy)")
        expect_close(got, chunks[rank], f"N={n}, {numel} elements, rank {rank}'s chunk")
    return result


def _reduce_scatter_values(impl: Impl) -> None:
    for n, numel in [(4, 12), (3, 10), (5, 3), (1, 4)]:
        _run_reduce_scatter(impl, n, numel)


def _reduce_scatter_traffic(impl: Impl) -> None:
    n, numel = 4, 1000
    result = _run_reduce_scatter(impl, n, numel)
    want = (n - 1) * bytes_of(numel // n)
    for rank, stats in enumerate(result.stats):
        expect(set(stats.sent_to) == {(rank + 1) % n} and stats.bytes_sent == want
               and stats.messages_sent == n - 1,
               f"rank {rank} sent {stats.messages_sent} messages, {stats.bytes_sent} bytes to "
               f"{sorted(stats.sent_to)}; a ring reduce-scatter sends N-1 = {n - 1} chunks, "
               f"{want} bytes, to rank {(rank + 1) % n}")


def _run_all_gather(impl: Impl, n: int, shape: tuple[int, ...], seed: int = 0) -> Any:
    numel = 1
    for dim in shape:
        numel *= dim
    inputs = [t.reshape(shape) for t in rank_inputs(n, numel, seed)]

    def program(comm: Any) -> tuple[torch.Tensor, Any]:
        tensor = inputs[comm.rank].clone()
        return tensor, impl(comm, tensor)

    with from_scratch(impl, "1.5"):
        result = run_spmd(program, uniform(n))
    for rank, (tensor, got) in enumerate(result.results):
        expect(torch.equal(tensor, inputs[rank]), f"rank {rank}'s input tensor was changed")
        expect(isinstance(got, (list, tuple)) and len(got) == n,
               f"rank {rank} should return a list of {n} tensors, got {type(got).__name__}"
               + (f" of length {len(got)}" if isinstance(got, (list, tuple)) else ""))
        for source in range(n):
            expect_close(got[source], inputs[source],
                         f"N={n}: rank {rank}'s entry {source} (rank {source}'s tensor)")
            expect(got[source] is not tensor, f"rank {rank}: entry {rank} is the input "
                                              "tensor itself; return new tensors")
    return result


def _all_gather_values(impl: Impl) -> None:
    for n, shape in [(4, (2, 3)), (3, (5,)), (1, (2,)), (5, (1,))]:
        _run_all_gather(impl, n, shape)


def _all_gather_traffic(impl: Impl) -> None:
    n, shape = 4, (250,)
    result = _run_all_gather(impl, n, shape)
    want = (n - 1) * bytes_of(250)
    for rank, stats in enumerate(result.stats):
        expect(set(stats.sent_to) == {(rank + 1) % n} and stats.bytes_sent == want
               and stats.messages_sent == n - 1,
               f"rank {rank} sent {stats.messages_sent} messages, {stats.bytes_sent} bytes to "
               f"{sorted(stats.sent_to)}; a ring all-gather forwards N-1 = {n - 1} tensors, "
               f"{want} bytes, to rank {(rank + 1) % n}")


def _collective_property(run: Callable[..., Any], shape_of: Callable[[int], Any]
                         ) -> Callable[[Impl], None]:
    def check(impl: Impl) -> None:
        from hypothesis import strategies as st

        def body(world_size: int, numel: int, seed: int) -> None:
            run(impl, world_size, shape_of(numel), seed)

        property_check(body, world_size=st.integers(1, 6), numel=st.integers(1, 30),
                       seed=st.integers(0, 3))
    return check


CASES: dict[str, list[Case]] = {
    "1.1": [
        Case("uniform cluster: alpha + n / beta", 1, _p2p_uniform),
        Case("PCIe preset: matches a simulated send", 1, _p2p_preset),
        Case("logical ids under CUDA_VISIBLE_DEVICES", 1, _p2p_visible),
    ],
    "1.2": [
        Case("sums in place on 4 ranks", 1, _sums("1.2", [(4, 100)])),
        Case("world sizes 1, 2, 3, 5", 1, _sums("1.2", [(1, 5), (2, 5), (3, 7), (5, 11)])),
        Case("traffic: everything goes through rank 0", 2, _naive_traffic),
        Case("hidden: random sizes and world sizes", 1, _all_reduce_property("1.2"),
             hidden=True),
    ],
    "1.3": [
        Case("sums in place on 4 ranks", 2, _sums("1.3", [(4, 1000)])),
        Case("any size: uneven chunks, fewer elements than ranks", 2,
             _sums("1.3", [(3, 10), (5, 3), (2, 1), (1, 4)])),
        Case("traffic: 2(N-1)/N of the tensor, to the right neighbour", 3, _ring_traffic),
        Case("time: every link busy at once", 2, _ring_time),
        Case("hidden: random sizes and world sizes", 1, _all_reduce_property("1.3"),
             hidden=True),
    ],
    "1.4": [
        Case("each rank gets its chunk of the sum", 2, _reduce_scatter_values),
        Case("traffic: (N-1)/N of the tensor, to the right neighbour", 3,
             _reduce_scatter_traffic),
        Case("hidden: random sizes and world sizes", 1,
             _collective_property(_run_reduce_scatter, lambda numel: numel), hidden=True),
    ],
    "1.5": [
        Case("every rank gets every tensor", 2, _all_gather_values),
        Case("traffic: N-1 tensors, to the right neighbour", 2, _all_gather_traffic),
        Case("hidden: random sizes and world sizes", 1,
             _collective_property(_run_all_gather, lambda numel: (numel,)), hidden=True),
    ],
}
