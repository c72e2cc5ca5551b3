"""From op lists to a timeline: how a ``send`` becomes a timed event.

Replay is a discrete-event simulation over the actors' op lists (see ``ops``), always advancing
the actor with the smallest clock (ties: lower rank, then host before stream), so every
transfer is scheduled in the order of the moment it becomes ready. That order, and so the whole
trace, does not depend on threads.

Cost model:
- compute: a rank's compute stream runs one region at a time; the region's seconds were fixed
  when it ran (FLOPs / (peak x efficiency), or given explicitly). Work on the comm stream
  (the adds of an overlapped all-reduce) runs on that lane, beside the compute stream.
- a transfer is ready when both its send and its receive are posted. Its route names two kinds
  of resources (see ``cluster.topology``):
  * *ports* (a device's port on the textbook uniform cluster, a card's PCIe uplink in one
    direction): one transfer at a time. A transfer starts once every port on its route is
    free, and transfers that share a port queue in the order they became ready.
  * *shared caps* (host memory behind staged PCIe copies, a PCIe switch's uplink, the link
    between two CPU sockets, a GPU's NVSwitch port, a NIC): every transfer crossing one gets
    a fair share of its bandwidth at every moment (max-min fair, "processor sharing"), so a
    newcomer slows the others down and a finished transfer speeds them up.
  (``comm.network`` holds the transfers in flight and their fair shares.)
  A transfer moves its bytes at ``min(beta, its fair shares)`` and completes ``alpha`` after
  its last byte: alone on its route, ``end = start + alpha + bytes / beta``. On a route
  whose alpha is work rather than a wire's delay (``Route.alpha_holds`` names the resources
  it holds: a CPU process's per-message system calls), the transfer first holds those for
  the part of alpha that ranks do side by side, then queues for its whole route and holds all
  of it for the rest of alpha (``Route.alpha_shared``, the part that competes for the shared
  cores) and its bytes, and completes with the last one: the same time alone, but a rank's
  messages pay their alphas one after another.
- a blocking send or receive returns when its transfer completes; ``wait`` likewise.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from mpgpu_edu.comm import ops
from mpgpu_edu.comm.network import Network, Transfer
from mpgpu_edu.cluster.trace import Event, MemoryEvent, Trace

@dataclass
class _Lane:
    rank: int
    lane: int
    ops: list[ops.Op]
    pc: int = 0
    clock: float = 0.0


class _Replay:
    def __init__(self, op_lists: dict[tuple[int, int], list[ops.Op]], cluster: Any,
                 n_devices: int) -> None:
        self.cluster, self.n = cluster, n_devices
        self.lanes = {key: _Lane(key[0], key[1], list(o)) for key, o in op_lists.items()}
        self.heap = [(0.0, r, lane) for (r, lane) in self.lanes]
        heapq.heapify(self.heap)
        self.transfers: dict[tuple, Transfer] = {}
        self.handle_of: dict[int, tuple] = {}
        self.posted_at: dict[int, float] = {}
        self.network = Network()
        self.compute_free = [0.0] * n_devices
        self.submitted: dict[tuple[int, int], float] = {}
        self.finished: dict[tuple[int, int], float] = {}
        self.blocked: dict[Any, list[_Lane]] = {}
        self.events: list[Event] = []
        self.memory: list[MemoryEvent] = []
        self.held = [0] * n_devices
        self.logs: list[list[tuple[float, str]]] = [[] for _ in range(n_devices)]

    def run(self, partial: bool = False) -> None:
        """Time every op; ``partial``: the op lists are a running program's so far, and a
        lane may end blocked on a message not yet matched."""
        while True:
            due = self.network.next_time()
            if due < float("inf") and (not self.heap or due <= self.heap[0][0]):
                for t in self.network.complete_due():
                    self._complete(t)
                continue
            if not self.heap:
                break
            clock, rank, lane_id = heapq.heappop(self.heap)
            lane = self.lanes[(rank, lane_id)]
            lane.clock = max(lane.clock, clock)
            self._advance(lane)
        stuck = [ln for ln in self.lanes.values() if ln.pc < len(ln.ops)]
        if stuck and not partial:  # cannot happen for a program that finished executing
            raise RuntimeError(f"replay stalled on {[(ln.rank, ln.lane) for ln in stuck]}")

    def _advance(self, lane: _Lane) -> None:
        """Run the lane's ops until it blocks or its clock moves past the others'."""
        while lane.pc < len(lane.ops) and self._step(lane, lane.ops[lane.pc]):
            pass

    def _step(self, lane: _Lane, op: ops.Op) -> bool:
        """Apply one op and move the lane's pc; False when the lane yields or must wait."""
        if isinstance(op, ops.Compute):
            if lane.lane == ops.HOST:  # the compute stream: one region at a time
                start = max(lane.clock, self.compute_free[lane.rank])
                lane.clock = self.compute_free[lane.rank] = start + op.seconds
            else:  # work on the comm stream (a reduction's adds) runs beside it
                start, lane.clock = lane.clock, lane.clock + op.seconds
            stream = "compute" if lane.lane == ops.HOST else "comm"
            self.events.append(Event(lane.rank, stream, op.kind, start, lane.clock,
                                     op.label, flops=op.flops))
            lane.pc += 1
            heapq.heappush(self.heap, (lane.clock, lane.rank, lane.lane))
            return False
        if isinstance(op, ops.Post):
            self._post(lane, op)
            if op.blocking:
                return self._wait_for(lane, ("handle", op.handle), self._end_of(op.handle))
        elif isinstance(op, ops.Wait):
            return self._wait_for(lane, ("handle", op.handle), self._end_of(op.handle))
        elif isinstance(op, ops.Submit):
            self.submitted[(lane.rank, op.job)] = lane.clock
            self._wake(("submit", lane.rank, op.job), lane.clock)
        elif isinstance(op, ops.JobStart):
            return self._wait_for(lane, ("submit", lane.rank, op.job),
                                  self.submitted.get((lane.rank, op.job)))
        elif isinstance(op, ops.JobEnd):
            self.finished[(lane.rank, op.job)] = lane.clock
            self._wake(("job", lane.rank, op.job), lane.clock)
        elif isinstance(op, ops.WaitJob):
            return self._wait_for(lane, ("job", lane.rank, op.job),
                                  self.finished.get((lane.rank, op.job)))
        elif isinstance(op, ops.Memory):
            self.held[lane.rank] += op.delta
            self.memory.append(MemoryEvent(lane.rank, lane.clock, op.category, op.delta,
                                           op.label, self.held[lane.rank]))
        elif isinstance(op, ops.Log):
            self.logs[lane.rank].append((lane.clock, op.text))
        else:
            raise TypeError(f"unknown op {op!r}")
        lane.pc += 1
        return True

    def _wait_for(self, lane: _Lane, key: Any, ready_at: float | None) -> bool:
        """The op at pc waits for ``key``: block until it is known, then move on at
        ``ready_at``."""
        if ready_at is None:
            self.blocked.setdefault(key, []).append(lane)
            return False
        lane.pc += 1
        if ready_at > lane.clock:
            lane.clock = ready_at
            heapq.heappush(self.heap, (lane.clock, lane.rank, lane.lane))
            return False
        return True

    def _wake(self, key: Any, at: float) -> None:
        for lane in self.blocked.pop(key, []):
            lane.clock = max(lane.clock, at)
            lane.pc += 1
            heapq.heappush(self.heap, (lane.clock, lane.rank, lane.lane))

    def _end_of(self, handle: int) -> float | None:
        return self.transfers[self.handle_of[handle]].end

    def _post(self, lane: _Lane, op: ops.Post) -> None:
        t = self.transfers.setdefault(op.channel, Transfer())
        self.handle_of[op.handle] = op.channel
        self.posted_at[op.handle] = lane.clock
        if op.op == "send":
            t.send = op
        else:
            t.recv = op
        t.posted.append(lane.clock)
        if t.send is not None and t.recv is not None:
            self._schedule(t, max(t.posted))

    def _schedule(self, t: Transfer, ready: float) -> None:
        self.network.add(t, self.cluster.route(t.send.src, t.send.dst), ready)

    def _complete(self, t: Transfer) -> None:
        """``t`` sent its last byte at the network's clock; it completes ``alpha`` later."""
        src, dst, nbytes = t.send.src, t.send.dst, t.send.nbytes
        alpha = 0.0 if t.route.alpha_holds else t.route.alpha_s  # paid before, when it holds
        t.end = t.since + alpha + t.left / t.rate
        label = f"tag {t.send.tag}" if t.send.tag else ""
        self.events.append(Event(src, "comm", "send", t.start, t.end, label or f"to {dst}",
                                 nbytes=nbytes, peer=dst))
        self.events.append(Event(dst, "comm", "recv", t.start, t.end, label or f"from {src}",
                                 nbytes=nbytes, peer=src))
        self._wake(("handle", t.send.handle), t.end)
        self._wake(("handle", t.recv.handle), t.end)

def time_so_far(op_lists: dict[tuple[int, int], list[ops.Op]], cluster: Any,
                n_devices: int) -> tuple[dict[int, float], dict[int, float]]:
    """Time the op lists of a program still running (every rank blocked): returns when each
    post (by handle) was posted, and when each matched transfer (by handle of either side)
    completes. The simulator uses it to decide which message arrives first."""
    sim = _Replay(op_lists, cluster, n_devices)
    sim.run(partial=True)
    ends = {handle: sim.transfers[channel].end for handle, channel in sim.handle_of.items()
            if sim.transfers[channel].end is not None}
    return sim.posted_at, ends


def replay(op_lists: dict[tuple[int, int], list[ops.Op]], cluster: Any, n_devices: int,
           meta: dict | None = None) -> tuple[Trace, list[list[tuple[float, str]]]]:
    """Time the op lists of one run on ``cluster``: returns the trace and per-rank logs
    as (simulated time, text)."""
    sim = _Replay(op_lists, cluster, n_devices)
    sim.run()
    events = sorted(sim.events, key=lambda e: (e.start, e.device, e.stream, e.end))
    trace = Trace(n_devices=n_devices, events=events, memory=sim.memory, source="simulated",
                  meta=dict(meta or {}))
    return trace, sim.logs
