"""Collectives from scratch, written only on ``comm.send``/``recv``/``isend``/``irecv``.

Every function is SPMD: every rank calls it, with ``comm`` first. As in
``torch.distributed``, ``broadcast``, ``reduce`` and the all-reduces change ``tensor`` in
place; ``gather`` and ``all_gather`` return a list with one tensor per rank (index = rank);
``reduce_scatter`` returns this rank's chunk of ``torch.tensor_split(flat, N)``.

- ``basic``      broadcast, reduce, gather, scatter (linear); broadcast_tree, reduce_tree
- ``allgather``  ring all-gather and reduce-scatter, the two halves of ring all-reduce
- ``allreduce``  naive, tree and ring all-reduce, and ``all_reduce(..., algo=...)``
- ``multichannel`` one ring per NIC rail, the tensor split across them (many nodes)
- ``hierarchical`` reduce-scatter in the node, all-reduce per rail, all-gather in the node
- ``cost``       the closed form of each, and nccl-tests' algbw / busbw
"""

from mpgpu_edu.collectives.allgather import all_gather, reduce_scatter
from mpgpu_edu.collectives.allreduce import (ALGORITHMS, all_reduce, all_reduce_naive,
                                             all_reduce_ring, all_reduce_tree)
from mpgpu_edu.collectives.basic import (OPS, broadcast, broadcast_tree, gather, reduce,
                                         reduce_tree, scatter)
from mpgpu_edu.collectives.hierarchical import all_reduce_hierarchical
from mpgpu_edu.collectives.multichannel import all_reduce_multichannel, rail_rings

__all__ = ["ALGORITHMS", "OPS", "all_gather", "all_reduce", "all_reduce_hierarchical",
           "all_reduce_multichannel",
           "all_reduce_naive", "all_reduce_ring", "all_reduce_tree", "broadcast",
           "broadcast_tree", "gather", "rail_rings", "reduce", "reduce_scatter", "reduce_tree",
           "scatter"]
