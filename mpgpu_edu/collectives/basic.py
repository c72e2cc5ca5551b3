"""Broadcast, reduce, gather and scatter, written on ``send`` and ``recv`` only.

Every function is SPMD: every rank of ``comm`` calls it with the same arguments (``root``,
``op``, tensor shape and dtype). Conventions, as in ``torch.distributed``:

- ``broadcast`` and ``reduce`` work *in place* on ``tensor``; ``reduce`` changes it only on
  the root.
- ``gather`` returns a list of every rank's tensor (index = rank) on the root, ``None``
  elsewhere; ``scatter`` fills ``out`` in place.
- ``op`` is ``"sum"`` or ``"mean"`` (``"mean"``: the sum divided by ``world_size``, so it
  needs a floating-point dtype).

Cost lines use the alpha-beta model: a message of S bytes takes ``alpha + S / beta``, on
the uniform textbook cluster (``Cluster.uniform``), where additions are free. A preset charges
each addition on the roofline as well (its bytes over the GPU's memory bandwidth, plus a
kernel launch), so a reduction there takes a little longer than its cost line.
The plain versions are *linear*: the root talks to the other N - 1 ranks one at a time, so
they take N - 1 message times. ``broadcast_tree`` and ``reduce_tree`` are the refinement:
a binomial tree finishes in ceil(log2 N) rounds (MPICH's algorithms; Thakur, Rabenseifner
and Gropp, "Optimization of Collective Communication Operations in MPICH", 2005).

Meta tensors (no data, only shape and dtype) work everywhere: the simulator times them and
counts their bytes without copying anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from mpgpu_edu.comm import Communicator

OPS = ("sum", "mean")


def check_op(op: str, tensor: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``op`` is one of ``OPS`` and fits the tensor's dtype."""
    if op not in OPS:
        raise ValueError(f"unknown reduction op {op!r}: use one of {', '.join(OPS)}")
    if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise ValueError(f"op 'mean' needs a floating-point tensor, got {tensor.dtype}: "
                         "use op='sum' or convert the tensor first")


def finish_op(tensor: torch.Tensor, op: str, world_size: int) -> None:
    """Turn a sum into the requested reduction, in place (``"mean"`` divides by N)."""
    if op == "mean":
        tensor.div_(world_size)


def _check_root(comm: Communicator, root: int) -> None:
    if not 0 <= root < comm.world_size:
        raise ValueError(f"root {root} does not exist: ranks are 0..{comm.world_size - 1}")


@contextlib.contextmanager
def flat_view(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """A 1-D view of ``tensor`` to work on; changes reach ``tensor`` when the block ends.

    A contiguous tensor is viewed (no copy). A non-contiguous one (a transpose, a slice) is
    copied to a contiguous buffer and written back, because backends send contiguous memory.
    The view is detached from autograd, so a parameter (a leaf that requires grad) can be
    broadcast or averaged in place, as with ``torch.distributed``."""
    data = tensor.detach()
    if data.is_contiguous():
        yield data.view(-1)
        return
    flat = data.contiguous().view(-1)
    yield flat
    data.copy_(flat.view(data.shape))


def broadcast(comm: Communicator, tensor: torch.Tensor, root: int = 0) -> None:
    """Copy the root's ``tensor`` into every other rank's ``tensor`` (in place).

    Idea: the root sends its tensor to each other rank, one after another.
    Cost (linear): N - 1 messages, one at a time: (N - 1)(alpha + S / beta)."""
    _check_root(comm, root)
    with flat_view(tensor) as flat:
        if comm.rank == root:
            for peer in range(comm.world_size):
                if peer != root:  # the root already has the data: no message to itself
                    comm.send(flat, peer)
        else:
            comm.recv(flat, root)


def reduce(comm: Communicator, tensor: torch.Tensor, root: int = 0, op: str = "sum") -> None:
    """Combine every rank's ``tensor`` with ``op`` into the root's ``tensor`` (in place);
    the other ranks' tensors are left unchanged.

    Idea: every rank sends its tensor to the root, which receives them one by one (in rank
    order) into one buffer and adds each into its own. This linear form is the first half
    of ``all_reduce_naive``.
    Cost (linear): the root receives N - 1 messages one at a time: (N - 1)(alpha + S / beta),
    and (N - 1) S bytes arrive over the root's one link. The root's N - 1 additions are free on
    the uniform textbook cluster; a preset charges them on the roofline (memory bandwidth)."""
    _check_root(comm, root)
    check_op(op, tensor)
    with flat_view(tensor) as flat:
        if comm.rank != root:
            comm.send(flat, root)
            return
        buffer = torch.empty_like(flat)  # one buffer, reused for every peer
        for peer in range(comm.world_size):
            if peer != root:
                comm.recv(buffer, peer)
                flat.add_(buffer)
        finish_op(flat, op, comm.world_size)


def gather(comm: Communicator, tensor: torch.Tensor, root: int = 0) -> list[torch.Tensor] | None:
    """Collect every rank's ``tensor`` on the root: returns ``[tensor of rank 0, ...,
    tensor of rank N-1]`` there (new tensors, same shape) and ``None`` on the other ranks.

    Idea: every rank sends to the root, which receives them in rank order.
    Cost (linear): (N - 1)(alpha + S / beta) for tensors of S bytes each."""
    _check_root(comm, root)
    data = tensor.detach()
    if comm.rank != root:
        comm.send(data.contiguous(), root)
        return None
    parts = []
    for peer in range(comm.world_size):
        if peer == root:
            parts.append(data.clone(memory_format=torch.contiguous_format))
            continue
        part = torch.empty(data.shape, dtype=data.dtype, device=data.device)
        comm.recv(part, peer)
        parts.append(part)
    return parts


def scatter(comm: Communicator, chunks: Sequence[torch.Tensor] | None, out: torch.Tensor,
            root: int = 0) -> None:
    """Give rank i the root's ``chunks[i]``, written into ``out`` (in place) on every rank.

    ``chunks`` (one tensor per rank, each shaped like ``out``) is read on the root only;
    other ranks pass ``None``.
    Idea: the root sends chunk i to rank i, one after another, and copies its own.
    Cost (linear): (N - 1)(alpha + s / beta) for chunks of s bytes."""
    _check_root(comm, root)
    with flat_view(out) as flat:
        if comm.rank != root:
            comm.recv(flat, root)
            return
        if chunks is None or len(chunks) != comm.world_size:
            got = "None" if chunks is None else f"{len(chunks)} chunks"
            raise ValueError(f"scatter: the root needs one chunk per rank "
                             f"({comm.world_size}), got {got}")
        for peer, chunk in enumerate(chunks):
            if chunk.shape != out.shape or chunk.dtype != out.dtype:
                raise ValueError(f"scatter: chunk {peer} is {chunk.dtype} {list(chunk.shape)} "
                                 f"but out is {out.dtype} {list(out.shape)}: make them match")
            if peer == root:
                flat.copy_(chunk.detach().reshape(-1))
            else:
                comm.send(chunk.detach().contiguous().view(-1), peer)


def broadcast_tree(comm: Communicator, tensor: torch.Tensor, root: int = 0) -> None:
    """``broadcast`` along a binomial tree: same result, ceil(log2 N) rounds.

    Idea: whoever already has the data passes it on, so the number of ranks holding it
    doubles every round. Ranks are numbered from the root (``v = (rank - root) % N``); rank v
    receives from ``v - m``, where m is v's lowest set bit, then sends to ``v + m/2``,
    ``v + m/4``, ..., ``v + 1`` (those that exist). The root sends first to ``v + 2^(k-1)``.
    Cost: ceil(log2 N)(alpha + S / beta); the root sends ceil(log2 N) messages, not N - 1."""
    _check_root(comm, root)
    n, v = comm.world_size, (comm.rank - root) % comm.world_size
    with flat_view(tensor) as flat:
        mask = 1
        while mask < n:  # find the round in which I receive: my lowest set bit
            if v & mask:
                comm.recv(flat, (v - mask + root) % n)
                break
            mask <<= 1
        mask >>= 1
        while mask > 0:  # then pass it on, farthest child first
            if v + mask < n:
                comm.send(flat, (v + mask + root) % n)
            mask >>= 1


def reduce_tree(comm: Communicator, tensor: torch.Tensor, root: int = 0,
                op: str = "sum") -> None:
    """``reduce`` along a binomial tree: same result on the root, ceil(log2 N) rounds.

    Idea: ``broadcast_tree`` run backwards. In round j (``m = 2^j``), every rank whose
    number from the root ``v`` has bit j set sends its partial sum to ``v - m`` and is done;
    the others add what ``v + m`` sends them. As in ``reduce``, only the root's tensor
    changes.
    Cost: ceil(log2 N)(alpha + S / beta); every rank sends at most once (plus, on a preset,
    the additions on the roofline)."""
    _check_root(comm, root)
    check_op(op, tensor)
    n, v = comm.world_size, (comm.rank - root) % comm.world_size
    with flat_view(tensor) as flat:
        # Inner ranks add into a copy, so that only the root's tensor changes.
        partial = flat if v == 0 else flat.clone()
        buffer = torch.empty_like(flat)
        mask = 1
        while mask < n:
            if v & mask:  # my subtree is summed: hand it to my parent
                comm.send(partial, (v - mask + root) % n)
                break
            if v + mask < n:
                comm.recv(buffer, (v + mask + root) % n)
                partial.add_(buffer)
            mask <<= 1
        if v == 0:
            finish_op(flat, op, n)
