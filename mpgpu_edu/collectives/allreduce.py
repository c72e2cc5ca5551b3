"""All-reduce three ways: naive (through rank 0), binomial tree, ring.

After ``all_reduce`` every rank's ``tensor`` holds the sum (or mean) of all ranks' tensors,
in place, as after ``torch.distributed.all_reduce``. This is the gradient averaging of data
parallel training. The three algorithms give the same result (up to rounding: they add in
different orders) and differ in who sends how much, when:

    algo   time for S bytes on N ranks          bytes the busiest rank sends (and receives)
    naive  2(N-1)(alpha + S/beta)               (N-1) S          rank 0
    tree   2 ceil(log2 N)(alpha + S/beta)       ceil(log2 N) S   rank 0
    ring   2(N-1) alpha + 2(N-1)/N S/beta       2(N-1)/N S       every rank

The ring's bandwidth term barely grows with N: it is the choice for large tensors (NCCL's
default); the tree's few rounds win for small ones, where alpha dominates. Closed forms and
their derivations: ``mpgpu_edu.collectives.cost``. The cost lines hold on the uniform
textbook cluster, where additions are free; a preset also charges every addition on the
roofline (bytes over memory bandwidth, plus a kernel launch), and its links may be shared
(host memory on PCIe workstations, a switch uplink), so measured times there sit above them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mpgpu_edu.collectives.allgather import ring_all_gather_chunks, ring_reduce_scatter_chunks
from mpgpu_edu.collectives.basic import (broadcast, broadcast_tree, check_op, finish_op,
                                         flat_view, reduce, reduce_tree)
from mpgpu_edu.comm import Communicator


def all_reduce_naive(comm: Communicator, tensor: torch.Tensor, op: str = "sum") -> None:
    """All-reduce through rank 0: ``reduce`` to rank 0, then ``broadcast`` from it.

    Not used in practice, but a good start: it is what a parameter server does. Rank 0
    receives the N - 1 tensors one by one, then sends the result N - 1 times, while the
    other ranks' links sit idle.
    Cost: 2(N - 1)(alpha + S / beta), plus rank 0's N - 1 additions on a preset (free on the
    uniform cluster); rank 0 receives (N - 1) S bytes and sends (N - 1) S bytes, every other
    rank sends and receives S."""
    check_op(op, tensor)
    reduce(comm, tensor, root=0, op=op)  # the mean is taken once, on rank 0
    broadcast(comm, tensor, root=0)


def all_reduce_tree(comm: Communicator, tensor: torch.Tensor, op: str = "sum") -> None:
    """All-reduce along a binomial tree: ``reduce_tree`` to rank 0, then ``broadcast_tree``.

    Idea: halving the number of active ranks each round, instead of one rank talking to
    everybody, takes ceil(log2 N) rounds each way instead of N - 1.
    Cost: 2 ceil(log2 N)(alpha + S / beta). Still every round moves the whole tensor, so
    for large S the ring wins."""
    check_op(op, tensor)
    reduce_tree(comm, tensor, root=0, op=op)
    broadcast_tree(comm, tensor, root=0)


def all_reduce_ring(comm: Communicator, tensor: torch.Tensor, op: str = "sum",
                    buffer: torch.Tensor | None = None) -> None:
    """Ring all-reduce: ring reduce-scatter, then ring all-gather, over N chunks.

    Idea: split the tensor into N chunks (``torch.tensor_split``). In N - 1 reduce-scatter
    steps every rank sends one chunk to its right neighbour and adds the chunk from its left
    one; then rank r holds the full sum of chunk (r + 1) % N (the picture of
    ``mpgpu_edu.viz.ring``). In N - 1 all-gather steps the full sums travel round the ring.
    Cost: 2(N - 1) steps, each alpha + S / (N beta): 2(N - 1) alpha + 2(N - 1)/N S / beta
    on the uniform cluster (a preset adds N - 1 chunk additions on the roofline); every rank
    sends and receives 2(N - 1)/N S bytes (exactly so when N divides the number of elements).

    ``buffer``: optional scratch space of at least ceil(numel / N) elements that the caller
    keeps between calls (a fresh buffer is fresh memory the first receive must fault in)."""
    check_op(op, tensor)
    n = comm.world_size
    with flat_view(tensor) as flat:
        chunks = list(torch.tensor_split(flat, n))
        # One receive buffer for all 2(N - 1) steps; chunk 0 is the longest.
        longest = chunks[0].numel()
        if buffer is None or buffer.numel() < longest or buffer.dtype != flat.dtype:
            buffer = torch.empty_like(chunks[0])
        buffer = buffer.view(-1)[:longest]
        ring_reduce_scatter_chunks(comm, chunks, buffer, shift=1)
        # Divide once, by the chunk's owner, so every rank ends with identical numbers.
        finish_op(chunks[(comm.rank + 1) % n], op, n)
        ring_all_gather_chunks(comm, chunks, shift=1)


ALGORITHMS: dict[str, Callable[[Communicator, torch.Tensor, str], None]] = {
    "naive": all_reduce_naive,
    "tree": all_reduce_tree,
    "ring": all_reduce_ring,
}


def all_reduce(comm: Communicator, tensor: torch.Tensor, op: str = "sum",
               algo: str = "ring") -> None:
    """All-reduce ``tensor`` in place with the algorithm named ``algo`` (a key of
    ``ALGORITHMS``: ``"naive"``, ``"tree"`` or ``"ring"``): afterwards every rank holds the
    sum of every rank's tensor (``op="sum"``) or their mean (``op="mean"``: the sum divided by
    the world size). Cost: see each algorithm."""
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algo!r}: choose one of "
                         + ", ".join(ALGORITHMS))
    ALGORITHMS[algo](comm, tensor, op)
