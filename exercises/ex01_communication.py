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
    device ``dst`` of ``cluster`` when nothing else uses the link: alpha + nbytes / beta,
    with the latency and bandwidth of the route between the two devices.

    >>> p2p_time(Cluster.uniform(2, alpha_s=1e-5, beta_Bps=1e9), 0, 1, 10**6)
    0.00101
    """
    # Exercise 1.1 (about 2 lines). Hint: cluster.route(src, dst) has alpha_s and beta_Bps.
    raise NotImplementedError("Exercise 1.1: p2p_time (notebooks/01_communication.ipynb)")


def naive_all_reduce(comm: Communicator, tensor: torch.Tensor) -> None:
    """All-reduce (sum) through rank 0, in place: afterwards every rank's ``tensor`` holds
    the sum of all ranks' tensors.

    Idea: every other rank sends its tensor to rank 0, which adds them into its own; then
    rank 0 sends the sum to every other rank.
    Cost: 2(N - 1)(alpha + S / beta); rank 0 receives (N - 1) S bytes and sends (N - 1) S.
    """
    # Exercise 1.2 (about 10 lines). Hint: rank 0 receives and adds each tensor, then sends back.
    raise NotImplementedError("Exercise 1.2: naive_all_reduce (notebooks/01_communication.ipynb)")


def ring_all_reduce(comm: Communicator, tensor: torch.Tensor) -> None:
    """Ring all-reduce (sum), in place: afterwards every rank's ``tensor`` holds the sum of
    all ranks' tensors. ``tensor`` is contiguous; any number of elements works.

    Idea: split the tensor into N chunks (``torch.tensor_split``). Reduce-scatter: in
    N - 1 steps every rank sends one chunk to the right and adds the chunk coming from the
    left; then each rank holds the full sum of one chunk. All-gather: in N - 1 more steps
    the full sums travel round the ring.
    Cost: 2(N - 1) alpha + 2(N - 1)/N S / beta; every rank sends 2(N - 1)/N S bytes, to its
    right neighbour only.
    """
    # Exercise 1.3 (about 14 lines). Hint: torch.tensor_split makes the chunks; isend before recv.
    raise NotImplementedError("Exercise 1.3: ring_all_reduce (notebooks/01_communication.ipynb)")


def ring_reduce_scatter(comm: Communicator, tensor: torch.Tensor) -> torch.Tensor:
    """Reduce-scatter (sum) on a ring: return chunk ``rank`` of
    ``torch.tensor_split(total.reshape(-1), N)``, where ``total`` is the sum of every
    rank's ``tensor``. Do not change ``tensor`` itself.

    Idea: work on a flat copy split into N chunks; in step k (k = 0 .. N - 2) rank r sends
    chunk ``(r - 1 - k) % N`` to the right and adds the chunk it receives from the left into
    its chunk ``(r - 2 - k) % N``. After N - 1 steps chunk r has all N contributions.
    Cost: (N - 1)(alpha + S / (N beta)); every rank sends (N - 1)/N of S.
    """
    # Exercise 1.4 (about 10 lines). Hint: step k: send chunk (r-1-k) % N, add into (r-2-k) % N.
    raise NotImplementedError("Exercise 1.4: ring_reduce_scatter (notebooks/01_communication.ipynb)")


def ring_all_gather(comm: Communicator, tensor: torch.Tensor) -> list[torch.Tensor]:
    """All-gather on a ring: return ``[tensor of rank 0, ..., tensor of rank N-1]`` (new
    tensors; every rank passes a tensor of the same shape and dtype).

    Idea: N slots, mine at position ``rank``; in step k (k = 0 .. N - 2) rank r sends slot
    ``(r - k) % N`` to the right and receives slot ``(r - 1 - k) % N`` from the left.
    Cost: (N - 1)(alpha + s / beta) for tensors of s bytes; each rank sends (N - 1) s.
    """
    # Exercise 1.5 (about 8 lines). Hint: step k: send slot (r-k) % N, recv slot (r-1-k) % N.
    raise NotImplementedError("Exercise 1.5: ring_all_gather (notebooks/01_communication.ipynb)")
