"""The ring all-reduce, engineered: the same algorithm as ``all_reduce_ring``, made fast.

``all_reduce_ring`` is the version to read: reduce-scatter, then all-gather, one blocking
step after another. ``RingAllReduce`` keeps its algorithm, its chunks (``torch.tensor_split``
of the flat tensor into N), its additions (each rank adds the same numbers in the same
order, so the results are bit for bit those of ``all_reduce_ring``) and its bytes on every
link (2(N - 1)/N S per rank), and is still written only on ``isend``/``irecv``. What changes
is *when* things happen. Each step below is one engineering idea; its effect is measured by
``benchmarks/allreduce_vs_torch.py`` (algos ``ring``, ``ring_reused``,
``ring_fast_unsegmented``, ``ring_fast``, ``ring_fast_unchecked``, ``ring_fast_bare``) and
recorded in ``benchmarks/RESULTS.md``:

1. **Scratch kept between calls.** The receive buffers and the plan (below) are made once
   per (numel, dtype) and reused: no allocation per call, and no page faults on fresh
   memory in the first receive (``ring`` vs ``ring_reused`` shows this step alone).
2. **Segments, pipelined.** Every chunk is cut into segments of about ``segment_bytes``.
   The receive of segment s + 1 is posted *before* segment s is added (``add_``, in place),
   so the addition of one segment overlaps the transfer of the next, and a segment travels
   on to the next rank as soon as it is reduced, without waiting for the rest of its chunk
   (``ring_fast_unsegmented`` vs ``ring_fast``: the same code with one segment per chunk).
3. **The two phases fused.** A rank's fully reduced segment starts its all-gather trip the
   moment its last addition is done, while the reduce-scatter of later segments goes on.
4. **Little Python per segment.** The plan holds every step's segment indices and receive
   buffers; a call makes all segment views with one ``split`` and then only posts,
   waits and adds.
5. **Checked once per call, not per message.** On gloo every message normally carries an
   envelope, a small message of its own that the receiver checks first
   (``comm.envelope``), and every ``isend`` checks its arguments, names itself on the
   rank's board and keeps a handle until it is waited. Both neighbours cut the same plan
   from the same tensor size, and a ring only ever sends right and receives from the left,
   so ``comm.neighbours`` checks the tensors once, in one envelope per call (as
   ``sized_by``; its receive posted when the last call's check passed, so that it is
   waiting when the envelope comes), checks the peers and tag once, and hands back an
   ``isend``/``irecv`` bound to them that posts the torch message, nothing more; the
   messages are recorded when the block ends, so nothing but the wait sits between a
   segment's arrival and its addition (``MPGPU_EDU_CHECK_MESSAGES=0`` switches all
   envelopes off: the benchmark's ``ring_fast_unchecked``; ``ring_fast_bare`` posts the same
   ring with ``dist.isend``/``dist.irecv`` and no communicator).
6. **Receives first, and one connection per direction.** On gloo a message's data moves only
   once its receive is posted (the receiver tells the sender it is ready), and a rank's
   connection to a peer takes one lock for both directions: a rank writing a segment out
   cannot read the one coming in until its write is done. So every receive is posted
   before the sends around it (the all-gather's too, two ahead, into place: safe, see
   ``post_gathers``), and ``comm.neighbours`` sends to a lower rank on a second connection
   (``Lanes``). On two ranks, where both links of the ring join the same two processes,
   the two directions had taken turns; now they run at once (``RESULTS.md``: at 4 MiB the
   bare ring went from 1.17 to about 0.8 times gloo's own time).
7. **Two channels, and larger segments, on gloo.** A connection carries one message at a
   time, in the order they were posted: a segment ready to travel on waits behind every
   send posted before it, and one gloo thread reads all that the connection brings. So
   ``comm.neighbours`` deals the messages out over two pairs of connections in turn
   (``Lanes.channels``; the i-th send and the i-th receive on the same one), as NCCL opens
   several sockets per peer; on two ranks a chunk's reduce-scatter and all-gather messages
   then travel side by side. And on gloo every message costs CPU time (posting it, waking
   for it, a handshake) that the same two cores need for the copies and additions, so its
   segments are 8 MiB (``GLOO_SEGMENT_BYTES``) rather than NCCL's 2 MiB: fewer messages
   win over a finer pipeline there (``RESULTS.md``, 2026-12-06, 2 ranks, checks off: from 4
   to 64 MiB 0.89-0.98 times gloo's time before, 0.69-0.91 after; at 1 MiB, one segment
   per chunk either way, no change; 512 KiB segments ran 1.1-1.5 times gloo's; and DDP,
   whose transfers hide behind backward, ran 1-5% faster with 8 MiB than with 2).

Messages between two neighbours match in the order they are posted (the simulator, gloo
and MPI all keep that order per sender, receiver and tag), so many can be in flight on one
tag. Per rank: 2(N - 1) x segments messages, each alpha + S / (N x segments x beta).
Cost: 2(N - 1) alpha x segments + 2(N - 1)/N S / beta, with the additions and the
per-message overhead hidden behind transfers. Same idea as NCCL's and gloo's ring
(pipelined chunks): Patarasuk and Yuan, JPDC 2009; Thakur et al., 2005.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mpgpu_edu.collectives.basic import check_op, flat_view
from mpgpu_edu.comm.base import Communicator, Work

SEGMENT_BYTES = 2 * 2**20  # per message; a chunk of 12 MiB travels as 6 segments
GLOO_SEGMENT_BYTES = 8 * 2**20  # on gloo (step 7)
BY_BACKEND = -1  # RingAllReduce's default: GLOO_SEGMENT_BYTES on gloo, else SEGMENT_BYTES


@dataclass
class RingPlan:
    """Everything a call needs that depends only on (numel, dtype, N, rank).

    Segment ``c * segments + j`` of ``flat.split(sizes)`` is segment j of chunk c. Unit u of a
    phase is step ``u // segments``, segment ``u % segments``; ``outgoing[u]`` is the segment
    this rank sends in reduce-scatter unit u (and receives in place in all-gather unit u),
    ``incoming[u]`` the one it adds into, ``buffers[u]`` where that addend arrives."""

    sizes: list[int]
    segments: int
    outgoing: list[int]
    incoming: list[int]
    buffers: list[torch.Tensor]


def segment_sizes(numel: int, world_size: int, segments: int) -> list[int]:
    """Lengths of ``tensor_split`` of each of ``tensor_split(numel, N)``'s chunks into
    ``segments`` parts, chunk after chunk."""
    sizes = []
    for c in range(world_size):
        chunk = numel // world_size + (1 if c < numel % world_size else 0)
        sizes += [chunk // segments + (1 if j < chunk % segments else 0)
                  for j in range(segments)]
    return sizes


def make_plan(numel: int, dtype: torch.dtype, device: torch.device, world_size: int,
              rank: int, segment_bytes: int | None) -> RingPlan:
    """The plan of one rank, with its two receive buffers (``all_reduce_ring``'s chunk
    order, ``shift=1``: rank r ends the reduce-scatter owning chunk (r + 1) % N)."""
    n = world_size
    longest = -(-numel // n)
    element = torch.empty((), dtype=dtype, device="meta").element_size()
    segments = 1 if segment_bytes is None else max(1, -(-longest * element // segment_bytes))
    segments = min(segments, max(longest, 1))
    sizes = segment_sizes(numel, n, segments)
    slots = [torch.empty(max(sizes), dtype=dtype, device=device) for _ in range(2)]
    outgoing, incoming, buffers = [], [], []
    for u in range((n - 1) * segments):
        k, j = divmod(u, segments)
        outgoing.append((rank - k) % n * segments + j)
        incoming.append((rank - 1 - k) % n * segments + j)
        buffers.append(slots[u % 2][: sizes[incoming[-1]]])
    return RingPlan(sizes, segments, outgoing, incoming, buffers)


class RingAllReduce:
    """A ring all-reduce that keeps its plans and scratch buffers between calls.

    ``ring = RingAllReduce()`` once (per rank), then ``ring(comm, tensor, op)`` for every
    all-reduce: in place, like ``all_reduce_ring``, any shape, dtype, size and world size.
    Segments of ``SEGMENT_BYTES`` (``GLOO_SEGMENT_BYTES`` on gloo: step 7) unless
    ``segment_bytes`` says otherwise; ``segment_bytes=None`` sends each chunk as one message
    (step 2 above switched off)."""

    def __init__(self, segment_bytes: int | None = BY_BACKEND, tag: int = 0) -> None:
        if segment_bytes is not None and segment_bytes < 1 and segment_bytes != BY_BACKEND:
            raise ValueError(f"segment_bytes must be positive or None, got {segment_bytes}")
        self.segment_bytes, self.tag = segment_bytes, tag
        self.plans: dict[tuple, RingPlan] = {}

    def segment_for(self, comm: Communicator) -> int | None:
        """The segment size on ``comm``'s backend: ``segment_bytes``, or by the backend."""
        if self.segment_bytes != BY_BACKEND:
            return self.segment_bytes
        return GLOO_SEGMENT_BYTES if comm.backend == "gloo" else SEGMENT_BYTES

    def reserve(self, comm: Communicator, tensor: torch.Tensor) -> RingPlan:
        """The plan for tensors like ``tensor`` (made and recorded as ``comm_buffers`` on
        first use). Call it ahead to keep the allocation out of the first all-reduce."""
        key = (tensor.numel(), tensor.dtype, tensor.device, comm.world_size, comm.rank)
        plan = self.plans.get(key)
        if plan is None:
            plan = make_plan(*key, self.segment_for(comm))
            self.plans[key] = plan
            scratch = 2 * max(plan.sizes) * tensor.element_size()
            comm.memory.alloc("comm_buffers", scratch, "ring scratch")
        return plan

    def __call__(self, comm: Communicator, tensor: torch.Tensor, op: str = "sum") -> None:
        check_op(op, tensor)
        if comm.world_size == 1:
            return  # the sum (and the mean) of one tensor is itself
        if tensor.is_contiguous():  # flat_view's own first case, without its generator
            data = tensor.detach() if tensor.requires_grad else tensor
            self._all_reduce(comm, data if data.dim() == 1 else data.view(-1), op)
            return
        with flat_view(tensor) as flat:
            self._all_reduce(comm, flat, op)

    def _all_reduce(self, comm: Communicator, flat: torch.Tensor, op: str) -> None:
        plan = self.reserve(comm, flat)
        n = comm.world_size  # both neighbours cut the same plan from the same size:
        with comm.neighbours(flat, (comm.rank + 1) % n, (comm.rank - 1) % n,
                             self.tag) as (isend, irecv):  # checked once, not per message
            self._reduce(flat, op, n, plan, isend, irecv, comm.backend != "nccl")

    @staticmethod
    def _reduce(flat: torch.Tensor, op: str, n: int, plan: RingPlan,
                isend: Callable[[torch.Tensor], Work],
                irecv: Callable[[torch.Tensor], Work], receives_first: bool = True) -> None:
        """``isend(t)`` goes to the right neighbour, ``irecv(t)`` comes from the left one.
        ``receives_first=False`` (nccl) keeps the order of the ring before step 6: sends
        ahead of the receives beside them, and each all-gather receive posted once the
        reduce-scatter send from its segment has been waited. (torch's nccl process group
        runs the sends and receives between two ranks on one stream, one after another: a
        receive queued ahead of the send its peer waits for would never start.)"""
        segs = flat.split_with_sizes(plan.sizes)  # (Tensor.split imports torch._dynamo)
        outgoing, incoming, buffers = plan.outgoing, plan.incoming, plan.buffers
        units = len(outgoing)
        last = units - plan.segments  # units from here on finish a chunk: this rank's own
        gathered: list[Work] = []

        def post_gathers(upto: int) -> None:
            """The all-gather's receives up to unit ``upto``, straight into place, once every
            reduce-scatter receive is posted (messages from one neighbour match in the order
            they are posted, and it sends all of its reduce-scatter first). Safe before the
            reduce-scatter send from the same segment is waited: a fully reduced segment
            exists only once the next rank has received that send (it carries this rank's
            share), so nothing can land in it sooner."""
            if len(recvs) < units:
                return
            for v in range(len(gathered), min(upto, units)):
                if not receives_first:
                    sends[v].wait()
                gathered.append(irecv(segs[outgoing[v]]))

        # Reduce-scatter. Every receive is posted before the sends around it, so the left
        # neighbour's data can flow while this rank's own is written out (step 6).
        recvs = [irecv(buffers[0])] if receives_first else []
        sends: list[Work] = []
        if receives_first:
            post_gathers(2)  # (a ring of two, one segment per chunk: at once)
        # Step 0 sends this rank's own data: all of it can leave at once.
        sends += [isend(segs[i]) for i in outgoing[: plan.segments]]
        if not receives_first:
            recvs.append(irecv(buffers[0]))
        forwards: list[Work] = []
        for u in range(units):
            if u + 1 < units:  # the next transfer runs while this segment is added
                recvs.append(irecv(buffers[u + 1]))
                if receives_first:
                    post_gathers(2)
            recvs[u].wait()
            seg = segs[incoming[u]]
            seg.add_(buffers[u])
            if u < last:
                sends.append(isend(seg))
                continue
            if op == "mean":
                seg.div_(n)  # by the owner, once, as all_reduce_ring does
            if receives_first:
                post_gathers(u - last + 2)
            forwards.append(isend(seg))  # all-gather, step 0
        # All-gather: received straight into place, then passed on; two receives ahead of
        # the one waited. (Posted all at once, the all-gather's transfers are ready beside
        # the reduce-scatter's last ones and, on the simulator's links, queue with them: its
        # flat 16-GPU ring through one NIC fell from 23.2 to 18.1 GB/s.)
        for u in range(units):
            post_gathers(u + 2)
            gathered[u].wait()
            if u < last:
                forwards.append(isend(segs[outgoing[u]]))
        for work in sends if receives_first else ():  # (else waited above)
            work.wait()
        for work in forwards:
            work.wait()


def all_reduce_ring_fast(comm: Communicator, tensor: torch.Tensor, op: str = "sum", *,
                         state: RingAllReduce | None = None) -> None:
    """All-reduce ``tensor`` in place with ``RingAllReduce``: same result as
    ``all_reduce_ring`` (bit for bit), same bytes per link. Pass the same ``state`` on
    every call to keep its scratch buffers; without one, a fresh one is made (and dropped).
    Cost: see the module."""
    (state if state is not None else RingAllReduce())(comm, tensor, op)
