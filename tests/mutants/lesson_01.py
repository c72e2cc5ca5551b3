"""Plausible wrong answers for lesson 01 (see tests/mutants/__init__.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch


def _solution() -> Any:
    path = Path(__file__).resolve().parents[2] / "solutions" / "ex01_communication.py"
    spec = importlib.util.spec_from_file_location("mutants_ex01_solution", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


_SOL = _solution()
# the halves by the names a learner's file has them (1.7's check counts calls to these)
ring_reduce_scatter, ring_all_gather = _SOL.ring_reduce_scatter, _SOL.ring_all_gather


class _Unwaited:
    """A communicator whose isend works are never waited on (their ``wait`` does nothing);
    everything else is the real one's."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Any:
        self._comm.isend(tensor, dst, tag)
        return _NoWait()


class _NoWait:
    def wait(self) -> None:
        return None


# ---- 1.1 ----------------------------------------------------------------------------------

def p2p_ignores_alpha(cluster: Any, src: int, dst: int, nbytes: int) -> float:
    """Forgets the latency: only nbytes / beta."""
    return nbytes / cluster.route(src, dst).beta_Bps


def p2p_bits_not_bytes(cluster: Any, src: int, dst: int, nbytes: int) -> float:
    """Reads beta as bits per second: 8 nbytes / beta."""
    route = cluster.route(src, dst)
    return route.alpha_s + 8 * nbytes / route.beta_Bps


def p2p_fixed_route(cluster: Any, src: int, dst: int, nbytes: int) -> float:
    """Takes alpha and beta from the route 0 -> 1 whatever the devices: right wherever every
    route is the same."""
    route = cluster.route(0, 1)
    return route.alpha_s + nbytes / route.beta_Bps


# ---- 1.2 ----------------------------------------------------------------------------------

def _sum_at_root(comm: Any, tensor: torch.Tensor) -> bool:
    """Every rank's tensor summed into rank 0's (the others send theirs); True on rank 0."""
    if comm.rank != 0:
        comm.send(tensor, 0)
        return False
    buffer = torch.empty_like(tensor)
    for peer in range(1, comm.world_size):
        comm.recv(buffer, peer)
        tensor.add_(buffer)
    return True


def naive_root_never_waits(comm: Any, tensor: torch.Tensor) -> None:
    """Rank 0 sends the sum back with isend and never waits."""
    if _sum_at_root(comm, tensor):
        for peer in range(1, comm.world_size):
            comm.isend(tensor, peer)
    else:
        comm.recv(tensor, 0)


def naive_forgets_to_send_back(comm: Any, tensor: torch.Tensor) -> None:
    """Rank 0 sums everything but never sends the sum back."""
    _sum_at_root(comm, tensor)


def naive_averages(comm: Any, tensor: torch.Tensor) -> None:
    """Divides the sum by N: a mean, not the sum the contract asks for."""
    _SOL.naive_all_reduce(comm, tensor)
    tensor.div_(comm.world_size)


# ---- 1.3 ----------------------------------------------------------------------------------

def ring_chunk_off_by_one(comm: Any, tensor: torch.Tensor) -> None:
    """Adds the received chunk into the chunk it just sent, one index off."""
    n, rank = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    buffer = torch.empty_like(chunks[0])
    for k in range(n - 1):
        incoming = chunks[(rank - 1 - k) % n]
        work = comm.isend(chunks[(rank - 1 - k) % n], (rank + 1) % n)
        comm.recv(buffer[: incoming.numel()], (rank - 1) % n)
        work.wait()
        incoming.add_(buffer[: incoming.numel()])
    for k in range(n - 1):
        work = comm.isend(chunks[(rank - k) % n], (rank + 1) % n)
        comm.recv(chunks[(rank - 1 - k) % n], (rank - 1) % n)
        work.wait()


def ring_sends_left(comm: Any, tensor: torch.Tensor) -> None:
    """Right sums, but every rank sends to its left neighbour and receives from the right."""
    n, rank = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    buffer = torch.empty_like(chunks[0])
    for k in range(n - 1):
        incoming = chunks[(rank + 2 + k) % n]
        work = comm.isend(chunks[(rank + 1 + k) % n], (rank - 1) % n)
        comm.recv(buffer[: incoming.numel()], (rank + 1) % n)
        work.wait()
        incoming.add_(buffer[: incoming.numel()])
    for k in range(n - 1):
        work = comm.isend(chunks[(rank + k) % n], (rank - 1) % n)
        comm.recv(chunks[(rank + 1 + k) % n], (rank + 1) % n)
        work.wait()


def ring_without_all_gather(comm: Any, tensor: torch.Tensor) -> None:
    """Stops after the reduce-scatter: each rank has one summed chunk, the rest partial."""
    n, rank = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    buffer = torch.empty_like(chunks[0])
    for k in range(n - 1):
        incoming = chunks[(rank - 2 - k) % n]
        work = comm.isend(chunks[(rank - 1 - k) % n], (rank + 1) % n)
        comm.recv(buffer[: incoming.numel()], (rank - 1) % n)
        work.wait()
        incoming.add_(buffer[: incoming.numel()])


def ring_never_waits(comm: Any, tensor: torch.Tensor) -> None:
    """Right sums and traffic, but never waits on its isend works (the simulator delivers
    them anyway; on gloo or NCCL a chunk could be overwritten while still in flight)."""
    n, rank = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    buffer = torch.empty_like(chunks[0])
    for k in range(n - 1):
        incoming = chunks[(rank - 2 - k) % n]
        comm.isend(chunks[(rank - 1 - k) % n], (rank + 1) % n)
        comm.recv(buffer[: incoming.numel()], (rank - 1) % n)
        incoming.add_(buffer[: incoming.numel()])
    for k in range(n - 1):
        comm.isend(chunks[(rank - k) % n], (rank + 1) % n)
        comm.recv(chunks[(rank - 1 - k) % n], (rank - 1) % n)


# ---- 1.4 ----------------------------------------------------------------------------------

def reduce_scatter_next_chunk(comm: Any, tensor: torch.Tensor) -> torch.Tensor:
    """Returns chunk (rank + 1) % N, where a ring that starts one chunk later ends."""
    n, rank = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor.reshape(-1).clone(), n))
    buffer = torch.empty_like(chunks[0])
    for k in range(n - 1):
        incoming = chunks[(rank - 1 - k) % n]
        work = comm.isend(chunks[(rank - k) % n], (rank + 1) % n)
        comm.recv(buffer[: incoming.numel()], (rank - 1) % n)
        work.wait()
        incoming.add_(buffer[: incoming.numel()])
    return chunks[(rank + 1) % n].clone()


def reduce_scatter_in_place(comm: Any, tensor: torch.Tensor) -> torch.Tensor:
    """Right chunk, but sums into the caller's tensor instead of a copy."""
    n, rank = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    buffer = torch.empty_like(chunks[0])
    for k in range(n - 1):
        incoming = chunks[(rank - 2 - k) % n]
        work = comm.isend(chunks[(rank - 1 - k) % n], (rank + 1) % n)
        comm.recv(buffer[: incoming.numel()], (rank - 1) % n)
        work.wait()
        incoming.add_(buffer[: incoming.numel()])
    return chunks[rank].clone()


# ---- 1.5 ----------------------------------------------------------------------------------

def all_gather_slot_off_by_one(comm: Any, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Files what it receives one slot too far: the list comes out rotated."""
    n, rank = comm.world_size, comm.rank
    slots = [torch.empty_like(tensor) for _ in range(n)]
    slots[rank].copy_(tensor)
    for k in range(n - 1):
        work = comm.isend(slots[(rank - k) % n], (rank + 1) % n)
        comm.recv(slots[(rank - k - 1) % n], (rank - 1) % n)
        work.wait()
    return slots[1:] + slots[:1]


def all_gather_sends_everything(comm: Any, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Right list, but sends its own tensor straight to every rank (not a ring)."""
    n, rank = comm.world_size, comm.rank
    slots = [torch.empty_like(tensor) for _ in range(n)]
    slots[rank].copy_(tensor)
    works = [comm.isend(tensor, peer) for peer in range(n) if peer != rank]
    for peer in range(n):
        if peer != rank:
            comm.recv(slots[peer], peer)
    for work in works:
        work.wait()
    return slots


def all_gather_own_entry_is_input(comm: Any, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Right values, but its own entry is the caller's tensor itself, not a new tensor."""
    slots = _SOL.ring_all_gather(comm, tensor)
    slots[comm.rank] = tensor
    return slots


# ---- 1.6 ----------------------------------------------------------------------------------

def tree_children_one_after_another(comm: Any, tensor: torch.Tensor) -> None:
    """The right tree and traffic, but a rank receives its children one after the other and
    sends to them one after the other: the two subtrees never work at once."""
    rank, n = comm.rank, comm.world_size
    children = [c for c in (2 * rank + 1, 2 * rank + 2) if c < n]
    buffer = torch.empty_like(tensor)
    for child in children:
        comm.recv(buffer, child)
        tensor.add_(buffer)
    if rank > 0:
        comm.send(tensor, (rank - 1) // 2)
        comm.recv(tensor, (rank - 1) // 2)
    for child in children:
        comm.send(tensor, child)


def tree_is_a_ring(comm: Any, tensor: torch.Tensor) -> None:
    """Submits the ring all-reduce as the tree: right sums, wrong pattern."""
    _SOL.ring_all_reduce(comm, tensor)



def tree_skips_last_level(comm: Any, tensor: torch.Tensor) -> None:
    """Builds only the full levels of the tree: for N not of the form 2^k - 1 the ranks of
    the last, incomplete level are left out (they neither send nor receive)."""
    rank, n = comm.rank, comm.world_size
    full = 1
    while 2 * full + 1 <= n:
        full = 2 * full + 1
    if rank >= full:
        return
    children = [c for c in (2 * rank + 1, 2 * rank + 2) if c < full]
    buffer = torch.empty_like(tensor)
    for child in children:
        comm.recv(buffer, child)
        tensor.add_(buffer)
    if rank > 0:
        comm.send(tensor, (rank - 1) // 2)
        comm.recv(tensor, (rank - 1) // 2)
    for child in children:
        comm.send(tensor, child)


def tree_through_the_root(comm: Any, tensor: torch.Tensor) -> None:
    """Sums up the tree, then rank 0 sends the total to every rank directly."""
    rank, n = comm.rank, comm.world_size
    children = [c for c in (2 * rank + 1, 2 * rank + 2) if c < n]
    buffer = torch.empty_like(tensor)
    for child in children:
        comm.recv(buffer, child)
        tensor.add_(buffer)
    if rank > 0:
        comm.send(tensor, (rank - 1) // 2)
        comm.recv(tensor, 0)
    else:
        for peer in range(1, n):
            comm.send(tensor, peer)


def tree_binomial(comm: Any, tensor: torch.Tensor) -> None:
    """A binomial tree (partner rank XOR 2^k), not the binary tree the contract names."""
    rank, n = comm.rank, comm.world_size
    buffer = torch.empty_like(tensor)
    mask = 1
    while mask < n:
        if rank & mask:
            comm.send(tensor, rank - mask)
            break
        if rank + mask < n:
            comm.recv(buffer, rank + mask)
            tensor.add_(buffer)
        mask <<= 1
    if rank > 0:
        comm.recv(tensor, rank - mask)
    mask >>= 1
    while mask > 0:
        if rank + mask < n and not rank & mask:
            comm.send(tensor, rank + mask)
        mask >>= 1


# ---- 1.7 ----------------------------------------------------------------------------------

def composed_averages(comm: Any, tensor: torch.Tensor) -> None:
    """Divides the result by N: a mean, not the sum."""
    _SOL.composed_all_reduce(comm, tensor)
    tensor.div_(comm.world_size)


def composed_without_padding(comm: Any, tensor: torch.Tensor) -> None:
    """All-gathers tensor_split's chunks as they are: unequal when N does not divide."""
    mine = ring_reduce_scatter(comm, tensor)
    tensor.copy_(torch.cat(ring_all_gather(comm, mine)).view_as(tensor))



def composed_buffer_on_the_cpu(comm: Any, tensor: torch.Tensor) -> None:
    """Pads into torch.zeros(...) without device=tensor.device: right on CPU tensors, but on
    the meta tensors of the lesson's figures the copy into the CPU buffer fails."""
    n = comm.world_size
    flat = tensor.reshape(-1)
    padded = torch.zeros(-(-flat.numel() // n) * n, dtype=tensor.dtype)
    padded[: flat.numel()] = flat
    full = torch.cat(ring_all_gather(comm, ring_reduce_scatter(comm, padded)))
    tensor.copy_(full[: flat.numel()].view_as(tensor))

def reduce_scatter_never_waits(comm: Any, tensor: torch.Tensor) -> torch.Tensor:
    """The right reduce-scatter, its isend works never waited on."""
    return _SOL.ring_reduce_scatter(_Unwaited(comm), tensor)


def all_gather_never_waits(comm: Any, tensor: torch.Tensor) -> list[torch.Tensor]:
    """The right all-gather, its isend works never waited on."""
    return _SOL.ring_all_gather(_Unwaited(comm), tensor)


def tree_never_waits_its_sends(comm: Any, tensor: torch.Tensor) -> None:
    """The right tree, its isends down the tree never waited on."""
    _SOL.tree_all_reduce(_Unwaited(comm), tensor)


def composed_of_the_ring(comm: Any, tensor: torch.Tensor) -> None:
    """Pads and runs the ring of 1.3: the ring's bytes, but not composed of 1.4 and 1.5."""
    n, numel = comm.world_size, tensor.numel()
    padded = tensor.new_zeros(-(-numel // n) * n)
    padded[:numel] = tensor.reshape(-1)
    _SOL.ring_all_reduce(comm, padded)
    tensor.copy_(padded[:numel].view_as(tensor))


def reduce_scatter_returns_float64(comm: Any, tensor: torch.Tensor) -> torch.Tensor:
    """The right chunk, returned as float64 whatever the input's dtype."""
    return _SOL.ring_reduce_scatter(comm, tensor).double()


def all_gather_float32_slots(comm: Any, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Makes its slots with torch.empty(shape): float32 whatever the input's dtype (here: the
    right all-gather of a float32 copy)."""
    return _SOL.ring_all_gather(comm, tensor.float())


def ring_float32_scratch(comm: Any, tensor: torch.Tensor) -> None:
    """The ring with its receive buffer made as torch.empty(size, device=...): float32
    whatever the tensor's dtype."""
    n, rank = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    buffer = torch.empty(max(c.numel() for c in chunks), device=tensor.device)
    for k in range(n - 1):
        send, recv = chunks[(rank - k) % n], chunks[(rank - k - 1) % n]
        work = comm.isend(send, (rank + 1) % n)
        comm.recv(buffer[: recv.numel()], (rank - 1) % n)
        work.wait()
        recv.add_(buffer[: recv.numel()])
    for k in range(n - 1):
        send, recv = chunks[(rank + 1 - k) % n], chunks[(rank - k) % n]
        work = comm.isend(send, (rank + 1) % n)
        comm.recv(recv, (rank - 1) % n)
        work.wait()


def ring_splits_the_first_dimension(comm: Any, tensor: torch.Tensor) -> None:
    """tensor_split(tensor, N) without flattening: on a 2-D tensor the chunks are rows, as
    uneven as the rows are few (the sums are right, the bytes are not the ring's)."""
    n, rank = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor, n))
    for k in range(n - 1):
        send, recv = chunks[(rank - k) % n], chunks[(rank - k - 1) % n]
        buffer = torch.empty_like(recv)
        work = comm.isend(send.contiguous(), (rank + 1) % n)
        comm.recv(buffer, (rank - 1) % n)
        work.wait()
        recv.add_(buffer)
    for k in range(n - 1):
        send, recv = chunks[(rank + 1 - k) % n], chunks[(rank - k) % n]
        buffer = torch.empty_like(recv)
        work = comm.isend(send.contiguous(), (rank + 1) % n)
        comm.recv(buffer, (rank - 1) % n)
        work.wait()
        recv.copy_(buffer)


MUTANTS: dict[str, list[str]] = {
    "1.1": ["p2p_ignores_alpha", "p2p_bits_not_bytes", "p2p_fixed_route"],
    "1.2": ["naive_forgets_to_send_back", "naive_averages", "naive_root_never_waits"],
    "1.3": ["ring_chunk_off_by_one", "ring_sends_left", "ring_without_all_gather",
            "ring_never_waits", "ring_float32_scratch", "ring_splits_the_first_dimension"],
    "1.4": ["reduce_scatter_next_chunk", "reduce_scatter_in_place", "reduce_scatter_never_waits",
            "reduce_scatter_returns_float64"],
    "1.5": ["all_gather_slot_off_by_one", "all_gather_sends_everything",
            "all_gather_own_entry_is_input", "all_gather_never_waits",
            "all_gather_float32_slots"],
    "1.6": ["tree_skips_last_level", "tree_through_the_root", "tree_binomial",
            "tree_children_one_after_another", "tree_is_a_ring", "tree_never_waits_its_sends"],
    "1.7": ["composed_averages", "composed_without_padding", "composed_buffer_on_the_cpu",
            "composed_of_the_ring"],
}
