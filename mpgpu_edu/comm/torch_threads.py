"""The thread count the simulator's demos run torch's kernels with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch's kernels on one thread from here on (the count is not raised again).

    The simulator runs every rank as a thread of this process, and the demo tensors are
    small: two OpenMP threads per tiny op, times several ranks, on a laptop's few busy cores
    make every op wait for the others (``torchrun`` sets one thread per process for the same
    reason). Simulated times do not depend on it, only how long you wait for them. The count
    stays at one afterwards: raising it again left OpenMP threads spinning, which slowed every
    later op of the process."""
    torch.set_num_threads(1)
    yield
