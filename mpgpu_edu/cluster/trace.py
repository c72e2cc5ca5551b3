"""Traces: what every device did, when, on which stream.

A trace is plain data. The simulator produces one by replaying each rank's operations against
the cost model; the torch.distributed backend produces one from wall-clock measurements. Both
use the same format, so figures and metrics never care where a trace came from.

Streams: every device has a ``"compute"`` stream and a ``"comm"`` stream. Events on the comm
stream may overlap each other (a rank can send and receive at once: links are full duplex).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

KINDS = ("forward", "backward", "optimizer", "compute", "data", "send", "recv")
STREAMS = ("compute", "comm")
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "comm_buffers", "other")


@dataclass(frozen=True)
class Event:
    """One interval of work on one device's stream. Times are seconds from the run's start."""

    device: int
    stream: str
    kind: str
    start: float
    end: float
    label: str = ""
    nbytes: int = 0
    flops: float = 0.0
    peer: int | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class MemoryEvent:
    """A change of ``delta`` bytes in one category on one device; ``total`` is the device's
    total held after the change."""

    device: int
    time: float
    category: str
    delta: int
    label: str
    total: int


def merged_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals, as sorted disjoint pairs."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


@dataclass
class Trace:
    """All events of one run. ``source`` is ``"simulated"`` or ``"measured"``."""

    n_devices: int
    events: list[Event] = field(default_factory=list)
    memory: list[MemoryEvent] = field(default_factory=list)
    source: str = "simulated"
    meta: dict = field(default_factory=dict)

    # ---- derived timing ------------------------------------------------------------------
    @property
    def makespan(self) -> float:
        """Time from the first event's start (0) to the last event's end, in seconds."""
        return max((e.end for e in self.events), default=0.0)

    def on(self, device: int, stream: str | None = None, kind: str | None = None) -> list[Event]:
        """Events of one device, optionally of one stream and one kind, sorted by start."""
        picked = [e for e in self.events if e.device == device
                  and (stream is None or e.stream == stream) and (kind is None or e.kind == kind)]
        return sorted(picked, key=lambda e: (e.start, e.end))

    def busy(self, device: int, stream: str = "compute") -> float:
        """Seconds during which the stream had at least one event running (overlaps merged)."""
        return sum(end - start for start, end in
                   merged_intervals((e.start, e.end) for e in self.on(device, stream)))

    def idle(self, device: int, stream: str = "compute") -> float:
        """Seconds of the makespan during which the stream did nothing."""
        return self.makespan - self.busy(device, stream)

    def idle_fraction(self, device: int, stream: str = "compute") -> float:
        span = self.makespan
        return self.idle(device, stream) / span if span > 0 else 0.0

    def utilisation(self, device: int, stream: str = "compute") -> float:
        span = self.makespan
        return self.busy(device, stream) / span if span > 0 else 0.0

    def bytes_sent(self) -> list[int]:
        """Bytes each device sent, from the trace's send events."""
        out = [0] * self.n_devices
        for e in self.events:
            if e.kind == "send":
                out[e.device] += e.nbytes
        return out

    # ---- derived memory ------------------------------------------------------------------
    def memory_timeline(self, device: int) -> tuple[list[float], dict[str, list[int]]]:
        """Step function of bytes held per category on one device: (times, {category: bytes})."""
        held: dict[str, int] = defaultdict(int)
        times: list[float] = []
        series: dict[str, list[int]] = {c: [] for c in CATEGORIES}
        for m in sorted((m for m in self.memory if m.device == device), key=lambda m: m.time):
            held[m.category] += m.delta
            times.append(m.time)
            for c in CATEGORIES:
                series[c].append(held[c])
        return times, series

    def peak_memory(self, device: int) -> int:
        """Highest total bytes held on the device at any moment of the run."""
        return max((m.total for m in self.memory if m.device == device), default=0)

    def peak_memory_by_category(self, device: int) -> dict[str, int]:
        """The breakdown held at the moment of the device's peak total."""
        times, series = self.memory_timeline(device)
        if not times:
            return {c: 0 for c in CATEGORIES}
        totals = [sum(series[c][i] for c in CATEGORIES) for i in range(len(times))]
        i = max(range(len(times)), key=lambda k: (totals[k], -k))
        return {c: series[c][i] for c in CATEGORIES}

    # ---- export ----------------------------------------------------------------------------
    def to_chrome(self) -> dict:
        """Chrome Trace Event Format (opens in Perfetto): one process per device, one thread
        per stream, times in microseconds."""
        out: list[dict] = []
        for d in range(self.n_devices):
            out.append({"ph": "M", "name": "process_name", "pid": d, "tid": 0,
                        "args": {"name": f"device {d}"}})
            for t, s in enumerate(STREAMS):
                out.append({"ph": "M", "name": "thread_name", "pid": d, "tid": t,
                            "args": {"name": s}})
        for e in sorted(self.events, key=lambda e: (e.start, e.device)):
            out.append({"ph": "X", "name": e.label or e.kind, "cat": e.kind, "pid": e.device,
                        "tid": STREAMS.index(e.stream) if e.stream in STREAMS else 2,
                        "ts": e.start * 1e6, "dur": e.duration * 1e6,
                        "args": {"bytes": e.nbytes, "flops": e.flops, "peer": e.peer}})
        for m in sorted(self.memory, key=lambda m: (m.time, m.device)):
            out.append({"ph": "C", "name": "memory (bytes)", "pid": m.device, "tid": 0,
                        "ts": m.time * 1e6, "args": {"total": m.total}})
        return {"traceEvents": out, "displayTimeUnit": "ms",
                "otherData": {"source": self.source, **{k: str(v) for k, v in self.meta.items()}}}

    def save_chrome(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_chrome()))
        return path

    def to_dict(self) -> dict:
        return {"n_devices": self.n_devices, "source": self.source, "meta": self.meta,
                "events": [asdict(e) for e in self.events],
                "memory": [asdict(m) for m in self.memory]}

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        return cls(n_devices=data["n_devices"], source=data["source"], meta=data.get("meta", {}),
                   events=[Event(**e) for e in data["events"]],
                   memory=[MemoryEvent(**m) for m in data["memory"]])
