"""Multi-channel ring all-reduce: one ring per NIC rail, the tensor split across them.

On two DGX-class nodes a single flat ring over all 16 GPUs leaves the node on one GPU only,
so it crosses the network through one NIC out of eight: its bus bandwidth is one NIC's
(~47 GB/s on NDR), while seven NICs sit idle. NCCL instead runs several *channels*: rings
over the same ranks in different orders, each given a slice of the tensor, all at once. If
ring c leaves every node through the GPU on rail c (``rail_rings``), every NIC carries one
ring's traffic and the rails together give up to N_rails times one NIC.

``all_reduce_multichannel`` is ring all-reduce (``allreduce.all_reduce_ring``) run on
``len(rings)`` slices at once: every step posts one send and one receive per channel, then
waits for all of them, so a slow channel (the network) sets each step's pace.
Cost on ``nodes`` x ``per_node`` GPUs with one ring per rail: see
``cost.rail_ring_allreduce_time``; bus bandwidth about min(NVLink, rails x NIC).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mpgpu_edu.collectives.basic import check_op, finish_op, flat_view
from mpgpu_edu.comm import Communicator


def rail_rings(nodes: int, per_node: int) -> list[list[int]]:
    """One ring per rail over ``nodes * per_node`` ranks (rank ``k * per_node + i`` is GPU i
    of node k, on rail i). Ring c enters and leaves every node through rails c and
    c + 1 (mod ``per_node``), alternating direction from node to node, so each node-to-node
    hop joins two GPUs on the same rail and each NIC, in each direction, serves one ring.
    With an odd number of nodes (> 1) the hop back to node 0 crosses from rail c + 1 to c."""
    if nodes < 1 or per_node < 1:
        raise ValueError(f"nodes and per_node must be >= 1, got {nodes} and {per_node}")
    if per_node == 1:
        return [list(range(nodes))]
    rings = []
    for c in range(per_node):
        # A path through one node from rail c to rail c + 1 visiting every local GPU once.
        path = [c] + [(c + k) % per_node for k in range(2, per_node)] + [(c + 1) % per_node]
        ring = []
        for k in range(nodes):
            local = path if k % 2 == 0 else path[::-1]
            ring += [k * per_node + i for i in local]
        rings.append(ring)
    return rings


def all_reduce_multichannel(comm: Communicator, tensor: torch.Tensor,
                            rings: Sequence[Sequence[int]], op: str = "sum") -> None:
    """All-reduce ``tensor`` in place with one ring all-reduce per entry of ``rings`` (each
    a permutation of the ranks), on ``torch.tensor_split(flat, len(rings))`` slices, all
    channels stepping together. Same result as ``all_reduce_ring``, up to rounding.
    Cost: 2(N - 1) steps; in each, every rank sends one chunk of S / (C N) bytes on each of
    the C channels; each rank sends 2(N - 1)/N S bytes in all, as in one ring."""
    check_op(op, tensor)
    n = comm.world_size
    _check_rings(rings, n)
    with flat_view(tensor) as flat:
        slices = torch.tensor_split(flat, len(rings))
        chunks = [list(torch.tensor_split(s, n)) for s in slices]
        where = [list(ring).index(comm.rank) for ring in rings]
        right = [ring[(p + 1) % n] for ring, p in zip(rings, where)]
        left = [ring[(p - 1) % n] for ring, p in zip(rings, where)]
        buffers = [torch.empty_like(c[0]) for c in chunks]
        for step in range(n - 1):  # reduce-scatter
            out = [(where[c] - step) % n for c in range(len(rings))]
            into = [(where[c] - step - 1) % n for c in range(len(rings))]
            _exchange(comm, [chunks[c][out[c]] for c in range(len(rings))],
                      [buffers[c][:chunks[c][into[c]].numel()] for c in range(len(rings))],
                      right, left)
            for c in range(len(rings)):
                chunks[c][into[c]].add_(buffers[c][:chunks[c][into[c]].numel()])
        for c in range(len(rings)):
            finish_op(chunks[c][(where[c] + 1) % n], op, n)
        for step in range(n - 1):  # all-gather
            _exchange(comm, [chunks[c][(where[c] + 1 - step) % n] for c in range(len(rings))],
                      [chunks[c][(where[c] - step) % n] for c in range(len(rings))],
                      right, left)


def _exchange(comm: Communicator, sends: list[torch.Tensor], recvs: list[torch.Tensor],
              right: list[int], left: list[int]) -> None:
    """Channel c sends ``sends[c]`` to ``right[c]`` and receives ``recvs[c]`` from
    ``left[c]`` (tag c keeps channels apart); returns when every message is done."""
    works = [comm.isend(t, right[c], tag=c) for c, t in enumerate(sends)]
    works += [comm.irecv(t, left[c], tag=c) for c, t in enumerate(recvs)]
    for work in works:
        work.wait()


def _check_rings(rings: Sequence[Sequence[int]], n: int) -> None:
    if not rings:
        raise ValueError("rings must hold at least one ring")
    for c, ring in enumerate(rings):
        if sorted(ring) != list(range(n)):
            raise ValueError(f"ring {c} must visit every rank 0..{n - 1} once, got {list(ring)}")
