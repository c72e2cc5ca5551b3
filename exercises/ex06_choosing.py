"""Lesson 06 exercises: choosing a strategy that fits, message patterns that cannot hang, and a
straggler found from its logs.

The function just below is solved for you: read it first.
"""

from __future__ import annotations

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import Communicator
from mpgpu_edu.memory import estimate_memory


# ---- worked example (solved, not graded) ---------------------------------------------------

def fits_data_parallel(n_params: int, cluster: Cluster, optimizer: str = "adam",
                       precision: str = "mixed") -> bool:
    """Whether plain data parallel training of ``n_params`` parameters fits ``cluster``:
    every replica holds *all* parameters, gradients and optimizer state, so eight 24 GiB
    cards are eight separate 24 GiB budgets, not one of 192 GiB. Activations not counted."""
    estimate = estimate_memory(n_params, optimizer, precision, "dp", cluster.world_size)
    return estimate.fits(cluster.capacity_bytes(0))


# ---- exercises ------------------------------------------------------------------------------

def choose_strategy(n_params: int, cluster: Cluster, optimizer: str = "adam",
                    precision: str = "mixed", activations_bytes: int = 0) -> str:
    """The simplest strategy whose per-device memory fits ``cluster``'s devices, by
    ``estimate_memory`` (with this ``optimizer``, ``precision`` and ``activations_bytes`` per
    device: each can change the answer) and ``cluster.capacity_bytes``. A ``Cluster``'s
    devices are all of one kind, so every device has the same capacity.

    A strategy fits when its per-device memory is at most the capacity (``Estimate.fits``):
    an exact fit fits. On one visible device: ``"single"`` if it fits. On several: the first
    that fits of ``"dp"`` (no sharding: the least code and communication), ``"zero1"``,
    ``"zero2"``, ``"zero3"`` (more memory saved, more communication). Return ``"none"`` when
    nothing fits: then the model needs pipeline or tensor parallelism, or more devices.
    """
    # Exercise 6.1 (about 8 lines). mp.hint("6.1") when stuck.
    raise NotImplementedError("Exercise 6.1: choose_strategy (notebooks/06_choosing_and_debugging.ipynb)")


def exchange_with_partner(comm: Communicator, tensor: torch.Tensor,
                          partner: int) -> torch.Tensor:
    """Swap ``tensor`` with rank ``partner`` using the *blocking* ``comm.send`` and
    ``comm.recv`` only (no ``isend``/``irecv``), and return the partner's tensor (a new
    tensor). ``tensor`` may have any shape and dtype; the partner's has the same. Pairs are
    mutual (if a's partner is b, b's is a); ``partner == comm.rank`` means no partner: return
    a copy.

    Written as "send, then recv" on both sides this hangs: each rank waits in ``send`` for
    the other to receive. Break the symmetry: in each pair one rank sends first, the other
    receives first, and both must agree on which without talking.
    """
    # Exercise 6.2 (about 10 lines). mp.hint("6.2") when stuck.
    raise NotImplementedError("Exercise 6.2: exchange_with_partner (notebooks/06_choosing_and_debugging.ipynb)")


def smooth_ring(comm: Communicator, block: torch.Tensor, steps: int) -> torch.Tensor:
    """The fixed ``choosing_and_debugging.smooth_ring_broken``: the same result, without the
    deadlock.

    The array is every rank's ``block`` (1-D float, any length >= 1, lengths may differ
    between ranks) in rank order, and it is a ring: after the last element of rank N-1 comes
    the first element of rank 0. One step replaces every element by the mean of itself and
    its two neighbours in the ring. Return this rank's block after ``steps`` steps
    (``steps`` >= 0; a new tensor of the block's dtype, also after 0 steps; the caller's
    ``block`` is left unchanged), equal to smoothing the whole array on one device.

    Built from ``comm.send/recv/isend/irecv`` only (no collectives), every ``isend``/``irecv``
    waited on. Per step each rank sends one element to each neighbouring rank and nothing else
    (no barrier); with 2 ranks both neighbours are the same rank, with 1 rank the ring closes
    on itself (no message: a rank cannot send to itself). Must not deadlock on any world size,
    and a step costs a few message times whatever the world size (no rank waits for a chain
    of others).
    """
    # Exercise 6.3 (about 18 lines). mp.hint("6.3") when stuck.
    raise NotImplementedError("Exercise 6.3: smooth_ring (notebooks/06_choosing_and_debugging.ipynb)")


def find_straggler(logs: list[list[str]]) -> tuple[int, float]:
    """The straggler of a run of ``choosing_and_debugging.straggler_steps``, found from its
    per-rank logs alone.

    ``logs[r]`` is rank r's log as ``launch`` returns it: lines ``"[   12.3456 ms] text"``,
    time stamps in milliseconds from the start, right-aligned in 10 characters (from
    10 000 ms on there is no space after the bracket: ``"[12600.0000 ms] text"``). For each
    step every rank logs ``"step S: compute start"``, then
    ``"step S: compute done, waiting in all-reduce"``, then ``"step S: all-reduce done"``;
    other lines may appear, and a rank may spend time between steps (loading data, say):
    that time is not compute.

    Return ``(rank, seconds)``: the rank whose compute (``compute start`` to ``compute done``),
    summed over all steps, took longest, and by how many seconds its total exceeds the median
    of every rank's total. Ties: the lowest rank.
    """
    # Exercise 6.4 (about 15 lines). mp.hint("6.4") when stuck.
    raise NotImplementedError("Exercise 6.4: find_straggler (notebooks/06_choosing_and_debugging.ipynb)")
