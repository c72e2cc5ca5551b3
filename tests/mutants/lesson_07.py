"""Plausible wrong answers for lesson 07 (see tests/mutants/__init__.py)."""

from __future__ import annotations

from typing import Any

import torch

# ---- 7.1 nodes and rails -----------------------------------------------------------------------


def groups_swapped(world_size: int, per_node: int) -> tuple[list[list[int]], list[list[int]]]:
    """Returns (rails, nodes): the two lists in the wrong order."""
    if world_size < 1 or per_node < 1 or world_size % per_node:
        raise ValueError("not whole nodes")
    m = world_size // per_node
    return ([[k * per_node + i for k in range(m)] for i in range(per_node)],
            [[k * per_node + i for i in range(per_node)] for k in range(m)])


def groups_node_major_rails(world_size: int, per_node: int
                            ) -> tuple[list[list[int]], list[list[int]]]:
    """Numbers the ranks node-minor (rank = local * nodes + node), as if torchrun interleaved
    the machines."""
    if world_size < 1 or per_node < 1 or world_size % per_node:
        raise ValueError("not whole nodes")
    m = world_size // per_node
    return ([[i * m + k for i in range(per_node)] for k in range(m)],
            [[i * m + k for k in range(m)] for i in range(per_node)])


def groups_never_raise(world_size: int, per_node: int) -> tuple[list[list[int]], list[list[int]]]:
    """Never raises: ranks that do not fill a node are dropped silently."""
    m = world_size // per_node if per_node else 0
    return ([[k * per_node + i for i in range(per_node)] for k in range(m)],
            [[k * per_node + i for k in range(m)] for i in range(per_node)])


# ---- 7.2 the hierarchical all-reduce -------------------------------------------------------------

def _step(comm: Any, send: torch.Tensor, recv: torch.Tensor) -> None:
    n = comm.world_size
    work = comm.isend(send, (comm.rank + 1) % n)
    comm.recv(recv, (comm.rank - 1) % n)
    work.wait()


def _ring(comm: Any, tensor: torch.Tensor) -> None:
    """The exercise file's solved ring_all_reduce."""
    n, r = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    for k in range(n - 1):
        incoming = chunks[(r - k - 1) % n]
        received = torch.empty_like(incoming)
        _step(comm, chunks[(r - k) % n], received)
        incoming.add_(received)
    for k in range(n - 1):
        _step(comm, chunks[(r + 1 - k) % n], chunks[(r - k) % n])


def hier_flat_ring(comm: Any, tensor: torch.Tensor, per_node: int, op: str = "sum") -> None:
    """One flat ring over every rank: right sums, but every step waits for the network."""
    _ring(comm, tensor)
    if op == "mean":
        tensor.div_(comm.world_size)


def hier_whole_tensor_across(comm: Any, tensor: torch.Tensor, per_node: int,
                             op: str = "sum") -> None:
    """All-reduces the whole tensor inside the node, then the whole tensor on the rail:
    right sums, per_node times the bytes across the network."""
    n, g = comm.world_size, per_node
    node, local = divmod(comm.rank, g)
    _ring(comm.group([node * g + i for i in range(g)]), tensor)
    _ring(comm.group(list(range(local, n, g))), tensor)
    if op == "mean":
        tensor.div_(n)


def _three_phases(comm: Any, tensor: torch.Tensor, per_node: int, op: str, *,
                  swapped: bool = False, flat: bool = True, rail_on_comm: bool = False,
                  mean_by: int | None = None, rs_shift: int = 1, ag_shift: int = 0) -> None:
    """The three phases with one thing changed by a switch: ``swapped`` node and rail
    numbering, chunks cut from the tensor itself (not ``flat``), phase 2 on ``comm``
    (``rail_on_comm``), the mean divided by ``mean_by``, or the chunk phase 1 finishes
    (``rs_shift`` 0: lesson 01's loop, chunk i + 1) and phase 3 starts from (``ag_shift``).
    With no switch it is right: phase 1 finishes chunk i on local rank i."""
    n, g = comm.world_size, per_node
    if swapped:  # rank r's node taken to be r % nodes, its rail r // nodes
        m = n // g
        local, node = divmod(comm.rank, m)
        inside = comm.group([i * m + node for i in range(g)])
        rail = comm.group([local * m + k for k in range(m)])
    else:
        node, local = divmod(comm.rank, g)
        inside = comm.group([node * g + i for i in range(g)])
        rail = comm.group(list(range(local, n, g)))
    if flat:
        chunks = list(torch.tensor_split(tensor.view(-1), g))
    else:
        chunks = [c.contiguous() for c in torch.tensor_split(tensor, g)]
    for k in range(g - 1):
        incoming = chunks[(local - k - 1 - rs_shift) % g]
        received = torch.empty_like(incoming)
        _step(inside, chunks[(local - k - rs_shift) % g], received)
        incoming.add_(received)
    _ring(comm if rail_on_comm else rail, chunks[local])
    if op == "mean":
        chunks[local].div_(mean_by or n)
    for k in range(g - 1):
        _step(inside, chunks[(local + ag_shift - k) % g], chunks[(local + ag_shift - k - 1) % g])
    if not flat:
        tensor.copy_(torch.cat(chunks).view_as(tensor))


def hier_groups_swapped(comm: Any, tensor: torch.Tensor, per_node: int, op: str = "sum") -> None:
    """Takes rank r's node to be r % nodes and its rail r // nodes: the phases run on the
    wrong links (right sums, the bulk of the bytes across the network)."""
    _three_phases(comm, tensor, per_node, op, swapped=True)


def hier_split_rows(comm: Any, tensor: torch.Tensor, per_node: int, op: str = "sum") -> None:
    """Splits ``tensor`` itself, not its flat view: on a 2-D tensor the chunks are rows,
    uneven when the rows do not divide (right sums, the wrong bytes on the links)."""
    _three_phases(comm, tensor, per_node, op, flat=False)


def hier_mean_over_node(comm: Any, tensor: torch.Tensor, per_node: int, op: str = "sum") -> None:
    """Divides by the GPUs per node, not the world size, for the mean."""
    _three_phases(comm, tensor, per_node, op, mean_by=per_node)


def hier_phase_two_on_comm(comm: Any, tensor: torch.Tensor, per_node: int,
                           op: str = "sum") -> None:
    """Runs phase 2's ring all-reduce on ``comm`` (every rank) instead of the rail's group."""
    _three_phases(comm, tensor, per_node, op, rail_on_comm=True)


def hier_wrong_chunk_on_the_rail(comm: Any, tensor: torch.Tensor, per_node: int,
                                 op: str = "sum") -> None:
    """Reduce-scatters so that local rank i finishes chunk i + 1, but all-reduces chunk i on
    the rail: a chunk still holding partial sums."""
    _three_phases(comm, tensor, per_node, op, rs_shift=0)


def hier_lesson01_loops(comm: Any, tensor: torch.Tensor, per_node: int, op: str = "sum") -> None:
    """Copies lesson 01's reduce-scatter and all-gather loops into phases 1 and 3: local
    rank i finishes chunk i + 1 but all-reduces chunk i on the rail, then gathers from
    chunk i + 1."""
    _three_phases(comm, tensor, per_node, op, rs_shift=0, ag_shift=1)


def hier_calls_the_package(comm: Any, tensor: torch.Tensor, per_node: int,
                           op: str = "sum") -> None:
    """Calls the package's own hierarchical all-reduce."""
    from mpgpu_edu.collectives.hierarchical import all_reduce_hierarchical

    all_reduce_hierarchical(comm, tensor, per_node, op)


def hier_on_a_clone(comm: Any, tensor: torch.Tensor, per_node: int, op: str = "sum") -> Any:
    """Runs the three phases on a clone and returns it: the caller's tensor is unchanged."""
    mine = tensor.clone()
    _three_phases(comm, mine, per_node, op)
    return mine


def hier_calls_comm_all_reduce(comm: Any, tensor: torch.Tensor, per_node: int,
                               op: str = "sum") -> None:
    """Calls an all-reduce method on the communicator, which has none."""
    comm.all_reduce(tensor)


MUTANTS = {
    "7.1": ["groups_swapped", "groups_node_major_rails", "groups_never_raise"],
    "7.2": ["hier_flat_ring", "hier_whole_tensor_across", "hier_groups_swapped",
            "hier_split_rows", "hier_mean_over_node", "hier_phase_two_on_comm",
            "hier_wrong_chunk_on_the_rail", "hier_lesson01_loops", "hier_calls_the_package",
            "hier_on_a_clone", "hier_calls_comm_all_reduce"],
}
