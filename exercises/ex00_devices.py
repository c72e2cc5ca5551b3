"""Lesson 00 exercises: which GPUs does a process see, and what is ``cuda:0``?

Fill in each function that raises ``NotImplementedError``, then run
``mpgpu_edu.check("0.1")`` in the notebook (or ``mpgpu-edu check 0.1`` in a terminal).
The function just below is solved for you: read it first.
"""

from __future__ import annotations


# ---- worked example (solved, not graded) ---------------------------------------------------

def logical_id(physical: int, visible: list[int]) -> int | None:
    """The logical id (the N of ``cuda:N``) of physical GPU ``physical``, or None when the
    process cannot see it. ``visible`` lists the physical ids in logical order, as
    ``CUDA_VISIBLE_DEVICES=2,3`` gives ``[2, 3]``.

    >>> logical_id(3, [2, 3])
    1
    >>> logical_id(0, [2, 3]) is None
    True
    """
    for logical, gpu in enumerate(visible):
        if gpu == physical:
            return logical
    return None


# ---- exercises ------------------------------------------------------------------------------

def visible_devices(value: str | None, n_physical: int) -> list[int]:
    """The physical GPUs a process sees under ``CUDA_VISIBLE_DEVICES=value``, in logical
    order: element i is the physical id of ``cuda:i``. The machine has ``n_physical`` GPUs,
    physical ids ``0 .. n_physical - 1``.

    CUDA's rules:

    * ``value`` is None (unset): every GPU, in physical order.
    * an empty (or all-blank) string: no GPU.
    * otherwise a comma-separated list; blanks around an entry are ignored. An entry is the
      number at its start, an optional sign (``+`` or ``-``) directly followed by digits,
      and whatever follows that number is ignored: ``"1gpu"`` is 1, ``"+2"`` is 2.
    * the first invalid entry ends the list: it and everything after it are ignored. An
      entry is invalid when it does not start with such a number (``""``, ``"x"``, a lone
      ``"+"``, ``"GPU-..."``), when its number is negative, or when that GPU does not exist.
    * a GPU listed twice (before that end) makes the whole list invalid: no GPU.

    >>> visible_devices("2,3", 4)
    [2, 3]
    >>> visible_devices("0,2,-1,1", 4)
    [0, 2]
    """
    # Exercise 0.1 (about 13 lines). mp.hint("0.1") when stuck.
    raise NotImplementedError("Exercise 0.1: visible_devices (notebooks/00_welcome.ipynb)")


def data_parallel_device_ids(visible: list[int], physical_gpus: list[int]) -> list[int]:
    """The ``device_ids`` to give ``nn.DataParallel`` so that it runs on the physical GPUs
    ``physical_gpus`` (in that order), in a process that sees ``visible`` (physical ids in
    logical order, as ``visible_devices`` returns).

    ``device_ids`` are *logical* ids: with ``CUDA_VISIBLE_DEVICES=1,2`` the right answer
    for physical GPUs 1 and 2 is ``[0, 1]``, and the classic mistake ``[1, 2]`` asks for a
    ``cuda:2`` that does not exist. Raise ``ValueError`` when a requested GPU is not visible.
    The answer has one logical id per requested GPU, in the order requested: a GPU asked
    for twice appears twice.

    >>> data_parallel_device_ids([1, 2], [1, 2])
    [0, 1]
    """
    # Exercise 0.2 (about 6 lines). mp.hint("0.2") when stuck.
    raise NotImplementedError("Exercise 0.2: data_parallel_device_ids (notebooks/00_welcome.ipynb)")
