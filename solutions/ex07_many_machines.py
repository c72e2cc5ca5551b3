"""Lesson 07 exercises: ranks on many machines, and the hierarchical all-reduce.

On ``nodes`` machines of ``per_node`` GPUs each, torchrun numbers the processes
``rank = node * per_node + local_rank``; GPU i of every node sits on network *rail* i (its
own NIC). The capstone, 7.2, is the all-reduce that large jobs use across machines: the bulk
of the traffic inside each node, only 1/per_node of the tensor per GPU across the network.

Build it from ``comm.send``/``recv``/``isend``/``irecv``, ``comm.group(ranks)`` (a
communicator over some ranks, renumbered from 0) and the ring functions just below: the
package's collectives and ``torch.distributed``'s are switched off while it is checked (a
communicator has no ``all_reduce``). The ring functions are solved for you (lesson 01's ring, in two halves), written on point-to-point messages only:
read their docstrings first. They work on any communicator, a group's too. Also solved: the
closed form of the capstone's time, ``hierarchical_seconds``, which section 3 of the notebook
derives.
"""

from __future__ import annotations

import torch

from mpgpu_edu.comm import Communicator


# ---- worked examples (solved, not graded) ----------------------------------------------------

def ring_step(comm: Communicator, send: torch.Tensor, recv: torch.Tensor) -> None:
    """Send ``send`` to the right neighbour (rank + 1) while receiving ``recv`` from the left
    one (rank - 1), around ``comm``'s ranks. Cost: alpha + bytes / beta."""
    n = comm.world_size
    work = comm.isend(send, (comm.rank + 1) % n)  # isend first: a blocking send would wait
    comm.recv(recv, (comm.rank - 1) % n)          # for a neighbour that is itself sending
    work.wait()


def ring_reduce_scatter(comm: Communicator, chunks: list[torch.Tensor]) -> None:
    """Lesson 01's ring reduce-scatter over ``comm``'s N ranks, on ``chunks`` (N views of one
    tensor, ``torch.tensor_split(flat, N)``), in place: afterwards rank r's chunk
    ``(r + 1) % N`` holds the sum of every rank's, and its other chunks partial sums.
    Cost: (N - 1)(alpha + S / (N beta))."""
    n, r = comm.world_size, comm.rank
    for k in range(n - 1):  # a chunk picks up one rank per hop
        incoming = chunks[(r - k - 1) % n]
        received = torch.empty_like(incoming)
        ring_step(comm, chunks[(r - k) % n], received)
        incoming.add_(received)


def ring_all_gather(comm: Communicator, chunks: list[torch.Tensor]) -> None:
    """Lesson 01's ring all-gather over ``comm``'s N ranks, in place, for chunks left as
    ``ring_reduce_scatter`` leaves them: rank r starts by sending its chunk ``(r + 1) % N``;
    afterwards every rank holds every rank's finished chunk. Cost: (N - 1)(alpha + S / (N
    beta))."""
    n, r = comm.world_size, comm.rank
    for k in range(n - 1):  # the finished chunks go round
        ring_step(comm, chunks[(r + 1 - k) % n], chunks[(r - k) % n])


def ring_all_reduce(comm: Communicator, tensor: torch.Tensor) -> None:
    """Sum ``tensor`` (contiguous) over ``comm``'s ranks, in place: the two halves above on
    ``torch.tensor_split(flat, N)``'s chunks. Cost: 2 (N - 1)(alpha + S / (N beta))."""
    chunks = list(torch.tensor_split(tensor.view(-1), comm.world_size))
    ring_reduce_scatter(comm, chunks)
    ring_all_gather(comm, chunks)


def hierarchical_seconds(nodes: int, per_node: int, nbytes: float, intra_alpha_s: float,
                         intra_beta_Bps: float, inter_alpha_s: float,
                         inter_beta_Bps: float) -> float:
    """The time of the hierarchical all-reduce of an ``nbytes`` tensor on ``nodes`` nodes of
    ``per_node`` GPUs, in the alpha-beta model (additions free), its three phases as section 3
    lists them (all rails at once, each on its own NIC): the time 7.2's check holds your
    all-reduce to.

    ``intra_*``: one message between two GPUs of a node; ``inter_*``: one message between
    two GPUs of one rail on different nodes. A ring phase over R ranks on S' bytes takes R - 1
    steps of alpha + S' / (R beta); the rail's all-reduce is two such phases.
    """
    inside = 2 * (per_node - 1) * (intra_alpha_s + nbytes / (per_node * intra_beta_Bps))
    chunk = nbytes / per_node
    across = 2 * (nodes - 1) * (inter_alpha_s + chunk / (nodes * inter_beta_Bps))
    return inside + across


# ---- exercises ------------------------------------------------------------------------------

def node_and_rail_groups(world_size: int, per_node: int) -> tuple[list[list[int]], list[list[int]]]:
    """The ranks of each node and of each rail, when ``world_size`` ranks run on nodes of
    ``per_node`` GPUs numbered as torchrun numbers them (``rank = node * per_node +
    local_rank``).

    Return ``(nodes, rails)``: ``nodes[k]`` lists node k's ranks by local rank; ``rails[i]``
    lists the ranks of local rank i, by node (GPU i of every node: the GPUs joined by rail
    i's NICs, when every node puts local rank i on its GPU i, as the usual launch does).
    Raise ``ValueError`` unless ``per_node`` (at least 1) divides ``world_size`` (at least 1).

    >>> node_and_rail_groups(6, 2)
    ([[0, 1], [2, 3], [4, 5]], [[0, 2, 4], [1, 3, 5]])
    """
    ### BEGIN SOLUTION 7.1
    if world_size < 1 or per_node < 1 or world_size % per_node:
        raise ValueError(f"{world_size} ranks cannot run on whole nodes of {per_node} GPUs")
    n_nodes = world_size // per_node
    nodes = [[k * per_node + i for i in range(per_node)] for k in range(n_nodes)]
    rails = [[k * per_node + i for k in range(n_nodes)] for i in range(per_node)]
    return nodes, rails
    ### END SOLUTION


def hierarchical_all_reduce(comm: Communicator, tensor: torch.Tensor, per_node: int,
                            op: str = "sum") -> None:
    """All-reduce ``tensor`` (contiguous, any shape) in place over ``comm``'s ranks, which
    run on nodes of ``per_node`` consecutive ranks (``per_node`` divides ``world_size``):
    afterwards every rank holds the sum (``op="sum"``) or the mean (``op="mean"``, the sum
    divided by the world size) of every rank's tensor.

    Three phases, each on a group from ``comm.group``: a ring reduce-scatter inside the
    node over ``torch.tensor_split(flat, per_node)``'s chunks, after which local rank i
    holds its node's sum of one chunk (the same one on every node: with
    ``ring_reduce_scatter``, chunk (i + 1) % per_node); a ring all-reduce of that chunk
    (``ring_all_reduce`` on the rail's group, not on ``comm``) among the ranks of rail i
    (local rank i of every node); a ring all-gather of the chunks inside the node. Every
    rank calls ``comm.group`` for its own node's group and its own rail's.
    Traffic per rank: 2 (G - 1) / G S bytes to ranks of its own node and 2 (M - 1) / (G M) S
    across the network, only to its own rail (G = ``per_node``, M nodes, S the tensor's
    bytes). Cost: ``hierarchical_seconds``.
    """
    ### BEGIN SOLUTION 7.2
    n, g = comm.world_size, per_node
    if g < 1 or n % g:
        raise ValueError(f"{n} ranks cannot run on whole nodes of {g}")
    node, local = divmod(comm.rank, g)
    inside = comm.group([node * g + i for i in range(g)])
    rail = comm.group(list(range(local, n, g)))
    chunks = list(torch.tensor_split(tensor.view(-1), g))
    # 1. reduce-scatter in the node: local rank i finishes chunk (i + 1) % g
    ring_reduce_scatter(inside, chunks)
    # 2. that chunk, summed over the other nodes of my rail (only 1/G of S crosses the network)
    mine = chunks[(local + 1) % g]
    ring_all_reduce(rail, mine)
    if op == "mean":
        mine.div_(n)
    # 3. all-gather in the node: every chunk, finished, to every local rank
    ring_all_gather(inside, chunks)
    ### END SOLUTION
