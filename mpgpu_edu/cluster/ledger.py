"""A memory ledger: every byte a device holds, by category, against its capacity.

Each simulated device keeps one. Strategies ``alloc`` what they would hold on a real GPU
(parameters, gradients, optimizer state, activations, communication buffers) and ``free``
it when done; the ledger tracks the total, the peak and the breakdown at the peak. Going
over the capacity raises ``SimulatedOutOfMemoryError`` with a message shaped like the one
PyTorch prints, so learners recognise it when they meet the real one.

Why by category: "8 x 24 GB is not 192 GB". Data parallelism replicates parameters,
gradients and optimizer state on every device, and Adam alone keeps two more copies of
the parameters; the breakdown shows where the bytes went.
"""

from __future__ import annotations

from typing import NamedTuple

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "comm_buffers", "other")


class SimulatedOutOfMemoryError(RuntimeError):
    """An allocation that does not fit on the simulated device. The ledger is unchanged.

    Attributes: ``device``, ``requested`` (bytes), ``category``, ``capacity``,
    ``allocated`` (bytes held before the attempt), ``breakdown`` (bytes per category)."""

    def __init__(self, message: str, *, device: int, requested: int, category: str,
                 capacity: int, allocated: int, breakdown: dict[str, int]) -> None:
        super().__init__(message)
        self.device = device
        self.requested = requested
        self.category = category
        self.capacity = capacity
        self.allocated = allocated
        self.breakdown = breakdown


class LedgerEntry(NamedTuple):
    """One change: ``seq`` counts changes on this ledger, ``total`` is held after it."""

    seq: int
    category: str
    delta: int
    label: str
    total: int


def format_bytes(n: float) -> str:
    """``format_bytes(3 * 2**30) == "3.00 GiB"``; binary units, two decimals."""
    sign, size = ("-" if n < 0 else ""), abs(n)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{sign}{size / scale:.2f} {unit}"
    return f"{sign}{int(size)} B"


class MemoryLedger:
    """Bytes held on one device, by category, with the peak and a history of changes."""

    def __init__(self, device: int, capacity_bytes: int, name: str = "") -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.device = device
        self.capacity_bytes = capacity_bytes
        self.name = name
        self.history: list[LedgerEntry] = []
        self._live: dict[int, tuple[str, int, str]] = {}  # token -> (category, nbytes, label)
        self._freed: set[int] = set()
        self._by_category = dict.fromkeys(CATEGORIES, 0)
        self._peak = 0
        self._peak_by_category = dict.fromkeys(CATEGORIES, 0)
        self._next_token = 0

    def alloc(self, category: str, nbytes: int, label: str = "") -> int:
        """Hold ``nbytes`` in ``category``; returns a token for ``free``.

        Raises ``SimulatedOutOfMemoryError`` (and changes nothing) if it does not fit."""
        _check_category(category)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
        if self.current() + nbytes > self.capacity_bytes:
            raise self._out_of_memory(category, nbytes, label)
        token = self._next_token
        self._next_token += 1
        self._live[token] = (category, nbytes, label)
        self._record(category, nbytes, label)
        return token

    def free(self, token: int) -> int:
        """Release what ``token`` holds; returns the bytes freed."""
        if token in self._freed:
            raise ValueError(f"token {token} on device {self.device} was already freed; "
                             "free each allocation exactly once")
        if token not in self._live:
            raise ValueError(f"token {token} was never allocated on device {self.device}'s "
                             "ledger; pass a token returned by this ledger's alloc()")
        category, nbytes, label = self._live.pop(token)
        self._freed.add(token)
        self._record(category, -nbytes, label)
        return nbytes

    def current(self) -> int:
        """Bytes held now."""
        return sum(self._by_category.values())

    def peak(self) -> int:
        """The most bytes held at any moment so far."""
        return self._peak

    def by_category(self) -> dict[str, int]:
        """Bytes held now, per category (every category present, zeros included)."""
        return dict(self._by_category)

    def peak_by_category(self) -> dict[str, int]:
        """The breakdown at the moment of the peak (the first moment, if reached twice)."""
        return dict(self._peak_by_category)

    def free_bytes(self) -> int:
        """Capacity not held."""
        return self.capacity_bytes - self.current()

    def _record(self, category: str, delta: int, label: str) -> None:
        self._by_category[category] += delta
        total = self.current()
        self.history.append(LedgerEntry(len(self.history), category, delta, label, total))
        if total > self._peak:
            self._peak = total
            self._peak_by_category = dict(self._by_category)

    def _out_of_memory(self, category: str, nbytes: int,
                       label: str) -> SimulatedOutOfMemoryError:
        held = self.current()
        parts = ", ".join(f"{c} {format_bytes(b)}" for c, b in self._by_category.items() if b)
        what = f"{category}, {label!r}" if label else category
        where = f"{self.name}, " if self.name else ""
        message = (
            f"CUDA out of memory (simulated). Tried to allocate {format_bytes(nbytes)} "
            f"({what}) on device {self.device} ({where}"
            f"{format_bytes(self.capacity_bytes)} total capacity; "
            f"{format_bytes(held)} already allocated"
            f"{': ' + parts if parts else ''}; {format_bytes(self.free_bytes())} free). "
            "Free memory you no longer need (e.g. activations after backward), or reduce "
            "batch size / use ZeRO to shard optimizer state / split the model with pipeline "
            "or tensor parallelism.")
        return SimulatedOutOfMemoryError(
            message, device=self.device, requested=nbytes, category=category,
            capacity=self.capacity_bytes, allocated=held, breakdown=self.by_category())

    def __repr__(self) -> str:
        return (f"MemoryLedger(device={self.device}, current={format_bytes(self.current())}, "
                f"peak={format_bytes(self.peak())}, capacity={format_bytes(self.capacity_bytes)})")


def _check_category(category: str) -> None:
    if category not in CATEGORIES:
        raise ValueError(f"unknown memory category {category!r}; use one of "
                         + ", ".join(CATEGORIES))
