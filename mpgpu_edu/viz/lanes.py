"""Where a timeline row's events are drawn: messages of one band that run at the same time (a
server sending to 7 workers at once) each take their own thin sub-lane (greedy interval
assignment, at most ``MAX_LANES`` deep), and a group whose labels do not fit is counted by one
badge: "×7 to 0..6"."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from mpgpu_edu.cluster.trace import Event

BAR_HEIGHT = 0.8
MAX_LANES = 8      # sub-lanes of one band at most; beyond, the lanes wrap (the badge counts)
LANE_GAP = 0.2     # share of a sub-lane left blank, so that neighbouring bars stay apart


@dataclass(frozen=True)
class Placed:
    """Where one event is drawn: its bar's centre ``y`` and ``height``, and the ``cluster``
    of overlapping events it belongs to (its index in the row's band; ``lanes`` > 1 when the
    cluster's events run at the same time and take thin sub-lanes)."""

    event: Event
    y: float
    height: float
    lanes: int
    band: tuple[float, float]  # (top, height) of the band the cluster is drawn in
    cluster: int


def _clusters(events: Sequence[Event]) -> list[list[Event]]:
    """The events grouped into chains of overlapping intervals, in time order."""
    out: list[list[Event]] = []
    reach = float("-inf")
    for e in sorted(events, key=lambda e: (e.start, e.end)):
        if out and e.start < reach:
            out[-1].append(e)
        else:
            out.append([e])
            reach = e.end
        reach = max(reach, e.end)
    return out


def assign_lanes(events: Sequence[Event]) -> tuple[list[int], int]:
    """Greedy interval assignment: each event (in the given order) gets the lowest lane free
    at its start. Returns the lane of each event and the number of lanes used, which is the
    largest number of events running at once."""
    order = sorted(range(len(events)), key=lambda i: (events[i].start, events[i].end))
    ends: list[float] = []
    lanes = [0] * len(events)
    for i in order:
        e = events[i]
        free = next((k for k, end in enumerate(ends) if end <= e.start), None)
        if free is None:
            ends.append(e.end)
            free = len(ends) - 1
        else:
            ends[free] = e.end
        lanes[i] = free
    return lanes, len(ends)


def _place_band(events: Sequence[Event], top: float, height: float,
                first_cluster: int) -> list[Placed]:
    """Place events in the band [top, top + height] (y points down): an event that overlaps
    nothing takes the whole band; a cluster of events that overlap each other splits the band
    into one thin sub-lane per event running at once (``assign_lanes``), first lane on top.
    Beyond ``MAX_LANES`` at once the lanes wrap, and the cluster's count badge says how many
    there are."""
    placed = []
    for c, cluster in enumerate(_clusters(events), start=first_cluster):
        lanes, n = assign_lanes(cluster)
        shown = min(n, MAX_LANES)
        lane_h = height / shown
        bar_h = lane_h if shown == 1 else lane_h * (1 - LANE_GAP)
        for e, lane in zip(cluster, lanes):
            y = top + (lane % shown + 0.5) * lane_h
            placed.append(Placed(e, y, bar_h, n, (top, height), c))
    return placed


def place_row(y: float, events: Sequence[Event], split: bool) -> list[Placed]:
    """Where each event of one row is drawn. With ``split``, sends take the upper half of
    the row and everything else the lower half (the y axis points down); within its band,
    events that run at the same time take separate sub-lanes (``_place_band``)."""
    top = y - BAR_HEIGHT / 2
    if not split:
        return _place_band(events, top, BAR_HEIGHT, 0)
    half = BAR_HEIGHT / 2
    sends = [e for e in events if e.kind == "send"]
    placed = _place_band(sends, top, half, 0)
    others = [e for e in events if e.kind != "send"]
    return placed + _place_band(others, y, half, len(placed))


def _ranges(numbers: Sequence[int]) -> str:
    """Sorted numbers written short: runs of three or more as "a..b" ("0,2..7")."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{r[0]}..{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)


def count_badge(events: Sequence[Event]) -> str:
    """One label for events drawn together: "×7 to 0..6" when their labels are one word and
    a peer each ("to 3"), "×3 F1" when they share a label, else "×3"."""
    head = f"\u00d7{len(events)}"
    labels = [e.label or "" for e in events]
    parsed = [re.fullmatch(r"(.*?)(\d+)", label) for label in labels]
    if all(parsed) and len({m.group(1) for m in parsed}) == 1:
        prefix = parsed[0].group(1)
        return f"{head} {prefix}{_ranges(sorted({int(m.group(2)) for m in parsed}))}"
    if len(set(labels)) == 1 and labels[0]:
        return f"{head} {labels[0]}"
    return head
