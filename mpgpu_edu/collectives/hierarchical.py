"""Hierarchical all-reduce: inside each node, then across nodes on every rail, then inside.

On ``nodes`` machines of ``per_node`` GPUs (rank ``k * per_node + i`` is GPU i of node k,
wired to NIC rail i), a flat ring over all ranks sends every one of its 2(N - 1) steps over
the slowest hop it contains, the network, and through one NIC only. The hierarchical
all-reduce keeps the bulk of the traffic on the fast links inside a node:

1. reduce-scatter inside the node (a ring over the node's G GPUs): local GPU i now holds
   the node's sum of chunk i, 1/G of the tensor;
2. all-reduce of that chunk across the nodes, among the GPUs of rail i (rank i of every
   node): every rail carries 1/G of the tensor, all rails at once;
3. all-gather inside the node: every GPU gets every chunk, now summed over all N ranks.

Each phase runs on a sub-communicator (``comm.group(ranks)``), so the ring code of
``allgather`` and ``allreduce`` is reused unchanged on the node's and the rail's ranks.
Cost with G GPUs per node and M nodes, a = alpha, b = beta of each link class:
``2 (G - 1)(a_nvl + S / (G b_nvl)) + 2 (M - 1)(a_net + S / (G M b_net))``
(``cost.hierarchical_allreduce_time``). Each rank sends ``2 (G - 1) / G * S`` bytes inside
its node and ``2 (M - 1) / (G M) * S`` across the network: G times less than a flat ring's
busiest inter-node link. Horovod's hierarchical all-reduce (Sergeev and Del Balso, 2018) and
NCCL's two-level algorithms follow this idea.
"""

from __future__ import annotations

import torch

from mpgpu_edu.collectives.allgather import ring_all_gather_chunks, ring_reduce_scatter_chunks
from mpgpu_edu.collectives.allreduce import all_reduce_ring
from mpgpu_edu.collectives.basic import check_op, finish_op, flat_view
from mpgpu_edu.comm import Communicator


def node_groups(nodes: int, per_node: int) -> list[list[int]]:
    """The ranks of each node: ``[[0, ..., G-1], [G, ..., 2G-1], ...]``."""
    _check_shape(nodes, per_node)
    return [[k * per_node + i for i in range(per_node)] for k in range(nodes)]


def rail_groups(nodes: int, per_node: int) -> list[list[int]]:
    """The ranks of each rail: local GPU i of every node, ``[[0, G, 2G, ...], [1, G+1, ...]]``."""
    _check_shape(nodes, per_node)
    return [[k * per_node + i for k in range(nodes)] for i in range(per_node)]


def all_reduce_hierarchical(comm: Communicator, tensor: torch.Tensor, per_node: int,
                            op: str = "sum") -> None:
    """All-reduce ``tensor`` in place over ``comm.world_size`` ranks laid out as nodes of
    ``per_node`` ranks (``world_size`` a multiple of ``per_node``): ring reduce-scatter in
    the node, ring all-reduce of this rank's chunk on its rail, ring all-gather in the node.
    Same result as ``all_reduce_ring``, up to rounding.
    Cost: ``cost.hierarchical_allreduce_time`` (see the module's docstring)."""
    check_op(op, tensor)
    n = comm.world_size
    if per_node < 1 or n % per_node:
        raise ValueError(f"per_node must divide the world size: {n} ranks cannot be split "
                         f"into nodes of {per_node}")
    node, local = divmod(comm.rank, per_node)
    inside = comm.group(node_groups(n // per_node, per_node)[node])
    rail = comm.group(rail_groups(n // per_node, per_node)[local])
    with flat_view(tensor) as flat:
        chunks = list(torch.tensor_split(flat, per_node))
        buffer = torch.empty_like(chunks[0])  # chunk 0 is the longest
        ring_reduce_scatter_chunks(inside, chunks, buffer)  # chunk `local`: the node's sum
        all_reduce_ring(rail, chunks[local])                # ... now summed over all nodes
        finish_op(chunks[local], op, n)
        ring_all_gather_chunks(inside, chunks)


def _check_shape(nodes: int, per_node: int) -> None:
    if nodes < 1 or per_node < 1:
        raise ValueError(f"nodes and per_node must be >= 1, got {nodes} and {per_node}")
