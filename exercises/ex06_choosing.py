"""Lesson 06 exercises: choosing a strategy that fits, and a message pattern that cannot hang.

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
    ``estimate_memory`` (with ``activations_bytes`` per device) and ``cluster.capacity_bytes``.

    On one visible device: ``"single"`` if it fits. On several: the first that fits of
    ``"dp"`` (no sharding: the least code and communication), ``"zero1"``, ``"zero2"``,
    ``"zero3"`` (more memory saved, more communication). Return ``"none"`` when nothing
    fits: then the model needs pipeline or tensor parallelism, or more devices.
    """
    # Exercise 6.1 (about 8 lines). Hint: estimate_memory(...).fits(cluster.capacity_bytes(0)).
    raise NotImplementedError("Exercise 6.1: choose_strategy (notebooks/06_choosing_and_debugging.ipynb)")


def exchange_with_partner(comm: Communicator, tensor: torch.Tensor,
                          partner: int) -> torch.Tensor:
    """Swap ``tensor`` with rank ``partner`` using the *blocking* ``comm.send`` and
    ``comm.recv``, and return the partner's tensor (a new tensor). Pairs are mutual (if a's
    partner is b, b's is a); ``partner == comm.rank`` means no partner: return a copy.

    Written as "send, then recv" on both sides this hangs: each rank waits in ``send`` for
    the other to receive. Break the symmetry: in each pair one rank sends first, the other
    receives first, and both must agree on which without talking.
    """
    # Exercise 6.2 (about 10 lines). Hint: the lower rank of a pair sends first.
    raise NotImplementedError("Exercise 6.2: exchange_with_partner (notebooks/06_choosing_and_debugging.ipynb)")
