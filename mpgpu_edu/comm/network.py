"""The transfers in flight during a replay, and how they share the cluster's links.

A transfer's route names two kinds of resources (see ``cluster.topology``): *ports* (a
device's port on the textbook uniform cluster, a card's PCIe uplink in one direction) carry one
transfer at a time, first come, first served; *shared caps* (host memory behind staged PCIe
copies, a PCIe switch's uplink, the socket link, a GPU's NVSwitch port, a NIC) give every
transfer crossing them a max-min fair share of their bandwidth at every moment
(``fair_rates``). ``replay`` adds each transfer when it becomes ready and advances the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mpgpu_edu.comm import ops


@dataclass(eq=False)
class Transfer:
    send: ops.Post | None = None
    recv: ops.Post | None = None
    posted: list[float] = field(default_factory=list)
    end: float | None = None
    route: Any = None
    start: float = 0.0
    rate: float = 0.0
    since: float = 0.0  # when ``rate`` was last set; ``left`` bytes remained then
    left: float = 0.0
    resources: tuple[str, ...] = ()  # what it holds now (its alpha's, then its route's)
    shares: tuple[tuple[str, float], ...] = ()
    in_alpha: bool = False

    @property
    def finish(self) -> float:
        """When the last byte leaves, at the current rate."""
        return self.since + self.left / self.rate if self.left else self.since


class Network:
    """The transfers in flight: port queues (first come, first served) and shared caps (fair
    share). ``now`` only moves forward; the replay advances it before each lane runs."""

    def __init__(self) -> None:
        self.now = 0.0
        self.queues: dict[str, list[Transfer]] = {}
        self.active: list[Transfer] = []
        # Rates are shared out again only before the clock moves or a finish is read: many
        # transfers added at one instant are shared once (the rates in between would hold for
        # no time at all).
        self._stale = False

    def next_time(self) -> float:
        """When the next transfer in flight sends its last byte (inf when none is)."""
        self._settle()
        return min((t.finish for t in self.active), default=float("inf"))

    def add(self, t: Transfer, route: Any, now: float) -> None:
        """``t`` became ready at ``now`` (no earlier than the network's clock)."""
        self._move_to(now)
        t.route = route
        if route.alpha_holds:
            t.in_alpha, t.resources, t.shares = True, tuple(route.alpha_holds), ()
        else:
            t.resources, t.shares = tuple(route.resources), tuple(route.shares)
        self._enqueue(t)
        self._stale = True

    def _enqueue(self, t: Transfer) -> None:
        for port in t.resources:
            self.queues.setdefault(port, []).append(t)
        if self._at_heads(t):
            self._start(t)

    def complete_due(self) -> list[Transfer]:
        """Advance to ``next_time()``; return the transfers whose last byte left then, and start
        the ones that were queued behind them."""
        self._move_to(self.next_time())
        done = [t for t in self.active if t.finish <= self.now]
        self.active = [t for t in self.active if t.finish > self.now]
        freed = [(t, t.resources) for t in done]
        finished = [t for t in done if not t.in_alpha]
        for t in done:
            for port in t.resources:
                self.queues[port].pop(0)  # a transfer in flight heads each of its queues
        for t in done:
            if t.in_alpha:  # its alpha is paid: now it queues for its route's bytes
                t.in_alpha, t.resources, t.shares = False, t.route.resources, t.route.shares
                self._enqueue(t)
        for _, ports in freed:
            for port in ports:
                waiting = self.queues[port]
                if waiting and waiting[0] not in self.active and self._at_heads(waiting[0]):
                    self._start(waiting[0])
        self._stale = True
        return finished

    def _at_heads(self, t: Transfer) -> bool:
        return all(self.queues[port][0] is t for port in t.resources)

    def _start(self, t: Transfer) -> None:
        if t.in_alpha or not t.route.alpha_holds:
            t.start = self.now  # a transfer starts when it first holds anything
        t.since = self.now
        route = t.route
        held = route.alpha_s * route.beta_Bps  # alpha as bytes at the route's rate
        if t.in_alpha:
            t.left = (1.0 - route.alpha_shared) * held
        else:
            t.left = float(t.send.nbytes) + (route.alpha_shared * held if route.alpha_holds
                                             else 0.0)
        t.rate = 0.0
        self.active.append(t)

    def _move_to(self, time: float) -> None:
        if time > self.now:
            self._settle()  # the rates of this instant, before it is left
        self.now = max(self.now, time)  # bytes left are settled only when a rate changes

    def _settle(self) -> None:
        if self._stale:
            self._stale = False
            self._share()

    def _share(self) -> None:
        """Max-min fair rates: raise every unfixed transfer's rate together until it meets its
        own route's ``beta`` or fills a shared cap; fix those, repeat."""
        rates = fair_rates(self.active)
        for t, rate in zip(self.active, rates):
            if rate != t.rate:
                if t.rate:
                    t.left = max(0.0, t.left - (self.now - t.since) * t.rate)
                t.since, t.rate = self.now, rate


def fair_rates(flows: list[Transfer]) -> list[float]:
    """Max-min fair (progressive filling) rates of ``flows`` over their shared caps: raise
    every open flow's rate together to the next level at which one meets its route's ``beta``
    or a cap it crosses is full (cap / its open users); fix those flows there; repeat.

    Flows with the same caps and the same ``beta`` always get the same rate, so they are
    filled as one group of that many (NCCL's 24 channels between two GPUs are one group)."""
    groups: dict[tuple[Any, float], list[int]] = {}
    for i, t in enumerate(flows):
        groups.setdefault((t.shares, t.route.beta_Bps), []).append(i)
    keys = list(groups)
    counts = [len(groups[key]) for key in keys]
    caps = [tuple(name for name, _ in shares) for shares, _ in keys]
    betas = [beta for _, beta in keys]
    room: dict[str, float] = {}
    users: dict[str, int] = {}
    for (shares, _), count in zip(keys, counts):
        for name, cap in shares:
            room[name] = cap
            users[name] = users.get(name, 0) + count
    level_of = [0.0] * len(keys)
    open_ = list(range(len(keys)))
    while open_:
        shares_now = {name: room[name] / count for name, count in users.items() if count}
        level = min(min(betas[g] for g in open_), min(shares_now.values(), default=float("inf")))
        full = {name for name, share in shares_now.items() if share <= level}
        fixed = [g for g in open_ if betas[g] <= level or any(n in full for n in caps[g])]
        for g in fixed:
            level_of[g] = level
            for name in caps[g]:
                # rounding never goes below 0
                room[name] = max(0.0, room[name] - level * counts[g])
                users[name] -= counts[g]
        done = set(fixed)
        open_ = [g for g in open_ if g not in done]
    rates = [0.0] * len(flows)
    for key, level in zip(keys, level_of):
        for i in groups[key]:
            rates[i] = float(level)
    return rates
