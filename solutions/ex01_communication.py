"""Lesson 01 exercises: the cost of a message, and all-reduce built from send and recv.

Every collective here is an SPMD function: every rank calls it with its own ``comm``. Run one
on the simulator with ``mpgpu_edu.launch(fn, cluster, ...)``; check it with
``mpgpu_edu.check("1.3")``. Build them from ``comm.send``, ``recv``, ``isend`` and ``irecv``
only: the checks refuse ``torch.distributed``'s collectives and ``mpgpu_edu.collectives``.
The function just below is solved for you: read it first.
"""

from __future__ import annotations

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import Communicator


# ---- worked example (solved, not graded) ---------------------------------------------------

def ring_shift(comm: Communicator, tensor: torch.Tensor) -> torch.Tensor:
    """Pass ``tensor`` one step round the ring: send it to the right neighbour
    ``(rank + 1) % N`` and return what the left neighbour ``(rank - 1) % N`` sent.

    Every rank sends and receives at once, so the send is posted with ``isend`` *before*
    the blocking ``recv``: if every rank began with a blocking ``send``, each would wait for
    its neighbour to receive, and the neighbour would be waiting in its own ``send``.
    Cost: one step, alpha + S / beta, every link busy at the same time.
    """
    n = comm.world_size
    received = torch.empty_like(tensor)
    work = comm.isend(tensor, (comm.rank + 1) % n)
    comm.recv(received, (comm.rank - 1) % n)
    work.wait()
    return received


# ---- exercises ------------------------------------------------------------------------------

def p2p_time(cluster: Cluster, src: int, dst: int, nbytes: int) -> float:
    """Seconds one message of ``nbytes`` bytes takes from logical device ``src`` to logical
    device ``dst`` of ``cluster`` when nothing else uses the link, in the alpha-beta model
    with the latency and bandwidth of the route between the two devices
    (``cluster.route(src, dst)``: ``help()`` on what it returns names its fields).

    >>> p2p_time(Cluster.uniform(2, alpha_s=1e-5, beta_Bps=1e9), 0, 1, 10**6)
    0.00101
    """
    ### BEGIN SOLUTION 1.1
    route = cluster.route(src, dst)
    return route.alpha_s + nbytes / route.beta_Bps
    ### END SOLUTION


def naive_all_reduce(comm: Communicator, tensor: torch.Tensor) -> None:
    """All-reduce (sum) through rank 0, in place: afterwards every rank's ``tensor`` holds
    the sum of all ranks' tensors.

    Traffic: every other rank sends its whole tensor to rank 0 once and receives the sum
    from rank 0 once; rank 0 talks to everybody.
    Cost: 2(N - 1)(alpha + S / beta); rank 0 receives (N - 1) S bytes and sends (N - 1) S.
    """
    ### BEGIN SOLUTION 1.2
    if comm.rank != 0:
        comm.send(tensor, 0)
        comm.recv(tensor, 0)
        return
    buffer = torch.empty_like(tensor)
    for peer in range(1, comm.world_size):
        comm.recv(buffer, peer)
        tensor.add_(buffer)
    for peer in range(1, comm.world_size):
        comm.send(tensor, peer)
    ### END SOLUTION


def ring_all_reduce(comm: Communicator, tensor: torch.Tensor) -> None:
    """Ring all-reduce (sum), in place: afterwards every rank's ``tensor`` holds the sum of
    all ranks' tensors. ``tensor`` is contiguous, of any number of elements (also fewer
    than N, or not divisible by N).

    Traffic: every rank sends to its right neighbour ``(rank + 1) % N`` only, 2(N - 1)
    messages of about S / N bytes each, all ranks sending at the same time.
    Cost: 2(N - 1) alpha + 2(N - 1)/N S / beta; every rank sends 2(N - 1)/N S bytes.
    """
    ### BEGIN SOLUTION 1.3
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    buffer = torch.empty_like(chunks[0])
    for k in range(n - 1):  # reduce-scatter: afterwards chunk `rank` holds the full sum
        incoming = chunks[(rank - 2 - k) % n]
        work = comm.isend(chunks[(rank - 1 - k) % n], right)
        comm.recv(buffer[: incoming.numel()], left)
        work.wait()
        incoming.add_(buffer[: incoming.numel()])
    for k in range(n - 1):  # all-gather: the full sums travel round
        work = comm.isend(chunks[(rank - k) % n], right)
        comm.recv(chunks[(rank - 1 - k) % n], left)
        work.wait()
    ### END SOLUTION


def ring_reduce_scatter(comm: Communicator, tensor: torch.Tensor) -> torch.Tensor:
    """Reduce-scatter (sum) on a ring: return chunk ``rank`` of
    ``torch.tensor_split(total.reshape(-1), N)``, where ``total`` is the sum of every
    rank's ``tensor`` (a new tensor, of ``tensor``'s dtype). Do not change ``tensor`` itself.

    Traffic: every rank sends to its right neighbour only, N - 1 messages of one chunk.
    Cost: (N - 1)(alpha + S / (N beta)); every rank sends (N - 1)/N of S.
    """
    ### BEGIN SOLUTION 1.4
    n, rank = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor.reshape(-1).clone(), n))
    buffer = torch.empty_like(chunks[0])
    for k in range(n - 1):
        incoming = chunks[(rank - 2 - k) % n]
        work = comm.isend(chunks[(rank - 1 - k) % n], (rank + 1) % n)
        comm.recv(buffer[: incoming.numel()], (rank - 1) % n)
        work.wait()
        incoming.add_(buffer[: incoming.numel()])
    return chunks[rank].clone()
    ### END SOLUTION


def ring_all_gather(comm: Communicator, tensor: torch.Tensor) -> list[torch.Tensor]:
    """All-gather on a ring: return ``[tensor of rank 0, ..., tensor of rank N-1]`` (new
    tensors, of the input's dtype; every rank passes a tensor of the same shape and dtype).

    Traffic: every rank sends to its right neighbour only, N - 1 messages of s bytes.
    Cost: (N - 1)(alpha + s / beta) for tensors of s bytes; each rank sends (N - 1) s.
    """
    ### BEGIN SOLUTION 1.5
    n, rank = comm.world_size, comm.rank
    slots = [torch.empty_like(tensor) for _ in range(n)]
    slots[rank].copy_(tensor)
    for k in range(n - 1):
        work = comm.isend(slots[(rank - k) % n], (rank + 1) % n)
        comm.recv(slots[(rank - 1 - k) % n], (rank - 1) % n)
        work.wait()
    return slots
    ### END SOLUTION


# ---- the second all-reduce: choose one of 1.6 and 1.7 ----------------------------------------

def tree_all_reduce(comm: Communicator, tensor: torch.Tensor) -> None:
    """All-reduce (sum) along a binary tree, in place: afterwards every rank's ``tensor``
    holds the sum of all ranks' tensors. Any N.

    The tree: rank r's parent is ``(r - 1) // 2`` and its children are ``2r + 1`` and
    ``2r + 2`` (those below N); rank 0 is the root. Traffic: a rank talks to its parent
    and its children only, and every edge carries the whole tensor once each way.
    Both subtrees at once: a rank's two children can send (and be sent to) at the same time,
    and a rank waits only for its own subtree, so where the links allow it the time is that
    of the tree's depth, not of its size.
    Cost: 2 floor(log2 N) rounds, up then down, each alpha + 2 S / beta where a rank has one
    port and two children: 2 floor(log2 N)(alpha + 2 S / beta) for a full tree (N = 2^k - 1).
    Few rounds, but every round moves all of S.
    """
    ### BEGIN SOLUTION 1.6
    rank, n = comm.rank, comm.world_size
    children = [c for c in (2 * rank + 1, 2 * rank + 2) if c < n]
    partials = [torch.empty_like(tensor) for _ in children]
    works = [comm.irecv(partial, child) for partial, child in zip(partials, children)]
    for work, partial in zip(works, partials):  # up: both subtrees' sums, received at once
        work.wait()
        tensor.add_(partial)
    if rank > 0:
        parent = (rank - 1) // 2
        comm.send(tensor, parent)
        comm.recv(tensor, parent)  # down: the total
    for work in [comm.isend(tensor, child) for child in children]:
        work.wait()
    ### END SOLUTION


def composed_all_reduce(comm: Communicator, tensor: torch.Tensor) -> None:
    """All-reduce (sum), in place, composed of your ``ring_reduce_scatter`` and
    ``ring_all_gather`` (exercises 1.4 and 1.5): afterwards every rank's ``tensor`` holds
    the sum of all ranks' tensors. Any shape and any number of elements.

    Traffic: every rank sends to its right neighbour only, 2(N - 1) messages of
    ceil(numel / N) elements each.
    Cost: 2(N - 1) alpha + 2(N - 1)/N S / beta, the ring's.
    """
    ### BEGIN SOLUTION 1.7
    n = comm.world_size
    flat = tensor.reshape(-1)
    padded = torch.zeros(-(-flat.numel() // n) * n, dtype=tensor.dtype, device=tensor.device)
    padded[: flat.numel()] = flat  # pad first: both halves then see N chunks of one size
    mine = ring_reduce_scatter(comm, padded)
    full = torch.cat(ring_all_gather(comm, mine))
    tensor.copy_(full[: flat.numel()].view_as(tensor))
    ### END SOLUTION
