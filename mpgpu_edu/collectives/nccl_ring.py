"""NCCL's ring all-reduce as NCCL runs it, for the simulator: many channels, fused reductions.

The course's rings are the algorithm; NCCL adds three engineering steps that decide how close
a real all-reduce comes to the links' bandwidth, and the fidelity table (docs/fidelity.md)
models them to compare with published nccl-tests results:

1. **Channels.** NCCL splits the buffer over several *channels*, each a ring of its own (with
   its own order of the ranks) running at the same time on its own thread blocks: on one
   8-GPU NVSwitch node it runs 24 (NVIDIA/nccl#1367: "12 one-direction channel[s] ... after
   duplicate, there are 24 channels totally", 8x H100; NVIDIA/nccl-tests#100: "Channel 23/24",
   8x A100); on two nodes with a NIC per GPU, one or more rings per rail (NVIDIA/nccl#1453).
2. **Pipelined chunks.** Each channel moves its part in chunks (``SEGMENT_BYTES``, NCCL's 2 MiB
   for the Simple protocol), the next one already on the wire while this one is reduced; as in
   ``ring_fast.RingAllReduce``, two receive slots per channel.
3. **Reduction inside the copy.** NCCL's kernel adds the received chunk to the local one as it
   forwards it (its ``reduceCopy`` primitive): no kernel launch per chunk, only the memory
   traffic of reading two chunks and writing one. Here each add is a compute region charged
   exactly that, ``3 x chunk bytes / memory bandwidth``, and no launch.

Same result as ``all_reduce_ring`` per channel slice (each channel a ring on its own slice);
same bytes per rank as one ring, ``2 (N - 1) / N x S``. SPMD on the simulator (the fused
reduction needs the cluster's memory bandwidth); on a real backend use ``RingAllReduce``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mpgpu_edu.collectives.basic import check_op, flat_view
from mpgpu_edu.collectives.multichannel import _check_rings
from mpgpu_edu.collectives.ring_fast import RingPlan, make_plan
from mpgpu_edu.comm.base import Communicator, Work

SEGMENT_BYTES = 2 * 2**20  # NCCL's chunk per channel, Simple protocol (ring_fast.SEGMENT_BYTES)
NODE_CHANNELS = 24  # one 8-GPU NVSwitch node (see the module's sources)


@dataclass
class _Channel:
    """One ring's state on this rank: its slice's segments, plan and neighbours."""

    segs: list[torch.Tensor]
    plan: RingPlan
    right: int
    left: int
    tag: int
    sends: list[Work] = field(default_factory=list)
    recvs: list[Work] = field(default_factory=list)
    forwards: list[Work] = field(default_factory=list)
    gathered: list[Work] = field(default_factory=list)


def all_reduce_nccl(comm: Communicator, tensor: torch.Tensor, op: str = "sum",
                    rings: Sequence[Sequence[int]] | None = None, channels: int = NODE_CHANNELS,
                    segment_bytes: int = SEGMENT_BYTES) -> None:
    """All-reduce ``tensor`` in place as NCCL's ring does (see the module): ``rings`` gives
    each channel's order of the ranks (default: ``channels`` rings 0, 1, ..., N-1)."""
    check_op(op, tensor)
    n = comm.world_size
    rings = [list(range(n))] * channels if rings is None else [list(r) for r in rings]
    _check_rings(rings, n)
    memory_seconds = getattr(getattr(comm, "cluster", None), "memory_seconds", None)
    if memory_seconds is None:
        raise TypeError("all_reduce_nccl models NCCL on the simulator; on a real backend use "
                        "collectives.ring_fast.RingAllReduce")
    if n == 1:
        return
    with flat_view(tensor) as flat:
        state = []
        for c, (ring, piece) in enumerate(zip(rings, torch.tensor_split(flat, len(rings)))):
            p = ring.index(comm.rank)
            plan = make_plan(piece.numel(), piece.dtype, piece.device, n, p, segment_bytes)
            state.append(_Channel(list(piece.split_with_sizes(plan.sizes)), plan, ring[(p + 1) % n],
                                  ring[(p - 1) % n], c))
        _run(comm, state, op, n, memory_seconds)


def _run(comm: Communicator, state: list[_Channel], op: str, n: int, memory_seconds) -> None:
    """``RingAllReduce``'s schedule on every channel at once, unit by unit."""
    isend, irecv = comm.isend, comm.irecv
    for ch in state:  # reduce-scatter, step 0: this rank's own segments leave at once
        ch.sends = [isend(ch.segs[i], ch.right, ch.tag)
                    for i in ch.plan.outgoing[: ch.plan.segments]]
        ch.recvs = [irecv(ch.plan.buffers[0], ch.left, ch.tag)]
    units = max(len(ch.plan.outgoing) for ch in state)
    for u in range(units):
        for ch in state:
            plan = ch.plan
            if u >= len(plan.outgoing):
                continue
            if u + 1 < len(plan.outgoing):
                ch.recvs.append(irecv(plan.buffers[u + 1], ch.left, ch.tag))
            ch.recvs[u].wait()
            seg = ch.segs[plan.incoming[u]]
            with comm.compute("compute", "reduce in the copy",
                              seconds=memory_seconds(3 * seg.numel() * seg.element_size())):
                seg.add_(plan.buffers[u])
            if u < len(plan.outgoing) - plan.segments:
                ch.sends.append(isend(seg, ch.right, ch.tag))
                continue
            if op == "mean":
                seg.div_(n)
            ch.forwards.append(isend(seg, ch.right, ch.tag))
    for u in range(units):  # all-gather, received in place and passed on
        for ch in state:
            plan = ch.plan
            last = len(plan.outgoing)
            if u >= last:
                continue
            for v in range(len(ch.gathered), min(u + 2, last)):
                ch.sends[v].wait()
                ch.gathered.append(irecv(ch.segs[plan.outgoing[v]], ch.left, ch.tag))
            ch.gathered[u].wait()
            if u < last - plan.segments:
                ch.forwards.append(isend(ch.segs[plan.outgoing[u]], ch.right, ch.tag))
    for ch in state:
        for work in ch.forwards:
            work.wait()
