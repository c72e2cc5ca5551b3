"""Lesson 10 exercises: planning a large run.

A pipeline that crosses nodes needs many stages, and 1F1B's bubble grows with them; interleaved
1F1B gives each device several smaller chunks of the model to shrink it. 10.1 prices that
bubble in closed form, checked against the simulated schedule; 10.2 builds the schedule itself,
as lesson 04's 4.3 built 1F1B: a ``Step`` list per device (``mpgpu_edu.pipeline``), here with
a ``chunk``.
"""

from __future__ import annotations

from mpgpu_edu.pipeline import Step


# ---- worked example (solved, not graded) ---------------------------------------------------

def virtual_stages(n_stages: int, n_chunks: int) -> list[list[int]]:
    """Where interleaved 1F1B puts the model: cut into P x V chunks (virtual stages 0 .. PV-1,
    in model order), device p holds virtual stages p, p + P, ..., p + (V-1)P; its chunk c is
    virtual stage c x P + p. A microbatch's forward visits the virtual stages in order, so it
    goes round the devices V times.

    >>> virtual_stages(4, 2)
    [[0, 4], [1, 5], [2, 6], [3, 7]]
    """
    return [[c * n_stages + p for c in range(n_chunks)] for p in range(n_stages)]


# ---- exercises ------------------------------------------------------------------------------

def interleaved_bubble_overhead(n_stages: int, n_microbatches: int, n_chunks: int) -> float:
    """The bubble of interleaved 1F1B as a share of the ideal compute time: P stages (devices),
    M microbatches, V model chunks per device, equal stages and free sends. 1F1B's is
    (P-1)/M (lesson 04); work out what V chunks per device change from section 3's timelines.
    The schedule runs microbatches in rounds of P: raise ``ValueError`` when M is not a
    multiple of P, or any argument is below 1.

    >>> interleaved_bubble_overhead(4, 8, 1)  # one chunk per device: plain 1F1B
    0.375
    """
    # Exercise 10.1 (about 5 lines). mp.hint("10.1") when stuck.
    raise NotImplementedError("Exercise 10.1: interleaved_bubble_overhead (notebooks/10_planning.ipynb)")


def interleaved_orders(n_stages: int, n_microbatches: int, n_chunks: int) -> list[list[Step]]:
    """Interleaved 1F1B (Narayanan et al. 2021) as each device's step order: device p holds the
    model chunks p, p + P, ..., p + (V-1)P; ``Step(p, microbatch, op, chunk)`` runs its chunk
    ``chunk`` (chunk 0 first in forward). Return one list of Steps per device, like lesson
    04's ``one_f_one_b_orders``.

    Three rules make the schedule:

    1. **The order of the work.** Device p runs its M x V forwards in rounds of P
       microbatches: microbatches 0 .. P-1 through chunk 0, the same P through chunk 1, ...,
       through chunk V-1, then microbatches P .. 2P-1 the same way, and so on. Its backwards go
       in the same rounds, with the chunks reversed (chunk V-1 first: backward runs the model
       backwards).
    2. **The warm-up**: ``w = min(2(P-1-p) + (V-1)P, M x V)`` forwards; with V = 1 it is
       plain 1F1B's ``min(P-1-p, M)`` instead (the formula would give 2(P-1-p)).
    3. **Then** one forward and one backward in turn, and at the end the w backwards that are
       left.

    Raise ``ValueError`` when any argument is below 1 or M is not a multiple of P. In a
    drawn grid ``F3.1`` is microbatch 3's forward through chunk 1, and ``F3.0`` through
    chunk 0:

    >>> from mpgpu_edu.pipeline import from_order
    >>> print(from_order("interleaved", interleaved_orders(2, 2, 2), 2, 2))  # name, orders, M, V
    tick  | 0    1    2    3    4    5    6    7    8    9    |
    dev 0 | F0.0 F1.0 F0.1 F1.1 .    B0.1 .    B1.1 B0.0 B1.0 |
    dev 1 | .    F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0 .    |
    """
    # Exercise 10.2 (about 22 lines). mp.hint("10.2") when stuck.
    raise NotImplementedError("Exercise 10.2: interleaved_orders (notebooks/10_planning.ipynb)")
