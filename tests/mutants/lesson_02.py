"""Plausible wrong answers for lesson 02 (see tests/mutants/__init__.py)."""

from __future__ import annotations

from typing import Any

import torch


def sgd_update(params: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """The exercise file's SGD step, by the name a learner's file has it (the checks count
    its calls)."""
    params.sub_(grad, alpha=lr)


def _workers(comm: Any) -> list[int]:
    return [r for r in range(comm.world_size) if r != comm.rank]


# ---- 2.1 ----------------------------------------------------------------------------------

def worker_never_waits(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                       server: int) -> None:
    """Sends the gradient but starts the receive and never waits for it: params are read
    before the new values are in."""
    comm.send(grad, server)
    comm.irecv(torch.empty_like(params), server)


def worker_updates_itself(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                          server: int) -> None:
    """Receives into a fresh buffer and forgets to copy it into params."""
    comm.send(grad, server)
    fresh = torch.empty_like(params)
    comm.recv(fresh, server)


def worker_sends_to_rank_zero(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                              server: int) -> None:
    """Assumes the server is rank 0 whatever ``server`` says."""
    comm.send(grad, 0 if comm.rank != 0 else server)
    comm.recv(params, 0 if comm.rank != 0 else server)


def worker_leaves_its_receive(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                              server: int) -> None:
    """irecv straight into params and returns without waiting: the simulator delivers the
    values when the message matches, but on gloo or NCCL params may not be filled yet."""
    comm.send(grad, server)
    comm.irecv(params, server)


def worker_leaves_its_send(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                           server: int) -> None:
    """isend of the gradient, never waited on."""
    comm.isend(grad, server)
    comm.recv(params, server)


def worker_receives_into_grad(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                              server: int) -> None:
    """Uses the caller's gradient as the receive buffer, then copies it into params."""
    comm.send(grad, server)
    comm.recv(grad, server)
    params.copy_(grad)


def worker_through_float32(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                           server: int) -> None:
    """Receives into torch.empty(shape), float32 whatever the parameters' dtype, and copies."""
    comm.send(grad, server)
    buffer = torch.empty(params.shape)
    comm.recv(buffer, server)
    params.copy_(buffer)


# ---- 2.2 ----------------------------------------------------------------------------------

def _total(comm: Any, params: torch.Tensor, make: Any = torch.empty_like) -> torch.Tensor:
    """The sum of every worker's gradient, received one after the other into ``make``'s
    buffers (the solution's way)."""
    total, buffer = make(params).zero_(), make(params)
    for w in _workers(comm):
        comm.recv(buffer, w)
        total.add_(buffer)
    return total


def _send_params(comm: Any, params: torch.Tensor, wait: bool = True) -> None:
    for w in _workers(comm):
        work = comm.isend(params, w)
        if wait:
            work.wait()


def _per_arrival(comm: Any, params: torch.Tensor, lr: float, factor: float) -> None:
    """An SGD step as each gradient arrives, with ``factor`` x 1/(N-1) of it."""
    buffer = torch.empty_like(params)
    workers = _workers(comm)
    for w in workers:
        comm.recv(buffer, w)
        params.sub_(buffer / len(workers) * factor, alpha=lr)
    _send_params(comm, params)


def server_sums(comm: Any, params: torch.Tensor, lr: float) -> None:
    """Sum instead of mean: the step is N - 1 times too large."""
    params.sub_(_total(comm, params), alpha=lr)
    _send_params(comm, params)


def server_averages_over_world(comm: Any, params: torch.Tensor, lr: float) -> None:
    """Divides by the world size N, counting the server as a worker."""
    params.sub_(_total(comm, params) / comm.world_size, alpha=lr)
    _send_params(comm, params)


def server_updates_per_gradient(comm: Any, params: torch.Tensor, lr: float) -> None:
    """Updates as each gradient arrives, before all are in (each with 1/(N-1) of it)."""
    _per_arrival(comm, params, lr, 1.0001)


def server_steps_per_gradient_exactly(comm: Any, params: torch.Tensor, lr: float) -> None:
    """One SGD step per arriving gradient with 1/(N-1) of it: with plain SGD the same numbers
    as one step on the mean, but the parameters change before every gradient is in."""
    _per_arrival(comm, params, lr, 1.0)


def server_leaves_its_sends(comm: Any, params: torch.Tensor, lr: float) -> None:
    """Sends the new parameters with isend and never waits on them."""
    params.sub_(_total(comm, params) / len(_workers(comm)), alpha=lr)
    _send_params(comm, params, wait=False)


def server_steps_per_arrival_on_a_copy(comm: Any, params: torch.Tensor, lr: float) -> None:
    """One sgd_update per arriving gradient, on a copy copied into params at the end: the
    caller's params change once, but the step is N - 1 partial updates."""
    buffer, new = torch.empty_like(params), params.clone()
    workers = _workers(comm)
    for w in workers:
        comm.recv(buffer, w)
        sgd_update(new, buffer / len(workers), lr)
    params.copy_(new)
    _send_params(comm, params)


def server_float32_buffers(comm: Any, params: torch.Tensor, lr: float) -> None:
    """Receive buffer and sum made with torch.empty(shape): float32 whatever the parameters'
    dtype."""
    total = _total(comm, params, make=lambda p: torch.empty(p.shape))
    sgd_update(params, total / len(_workers(comm)), lr)
    _send_params(comm, params)


# ---- 2.3 ----------------------------------------------------------------------------------

def loop_in_rank_order(comm: Any, params: torch.Tensor, steps: int, lr: float) -> None:
    """Receives in rank order: right values, but a fast worker's gradient waits behind a
    slow worker's."""
    workers = _workers(comm)
    buffer = torch.empty_like(params)
    for _ in range(steps):
        total = torch.zeros_like(params)
        for w in workers:
            comm.recv(buffer, w)
            total.add_(buffer)
        params.sub_(total / len(workers), alpha=lr)
        for w in workers:
            comm.send(params, w)


def loop_updates_on_arrival(comm: Any, params: torch.Tensor, steps: int, lr: float) -> None:
    """Updates the parameters as each gradient arrives instead of after all of the step's
    are in: later gradients of the step see other parameters than the workers used."""
    workers = _workers(comm)
    buffer = torch.empty_like(params)
    for _ in range(steps):
        waiting = list(workers)
        while waiting:
            src = comm.recv_any(buffer, waiting)
            waiting.remove(src)
            params.sub_(buffer * (1.0 + 0.1 * len(waiting)) / len(workers), alpha=lr)
        for w in workers:
            comm.send(params, w)


def loop_updates_each_arrival_by_its_share(comm: Any, params: torch.Tensor, steps: int,
                                            lr: float) -> None:
    """Applies each gradient's share, ``sgd_update(params, buffer / (N - 1), lr)``, the
    moment it arrives. With plain SGD the parameters sent back are the same, but the
    server's parameters change before every gradient of the step is in (with momentum or
    Adam the result would differ)."""
    workers = _workers(comm)
    buffer = torch.empty_like(params)
    for _ in range(steps):
        waiting = list(workers)
        while waiting:
            waiting.remove(comm.recv_any(buffer, waiting))
            params.sub_(buffer / len(workers), alpha=lr)
        for w in workers:
            comm.send(params, w)


def loop_never_waits_its_sends(comm: Any, params: torch.Tensor, steps: int,
                               lr: float) -> None:
    """Sends the parameters with isend and never waits on the works: the next step's
    update may overwrite params while they are still in flight."""
    workers = _workers(comm)
    buffer = torch.empty_like(params)
    for _ in range(steps):
        total, waiting = torch.zeros_like(params), list(workers)
        while waiting:
            waiting.remove(comm.recv_any(buffer, waiting))
            total.add_(buffer)
        params.sub_(total / len(workers), alpha=lr)
        for w in workers:
            comm.isend(params, w)


def loop_sums(comm: Any, params: torch.Tensor, steps: int, lr: float) -> None:
    """Sum instead of mean, gradients as they arrive."""
    workers = _workers(comm)
    buffer = torch.empty_like(params)
    for _ in range(steps):
        total, waiting = torch.zeros_like(params), list(workers)
        while waiting:
            src = comm.recv_any(buffer, waiting)
            waiting.remove(src)
            total.add_(buffer)
        params.sub_(total, alpha=lr)
        for w in workers:
            comm.send(params, w)


def loop_one_step_only(comm: Any, params: torch.Tensor, steps: int, lr: float) -> None:
    """Serves the first step and returns: later steps' gradients find nobody."""
    workers = _workers(comm)
    buffer, total = torch.empty_like(params), torch.zeros_like(params)
    for w in workers:
        comm.recv(buffer, w)
        total.add_(buffer)
    params.sub_(total / len(workers), alpha=lr)
    for w in workers:
        comm.send(params, w)


# ---- 2.4 ----------------------------------------------------------------------------------

def _exchange(comm: Any, params: torch.Tensor, grad: torch.Tensor, lr: float,
              bounds: list[int], divide_by: int, into_grad: bool = False) -> None:
    n, me = comm.world_size, comm.rank
    others = [r for r in range(n) if r != me]
    gs = [grad[bounds[k]:bounds[k + 1]] for k in range(n)]
    ps = [params[bounds[k]:bounds[k + 1]] for k in range(n)]
    inbox = {r: torch.empty_like(gs[me]) for r in others}
    works = [comm.isend(gs[r].contiguous(), r, tag=0) for r in others]
    works += [comm.irecv(inbox[r], r, tag=0) for r in others]
    for w in works:
        w.wait()
    total = gs[me] if into_grad else gs[me].clone()
    for r in others:
        total.add_(inbox[r])
    ps[me].sub_(total / divide_by, alpha=lr)
    mine = ps[me].clone()
    got = {r: torch.empty_like(ps[r]) for r in others}
    works = [comm.isend(mine, r, tag=1) for r in others]
    works += [comm.irecv(got[r], r, tag=1) for r in others]
    for w in works:
        w.wait()
    for r in others:
        ps[r].copy_(got[r])


def sharded_last_takes_the_rest(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                                lr: float) -> None:
    """Shard boundaries off: numel // N each and the last rank takes the remainder, instead
    of torch.tensor_split's sizes (the first numel % N shards one larger)."""
    n, numel = comm.world_size, params.numel()
    size = numel // n
    bounds = [k * size for k in range(n)] + [numel]
    _exchange(comm, params, grad, lr, bounds, n)


def sharded_divides_by_others(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                              lr: float) -> None:
    """Averages over the N - 1 other ranks: as if the server's own gradient did not count."""
    n, numel = comm.world_size, params.numel()
    bounds = [0]
    for piece in torch.tensor_split(torch.arange(numel), n):
        bounds.append(bounds[-1] + len(piece))
    _exchange(comm, params, grad, lr, bounds, max(n - 1, 1))


def sharded_never_gathers(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                          lr: float) -> None:
    """Updates its own shard and stops: the other shards of params stay old (a
    reduce-scatter without the all-gather)."""
    n, me = comm.world_size, comm.rank
    others = [r for r in range(n) if r != me]
    gs, ps = torch.tensor_split(grad, n), torch.tensor_split(params, n)
    inbox = {r: torch.empty_like(gs[me]) for r in others}
    works = [comm.isend(gs[r].contiguous(), r) for r in others]
    works += [comm.irecv(inbox[r], r) for r in others]
    for w in works:
        w.wait()
    total = gs[me].clone()
    for r in others:
        total.add_(inbox[r])
    ps[me].sub_(total / n, alpha=lr)


def sharded_never_waits_its_sends(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                                  lr: float) -> None:
    """Waits on its irecv works only: the isend works are dropped, so a sent shard may still
    be in flight when the caller changes the tensor."""
    n, me = comm.world_size, comm.rank
    others = [r for r in range(n) if r != me]
    gs, ps = torch.tensor_split(grad, n), torch.tensor_split(params, n)
    inbox = {r: torch.empty_like(gs[me]) for r in others}
    for r in others:
        comm.isend(gs[r].contiguous(), r)
    for w in [comm.irecv(inbox[r], r) for r in others]:
        w.wait()
    ps[me].sub_((gs[me] + sum(inbox.values(), torch.zeros_like(gs[me]))) / n, alpha=lr)
    mine = ps[me].clone()
    got = {r: torch.empty_like(ps[r]) for r in others}
    for r in others:
        comm.isend(mine, r)
    for w in [comm.irecv(got[r], r) for r in others]:
        w.wait()
    for r in others:
        ps[r].copy_(got[r])


def sharded_blocking_sends_first(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                                 lr: float) -> None:
    """Blocking sends to every other rank before any receive: every rank waits in its first
    send for a receive nobody has posted yet."""
    n, me = comm.world_size, comm.rank
    gs, ps = torch.tensor_split(grad, n), torch.tensor_split(params, n)
    total = gs[me].clone()
    for r in range(n):
        if r != me:
            comm.send(gs[r].contiguous(), r)
    for r in range(n):
        if r != me:
            buf = torch.empty_like(gs[me])
            comm.recv(buf, r)
            total.add_(buf)
    ps[me].sub_(total / n, alpha=lr)


def sharded_adds_into_grad(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                           lr: float) -> None:
    """Right step, but adds the others' shards into a view of the caller's grad."""
    n = comm.world_size
    sizes = [len(p) for p in torch.tensor_split(params, n)]
    bounds = [sum(sizes[:k]) for k in range(n + 1)]
    _exchange(comm, params, grad, lr, bounds, n, into_grad=True)


def sharded_updates_per_arrival(comm: Any, params: torch.Tensor, grad: torch.Tensor,
                                lr: float) -> None:
    """Updates its shard with its own gradient's share first, then with each other rank's
    share as it arrives: right numbers with plain SGD, N updates instead of one."""
    n, me = comm.world_size, comm.rank
    others = [r for r in range(n) if r != me]
    gs, ps = torch.tensor_split(grad, n), torch.tensor_split(params, n)
    inbox = {r: torch.empty_like(gs[me]) for r in others}
    works = [comm.isend(gs[r].contiguous(), r) for r in others]
    sgd_update(ps[me], gs[me] / n, lr)
    for r in others:
        comm.recv(inbox[r], r)
        sgd_update(ps[me], inbox[r] / n, lr)
    for w in works:
        w.wait()
    mine = ps[me].clone()
    works = [comm.isend(mine, r, tag=1) for r in others]
    got = {r: torch.empty_like(ps[r]) for r in others}
    for r in others:
        comm.recv(got[r], r, tag=1)
        ps[r].copy_(got[r])
    for w in works:
        w.wait()


MUTANTS: dict[str, list[str]] = {
    "2.1": ["worker_never_waits", "worker_updates_itself", "worker_sends_to_rank_zero",
            "worker_leaves_its_receive", "worker_leaves_its_send", "worker_receives_into_grad",
            "worker_through_float32"],
    "2.2": ["server_sums", "server_averages_over_world", "server_updates_per_gradient",
            "server_steps_per_gradient_exactly", "server_leaves_its_sends",
            "server_steps_per_arrival_on_a_copy", "server_float32_buffers"],
    "2.3": ["loop_in_rank_order", "loop_updates_on_arrival",
            "loop_updates_each_arrival_by_its_share", "loop_never_waits_its_sends",
            "loop_sums", "loop_one_step_only"],
    "2.4": ["sharded_last_takes_the_rest", "sharded_divides_by_others",
            "sharded_never_gathers", "sharded_never_waits_its_sends",
            "sharded_blocking_sends_first", "sharded_adds_into_grad",
            "sharded_updates_per_arrival"],
}
