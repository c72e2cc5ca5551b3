"""Stale synchronous parallel (SSP) as an SPMD program: the same protocol as the event
simulation of ``ps.async_``, on ``comm.recv_any``: the server takes whichever gradient comes
first (in simulated time on the simulator, in real time on gloo) and holds back a worker that
is more than ``staleness_bound`` gradients ahead of the slowest."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mpgpu_edu.comm.base import Communicator


def ssp_program(comm: Communicator, worker_seconds: Sequence[float], numel: int, steps: int,
                staleness_bound: int, lr: float = 0.1,
                server_seconds: float | None = None) -> dict:
    """SSP as SPMD: the last rank serves, worker ``w`` computes ``steps`` gradients (of the
    quadratic ``0.5 |params - w|^2``, in ``worker_seconds[w]`` each), sends each and waits
    for the parameters. The server applies every gradient the moment it arrives
    (``comm.recv_any``) and sends the parameters back at once, unless that worker is more
    than ``staleness_bound`` gradients ahead of the slowest: then it holds them back until
    the slowest catches up. Nothing is dropped. Each update takes ``server_seconds`` on the
    server (as in ``async_ps``); ``None`` lets the simulator time the update itself (its
    bytes over memory bandwidth, plus a kernel launch).

    Returns, on the server, ``{"workers", "staleness", "held", "held_by", "params"}`` (who
    sent each applied gradient, its staleness, how many times a worker was held, and that
    count per worker); ``{}`` on workers."""
    server = comm.world_size - 1
    params = torch.zeros(numel)
    if comm.rank != server:
        for step in range(steps):
            with comm.compute("backward", f"gradient {step}", seconds=worker_seconds[comm.rank]):
                grad = params - float(comm.rank)
            comm.send(grad, server)
            comm.recv(params, server)
        return {}
    workers = list(range(server))
    clock, pulled, held = [0] * server, [0] * server, set()
    log: dict = {"workers": [], "staleness": [], "held": 0, "held_by": [0] * server}
    buffer = torch.empty(numel)
    for version in range(steps * server):
        src = comm.recv_any(buffer, [w for w in workers if clock[w] < steps and w not in held])
        with comm.compute("optimizer", f"apply {version}", seconds=server_seconds):
            params.sub_(buffer, alpha=lr)
        clock[src] += 1
        log["workers"].append(src)
        log["staleness"].append(version - pulled[src])
        held.add(src)
        for w in sorted(held):  # src, and any held worker the slowest now lets go
            if clock[w] - min(clock) <= staleness_bound:
                held.discard(w)
                pulled[w] = version + 1
                comm.send(params, w)
            elif w == src:
                log["held"] += 1
                log["held_by"][w] += 1
    log["params"] = params
    return log
