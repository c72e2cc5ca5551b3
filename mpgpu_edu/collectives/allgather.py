"""All-gather and reduce-scatter on a ring: the two halves of ring all-reduce.

The N ranks form a ring: rank r sends only to ``right = (r + 1) % N`` and receives only from
``left = (r - 1) % N``. Every step, every rank sends one chunk and receives one, so all N
links work at once and no rank (no link) carries more than the others.

Chunks follow ``torch.tensor_split(flat, N)``: chunk i of a tensor of E elements has
``E // N`` or ``E // N + 1`` elements (the first ``E % N`` chunks are the longer ones), so any
size works, including fewer elements than ranks (some chunks are empty; their messages still
pay alpha).

Each step posts ``isend`` to the right *before* the blocking ``recv`` from the left. With a
blocking ``send`` first, every rank would wait for its right neighbour to receive, and the
right neighbour would itself be waiting in its ``send``: a cycle, i.e. a deadlock.

Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
JPDC 2009.
"""

from __future__ import annotations

import torch

from mpgpu_edu.collectives.basic import check_op, finish_op
from mpgpu_edu.comm import Communicator


def ring_step(comm: Communicator, send: torch.Tensor, recv: torch.Tensor) -> None:
    """One ring step: send ``send`` to the right neighbour while receiving ``recv`` from the
    left one. Returns when both are done, so ``send`` may be changed afterwards."""
    n = comm.world_size
    work = comm.isend(send, (comm.rank + 1) % n)
    comm.recv(recv, (comm.rank - 1) % n)
    work.wait()


def ring_reduce_scatter_chunks(comm: Communicator, chunks: list[torch.Tensor],
                               buffer: torch.Tensor, shift: int = 0) -> None:
    """Ring reduce-scatter in place: afterwards chunk ``(rank + shift) % N`` of ``chunks``
    holds the sum of that chunk over all ranks (the other chunks hold partial sums).

    ``chunks`` are this rank's N pieces (views of one tensor); ``buffer`` is a 1-D scratch
    tensor at least as long as the longest chunk, reused every step.
    Idea: in step k (k = 0 .. N-2) rank r sends chunk ``(r + shift - 1 - k)`` and adds the
    chunk it receives, ``(r + shift - 2 - k)``, into its own. A chunk picks up one more
    rank's contribution per hop; after N - 1 hops it has all N.
    Cost: N - 1 steps of alpha + S / (N beta)."""
    n, owned = comm.world_size, comm.rank + shift
    for k in range(n - 1):
        outgoing = chunks[(owned - 1 - k) % n]
        incoming = chunks[(owned - 2 - k) % n]
        received = buffer[: incoming.numel()]  # chunks differ by one element at most
        ring_step(comm, outgoing, received)
        incoming.add_(received)


def ring_all_gather_chunks(comm: Communicator, chunks: list[torch.Tensor],
                           shift: int = 0) -> None:
    """Ring all-gather in place: rank r starts owning chunk ``(r + shift) % N``; afterwards
    every rank holds every rank's owned chunk.

    Idea: in step k (k = 0 .. N-2) rank r forwards chunk ``(r + shift - k)``, which it owns
    or has just received, and receives chunk ``(r + shift - 1 - k)`` straight into place.
    Cost: N - 1 steps of alpha + S / (N beta); no buffer, no arithmetic."""
    n, owned = comm.world_size, comm.rank + shift
    for k in range(n - 1):
        ring_step(comm, chunks[(owned - k) % n], chunks[(owned - 1 - k) % n])


def all_gather(comm: Communicator, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank gets every rank's ``tensor``: returns ``[tensor of rank 0, ..., tensor of
    rank N-1]`` (new tensors shaped like ``tensor``; all ranks pass the same shape).

    Idea: place my tensor at slot ``rank`` of an N-slot output, then pass slots around the
    ring (``ring_all_gather_chunks``); the returned tensors are views of that one output.
    Cost (ring): N - 1 steps of alpha + s / beta for tensors of s bytes; each rank sends
    and receives (N - 1) s bytes."""
    n = comm.world_size
    out = torch.empty(n * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    slots = list(torch.tensor_split(out, n))  # equal slots: out holds N tensors
    slots[comm.rank].copy_(tensor.detach().reshape(-1))
    ring_all_gather_chunks(comm, slots)
    return [slot.view(tensor.shape) for slot in slots]


def reduce_scatter(comm: Communicator, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce every rank's ``tensor`` and give each rank one part of the result: returns
    chunk ``rank`` of ``torch.tensor_split(reduced.reshape(-1), N)`` (a new 1-D tensor;
    possibly empty when the tensor has fewer elements than there are ranks). ``tensor``
    itself is not changed.

    Idea: ring reduce-scatter (``ring_reduce_scatter_chunks``) on a copy, arranged so that
    rank r finishes with chunk r, as ``torch.distributed.reduce_scatter_tensor`` does.
    Cost (ring): N - 1 steps of alpha + S / (N beta); each rank sends (N - 1)/N of S."""
    check_op(op, tensor)
    n = comm.world_size
    flat = tensor.detach().reshape(-1).clone()  # a copy: the caller's tensor stays intact
    chunks = list(torch.tensor_split(flat, n))
    buffer = torch.empty_like(chunks[0])  # chunk 0 is the longest
    ring_reduce_scatter_chunks(comm, chunks, buffer)
    mine = chunks[comm.rank].clone()  # a copy, so the N-chunk scratch tensor can be freed
    finish_op(mine, op, n)
    return mine
