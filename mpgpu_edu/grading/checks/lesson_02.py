"""Checks of lesson 02: the parameter server's worker and server steps.

Each case runs one side from the learner and the other side from the reference below, on
the simulator: the learner's workers against a reference server, or the learner's server
against reference workers. Values are compared with one SGD step on the mean gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, from_scratch,
                                               property_check, rank_inputs, run_spmd)

Impl = Callable[..., Any]
LR = 0.1


def _reference_worker(comm: Any, params: torch.Tensor, grad: torch.Tensor, server: int) -> None:
    comm.send(grad, server)
    comm.recv(params, server)


def _reference_server(comm: Any, params: torch.Tensor, lr: float) -> None:
    workers = [r for r in range(comm.world_size) if r != comm.rank]
    total, buffer = torch.zeros_like(params), torch.empty_like(params)
    for worker in workers:
        comm.recv(buffer, worker)
        total.add_(buffer)
    params.sub_(total / len(workers), alpha=lr)
    for worker in workers:
        comm.send(params, worker)


def _setup(n: int, numel: int, server: int, seed: int) -> tuple[torch.Tensor, list, torch.Tensor]:
    params = torch.linspace(-1, 1, numel)
    grads = rank_inputs(n, numel, seed)
    mean = torch.stack([g for r, g in enumerate(grads) if r != server]).mean(0)
    return params, grads, params - LR * mean


def _run(impl: Impl, side: str, n: int, numel: int, server: int, seed: int = 0) -> Any:
    params, grads, want = _setup(n, numel, server, seed)

    def program(comm: Any) -> torch.Tensor:
        mine = params.clone()
        if comm.rank == server:
            (impl if side == "server" else _reference_server)(comm, mine, LR)
        elif side == "worker":
            impl(comm, mine, grads[comm.rank].clone(), server)
        else:
            _reference_worker(comm, mine, grads[comm.rank].clone(), server)
        return mine

    exercise = "2.1" if side == "worker" else "2.2"
    with from_scratch(impl, exercise):
        result = run_spmd(program, n)
    for rank, got in enumerate(result.results):
        who = "the server" if rank == server else f"worker {rank}"
        expect_close(got, want, f"N={n}, server {server}: parameters on {who} after the step")
    return result


def _values(side: str, setups: list[tuple[int, int]]) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        for n, server in setups:
            _run(impl, side, n, 10, server)
    return run


def _worker_traffic(impl: Impl) -> None:
    n, numel, server = 4, 100, 0
    result = _run(impl, "worker", n, numel, server)
    size = bytes_of(numel)
    for rank in range(1, n):
        stats = result.stats[rank]
        expect(dict(stats.sent_to) == {server: size} and stats.messages_sent == 1
               and stats.bytes_received == size,
               f"worker {rank} should send one gradient ({size} bytes) to the server and "
               f"receive the parameters once; it sent {dict(stats.sent_to)} (bytes per peer) "
               f"in {stats.messages_sent} messages and received {stats.bytes_received} bytes")


def _server_traffic(impl: Impl) -> None:
    n, numel, server = 5, 100, 0
    result = _run(impl, "server", n, numel, server)
    size = bytes_of(numel)
    stats = result.stats[server]
    want = {r: size for r in range(n) if r != server}
    expect(dict(stats.sent_to) == want and stats.bytes_received == (n - 1) * size,
           f"the server should receive one gradient from each of the {n - 1} workers and send "
           f"each the parameters once ({size} bytes each); it received {stats.bytes_received} "
           f"bytes and sent {dict(stats.sent_to)} (bytes per peer)")
    expect(stats.messages_sent == n - 1, f"the server sent {stats.messages_sent} messages, "
                                         f"expected one per worker ({n - 1})")


def _property(side: str) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        from hypothesis import strategies as st

        def body(world_size: int, numel: int, server: int, seed: int) -> None:
            _run(impl, side, world_size, numel, server % world_size, seed)

        property_check(body, world_size=st.integers(2, 6), numel=st.integers(1, 30),
                       server=st.integers(0, 5), seed=st.integers(0, 3))
    return run


CASES: dict[str, list[Case]] = {
    "2.1": [
        Case("sends the gradient, receives the new parameters", 1, _values("worker", [(3, 0)])),
        Case("the server need not be rank 0", 1, _values("worker", [(4, 2), (2, 1)])),
        Case("traffic: one message each way, with the server only", 1, _worker_traffic),
        Case("hidden: random sizes and servers", 1, _property("worker"), hidden=True),
    ],
    "2.2": [
        Case("averages the workers' gradients and updates", 2, _values("server", [(4, 0)])),
        Case("any server rank, N = 2, 3, 5", 1, _values("server", [(2, 1), (3, 2), (5, 4)])),
        Case("traffic: (N-1) gradients in, (N-1) parameter copies out", 2, _server_traffic),
        Case("hidden: random sizes and servers", 1, _property("server"), hidden=True),
    ],
}
