"""The engineered ring (``collectives.ring_fast``): the exact sum for every world size and
size, bit for bit ``all_reduce_ring``'s result, the ring's bytes on every link, only
point-to-point messages, kept scratch; and DDP's overlapped step uses it."""

from __future__ import annotations

import functools
import threading

import pytest
import torch
import torch.distributed as dist

from mpgpu_edu.collectives import all_reduce_ring
from mpgpu_edu.collectives.ring_fast import (GLOO_SEGMENT_BYTES, SEGMENT_BYTES, RingAllReduce,
                                             all_reduce_ring_fast, segment_sizes)
from mpgpu_edu.comm import launch
from mpgpu_edu.replica.data import make_batches
from mpgpu_edu.dp import ddp, train_ddp
from strategy_fns import model_fn

SEGMENTS = {"one per chunk": None, "4-byte segments": 4, "12-byte segments": 12}


def exact_sums(comm, cases: list[tuple[int, str]], segment_bytes: int | None) -> list:  # noqa: ANN001
    """For each (numel, op): rank r holds r + 1 + arange, integers, so the sum in float64 is
    exact. One ring object for all cases, each run twice: the second call reuses the plan and
    its scratch, and a later size makes a plan of its own."""
    n = comm.world_size
    ring = RingAllReduce(segment_bytes)
    failed = []
    for numel, op in cases:
        for _ in range(2):
            tensor = torch.arange(numel, dtype=torch.float64) + comm.rank + 1
            ring(comm, tensor, op)
        want = n * torch.arange(numel, dtype=torch.float64) + n * (n + 1) / 2
        if not torch.equal(tensor, want / n if op == "mean" else want):
            failed.append((numel, op))
    return failed


@pytest.mark.parametrize("segment_bytes", SEGMENTS.values(), ids=SEGMENTS.keys())
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_exact_sum_for_every_world_size_and_odd_sizes(n: int, segment_bytes) -> None:
    cases = [(numel, op) for numel in sorted({0, 1, n - 1, n + 1, 2 * n + 1, 37})
             for op in ("sum", "mean")]
    result = launch(exact_sums, n, cases, segment_bytes, timeout=300).results
    assert result == [[]] * n, f"{n} ranks: (elements, op) that failed per rank: {result}"


def sums_in_order(comm, receives_first: bool, segment_bytes: int | None) -> list:  # noqa: ANN001
    """``exact_sums``' check, with the ring's messages posted in the given order (nccl's
    sends first, or receives first)."""
    n, failed = comm.world_size, []
    ring = RingAllReduce(segment_bytes)
    for numel in (1, n + 1, 37, 1001):
        tensor = torch.arange(numel, dtype=torch.float64) + comm.rank + 1
        plan = ring.reserve(comm, tensor)
        with comm.neighbours(tensor, (comm.rank + 1) % n, (comm.rank - 1) % n) as (s, r):
            RingAllReduce._reduce(tensor, "sum", n, plan, s, r, receives_first)
        if not torch.equal(tensor, n * torch.arange(numel, dtype=torch.float64)
                           + n * (n + 1) / 2):
            failed.append(numel)
    return failed


@pytest.mark.parametrize("receives_first", [True, False], ids=["receives first", "sends first"])
@pytest.mark.parametrize("backend", ["sim", pytest.param("gloo", marks=pytest.mark.gloo)])
def test_both_orders_of_posting_give_the_exact_sum(receives_first: bool, backend: str) -> None:
    """gloo and the simulator post receives first; nccl keeps sends first (its sends and
    receives between two ranks share one stream). Both orders, 2 and 3 ranks, segments."""
    kwargs = {} if backend == "sim" else {"backend": "gloo", "timeout": 60}
    for n in (2, 3):
        for segment_bytes in (None, 16):
            run = launch(sums_in_order, n, receives_first, segment_bytes, **kwargs)
            assert run.results == [[]] * n, (n, segment_bytes, run.results)


def same_as_ring(comm, numel: int, op: str, segment_bytes: int | None) -> bool:  # noqa: ANN001
    x = torch.randn(numel, generator=torch.Generator().manual_seed(comm.rank))
    reference, fast = x.clone(), x.clone()
    all_reduce_ring(comm, reference, op)
    all_reduce_ring_fast(comm, fast, op, state=RingAllReduce(segment_bytes))
    return torch.equal(reference, fast)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_bit_for_bit_the_reference_ring(n: int, op: str) -> None:
    # 101 elements: no world size divides them, and 4-byte segments still make a hundred
    # messages per chunk (with 1001, a loaded machine needed over a minute per launch).
    for segment_bytes in SEGMENTS.values():
        run = launch(same_as_ring, n, 101, op, segment_bytes, timeout=180)
        assert run.results == [True] * n


def shaped(comm) -> list[torch.Tensor]:  # noqa: ANN001
    """A 2-D non-contiguous tensor and a scalar, reduced in place."""
    base = torch.arange(12.0).view(3, 4) * (comm.rank + 1)
    transposed, scalar = base.t(), torch.tensor(float(comm.rank))
    ring = RingAllReduce(segment_bytes=8)
    ring(comm, transposed, "sum")
    ring(comm, scalar, "mean")
    return [base, scalar]


def test_shapes_non_contiguous_and_scalar() -> None:
    for base, scalar in launch(shaped, 3).results:
        torch.testing.assert_close(base, torch.arange(12.0).view(3, 4) * 6)
        assert scalar.item() == 1.0


def test_segments_split_each_chunk_as_tensor_split_does() -> None:
    flat = torch.arange(11)
    want = [len(s) for chunk in torch.tensor_split(flat, 3) for s in torch.tensor_split(chunk, 2)]
    assert segment_sizes(11, 3, 2) == want


def stats_of(step: object, n: int, numel: int) -> list[dict]:
    return [s.to_dict() for s in launch(step, n, numel).stats]


def ring_step(comm, numel: int) -> None:  # noqa: ANN001
    all_reduce_ring(comm, torch.ones(numel), "sum")


def fast_step(comm, numel: int) -> None:  # noqa: ANN001
    RingAllReduce(segment_bytes=64)(comm, torch.ones(numel), "sum")


@pytest.mark.parametrize("n, numel", [(2, 1000), (3, 1001), (4, 3), (5, 4099)])
def test_the_same_bytes_on_every_link_as_the_ring(n: int, numel: int) -> None:
    ring, fast = stats_of(ring_step, n, numel), stats_of(fast_step, n, numel)
    for rank in range(n):
        assert fast[rank]["sent_to"] == ring[rank]["sent_to"]  # right neighbour only
        assert fast[rank]["received_from"] == ring[rank]["received_from"]
        assert set(fast[rank]["sent_to"]) == {(rank + 1) % n}
    if numel > 64 * n:  # several segments per chunk: more messages, not more bytes
        assert fast[0]["messages_sent"] > ring[0]["messages_sent"]


def scratch_is_kept(comm) -> bool:  # noqa: ANN001
    ring = RingAllReduce(segment_bytes=16)
    ring(comm, torch.ones(100), "sum")
    buffers = [b.data_ptr() for plan in ring.plans.values() for b in plan.buffers]
    ring(comm, torch.ones(100), "sum")
    ring(comm, torch.ones(50), "sum")  # another size: its own plan
    again = [b.data_ptr() for b in ring.plans[(100, torch.float32, torch.device("cpu"),
                                                comm.world_size, comm.rank)].buffers]
    return len(ring.plans) == 2 and again == buffers


def test_scratch_is_made_once_per_size_and_recorded() -> None:
    run = launch(scratch_is_kept, 3)
    assert run.results == [True] * 3
    scratch = [m for m in run.trace.memory if m.label == "ring scratch"]
    assert len(scratch) == 2 * 3 and all(m.delta > 0 for m in scratch)  # 2 sizes, 3 ranks


def no_collectives(comm, cases: list[tuple[int, str]], segment_bytes: int | None  # noqa: ANN001
                   ) -> list:
    """On gloo: the exact sums with every torch.distributed collective disabled."""
    def blocked(*_: object, **__: object) -> None:
        raise AssertionError("a torch.distributed collective was called")

    names = ["all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
             "all_gather_into_tensor", "broadcast", "reduce", "all_to_all"]
    saved = {name: getattr(dist, name) for name in names}
    for name in names:
        setattr(dist, name, blocked)
    try:
        return exact_sums(comm, cases, segment_bytes)
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


@pytest.mark.gloo
@pytest.mark.parametrize("n", [2, 3])
def test_exact_sum_on_gloo_with_only_point_to_point(n: int) -> None:
    cases = [(numel, op) for numel in (1, n + 1, 1001) for op in ("sum", "mean")]
    for segment_bytes in (None, 64):
        run = launch(no_collectives, n, cases, segment_bytes, backend="gloo", timeout=120)
        assert run.results == [[]] * n, (segment_bytes, run.results)


def connections_used(comm) -> dict:  # noqa: ANN001
    """Which process group each of the fast ring's torch messages went on, by direction,
    on the program's lane and on the comm stream's (a ``run_async`` job)."""
    lanes, seen = comm.lanes, []
    groups = {"main": lanes.main if lanes.main is not None else dist.group.WORLD,
              "stream": lanes.stream, "main_down": lanes.main_down,
              "stream_down": lanes.stream_down}
    for lane in ("main", "stream"):
        for k, (up, down) in enumerate(getattr(lanes, f"{lane}_more"), start=1):
            groups[f"{lane}{k}"], groups[f"{lane}{k}_down"] = up, down
    names = {id(group): name for name, group in groups.items()}
    group_type = dist.ProcessGroup
    saved = group_type.__dict__["send"], group_type.__dict__["recv"]  # (restored as they were)

    def spy(kind, fn):  # noqa: ANN001, ANN202
        def posted(group, tensors, peer, tag):  # noqa: ANN001, ANN202
            seen.append((kind, peer > comm.rank if kind == "send" else peer < comm.rank,
                         names.get(id(group), "?"), tensors[0].dtype))
            return fn.__get__(group)(tensors, peer, tag)
        return posted

    group_type.send, group_type.recv = spy("send", saved[0]), spy("recv", saved[1])
    try:
        ring = RingAllReduce(segment_bytes=64)
        tensor = torch.arange(1001, dtype=torch.float64) + comm.rank
        ring(comm, tensor)
        program = list(seen)
        seen.clear()
        comm.run_async(ring, comm, tensor).wait()
        return {"program": program, "stream": list(seen), "sum": tensor[:3].tolist()}
    finally:
        group_type.send, group_type.recv = saved


@pytest.mark.gloo
@pytest.mark.parametrize("n", [2, 3])
def test_on_gloo_each_direction_has_its_own_connections_dealt_in_turn(n: int) -> None:
    """gloo's connection to a peer takes one lock for both directions: the fast ring sends
    to a higher rank on the lane's groups and to a lower rank on its second ones, and
    receives accordingly, so that on two ranks its two directions run at once. And it deals
    its messages out over the lane's channels in turn: message i on channel i % 2, at
    both ends (a wrong deal would hang or sum wrongly)."""
    from mpgpu_edu.comm.dist_work import GLOO_CHANNELS

    assert GLOO_CHANNELS == 2
    run = launch(connections_used, n, backend="gloo", timeout=120)
    want = [float(n * k + n * (n - 1) // 2) * n for k in range(3)]  # two all-reduces
    for rank, result in enumerate(run.results):
        assert result["sum"] == want
        for lane, first in (("program", "main"), ("stream", "stream")):
            data = [(kind, upward, group) for kind, upward, group, dtype in result[lane]
                    if dtype == torch.float64]  # the data, not the size check's envelope
            assert data, (rank, lane)
            for kind in ("send", "recv"):
                dealt = [(upward, group) for k, upward, group in data if k == kind]
                channels = [first, f"{first}1"]
                wanted = [channels[i % 2] + ("" if upward else "_down")
                          for i, (upward, _) in enumerate(dealt)]
                assert [group for _, group in dealt] == wanted, (rank, lane, kind, dealt)
            if n == 2:  # a ring of two: all four connections, two per direction
                assert {group for _, _, group in data} == {
                    first, f"{first}1", f"{first}_down", f"{first}1_down"}


# ---- DDP's overlapped step runs on it ---------------------------------------------------------
def counting_rings(comm, step_fn) -> dict:  # noqa: ANN001
    """Train with the reference ring disabled and every RingAllReduce call counted."""
    calls, lanes, segments = [], [], set()
    original = RingAllReduce.__call__

    def counted(self, comm_, tensor, op="sum") -> None:  # noqa: ANN001
        calls.append(tensor.numel())
        lanes.append(comm_.lane)
        segments.add(self.segment_for(comm_))
        original(self, comm_, tensor, op)

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("ddp_step_overlapped used the reference all_reduce")

    saved_all_reduce, RingAllReduce.__call__ = ddp.all_reduce, counted
    try:
        ddp.all_reduce = refused
        model = model_fn()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        batch = make_batches(1, 8)[0]
        step_fn(comm, model, opt, batch)
        buckets = model.ddp_grad_buckets
        views = all(p.grad.data_ptr() == v.data_ptr() for p, v in buckets.views)
        return {"calls": calls, "lanes": lanes, "sizes": [f.numel() for f in buckets.flats],
                "views": views, "at_once": comm.collectives_at_once,
                "group_at_once": comm.group([1, 0]).collectives_at_once,
                "segments": sorted(segments), "group_backend": comm.group([1, 0]).backend}
    finally:
        RingAllReduce.__call__, ddp.all_reduce = original, saved_all_reduce


STEP = functools.partial(ddp.ddp_step_overlapped, bucket_bytes=300)


def test_ddp_overlapped_all_reduces_each_bucket_with_the_fast_ring(monkeypatch) -> None:
    # The simulator's ranks are threads of this process: patch once, here, for all of them.
    calls, threads = [], []
    original = RingAllReduce.__call__

    def counted(self, comm, tensor, op="sum") -> None:  # noqa: ANN001
        calls.append(tensor.numel())
        threads.append(threading.current_thread().name)
        assert self.segment_for(comm) == SEGMENT_BYTES and comm.backend == "sim"
        original(self, comm, tensor, op)

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("ddp_step_overlapped used the reference all_reduce")

    def one_step(comm) -> list[int]:  # noqa: ANN001
        model = model_fn()
        STEP(comm, model, torch.optim.SGD(model.parameters(), lr=0.1), make_batches(1, 8)[0])
        assert all(p.grad.data_ptr() == v.data_ptr() for p, v in model.ddp_grad_buckets.views)
        return [flat.numel() for flat in model.ddp_grad_buckets.flats]

    monkeypatch.setattr(RingAllReduce, "__call__", counted)
    monkeypatch.setattr(ddp, "all_reduce", refused)
    sizes = launch(one_step, 3).results[0]
    assert len(sizes) > 1 and sorted(calls) == sorted(sizes * 3)
    # The simulator models NCCL: one collective at a time, every bucket on the comm stream.
    assert all(name.endswith("-stream") for name in threads), threads


@pytest.mark.gloo
def test_ddp_overlapped_uses_the_fast_ring_on_gloo() -> None:
    from mpgpu_edu.comm.dist_work import MAIN, STREAM

    run = launch(counting_rings, 2, STEP, backend="gloo", timeout=120)
    for result in run.results:  # a process per rank: each counts its own calls
        assert result["views"]
        assert sorted(result["calls"]) == sorted(result["sizes"]) and len(result["sizes"]) > 1
        # gloo runs two collectives at once (torch's ProcessGroupGloo has two threads): the
        # bucket completed last (the first layer's) runs on the rank's own thread, beside
        # the stream, and every other bucket on the stream
        assert result["at_once"] == result["group_at_once"] == 2
        here = [n for n, lane in zip(result["calls"], result["lanes"]) if lane == MAIN]
        assert here == [result["sizes"][-1]], result
        assert result["lanes"].count(STREAM) == len(result["sizes"]) - 1
        # fewer, larger messages on gloo, where each costs CPU time that backward needs
        assert result["segments"] == [GLOO_SEGMENT_BYTES]
        assert result["group_backend"] == "gloo"


def test_torch_bucket_rule_closes_past_the_cap_with_a_small_first_bucket() -> None:
    params = list(model_fn().parameters())  # w1 (512 B) b1 (64) w2 (1024) b2 (64) w3 (128) b3 (8)
    buckets = ddp.make_buckets_torch(params, 600, first_bucket_bytes=100)
    assert [p for bucket in buckets for p in bucket] == params[::-1]
    assert [len(b) for b in buckets] == [2, 2, 2]  # b3+w3 136 >= 100; b2+w2 1088; b1+w1 576
    assert [len(b) for b in ddp.make_buckets_torch(params, 10_000)] == [6]


def test_training_with_gradient_views_matches_one_device() -> None:
    from mpgpu_edu.replica.reference import train_single

    batches = make_batches(3, 10)
    ref_params, ref_losses = train_single(model_fn, batches, "adam", lr=0.05)
    for result in launch(train_ddp, 3, STEP, model_fn, batches, "adam", 0.05).results:
        for name, ref in ref_params.items():
            torch.testing.assert_close(result["params"][name], ref, rtol=1e-5, atol=1e-6)
        assert result["losses"] == pytest.approx(ref_losses, rel=1e-5)


# ---- comm.neighbours: the fast ring's messages, checked once per call -----------------------
def fast_ring_traffic(comm, numel: int) -> dict:  # noqa: ANN001
    """One fast all-reduce: its result, and the messages this rank counted and drew."""
    tensor = torch.full((numel,), float(comm.rank + 1))
    RingAllReduce(segment_bytes=64)(comm, tensor)
    events = getattr(comm, "events", None)
    drawn = None if events is None else sorted(
        (e.kind, e.peer, e.nbytes) for e in events if e.stream == "comm")
    return {"sum": tensor.tolist(), "stats": comm.stats.to_dict(), "drawn": drawn}


@pytest.mark.gloo
@pytest.mark.parametrize("n", [2, 3])
def test_on_gloo_every_message_is_counted_and_drawn_as_on_the_simulator(n: int) -> None:
    """Inside ``comm.neighbours`` a message is one torch isend/irecv and nothing else, but it
    still counts: the same messages and bytes per peer as the simulator counts, each one an
    event on the rank's timeline."""
    sim = launch(fast_ring_traffic, n, 1001).results
    gloo = launch(fast_ring_traffic, n, 1001, backend="gloo", timeout=120).results
    total = float(n * (n + 1) // 2)
    for rank in range(n):
        assert gloo[rank]["sum"] == [total] * 1001
        assert gloo[rank]["stats"] == sim[rank]["stats"]
        drawn = gloo[rank]["drawn"]
        sends = [d for d in drawn if d[0] == "send"]
        assert len(sends) == sim[rank]["stats"]["messages_sent"]
        assert {d[1] for d in sends} == {(rank + 1) % n}
        assert sum(d[2] for d in sends) == sim[rank]["stats"]["bytes_sent"]


def neighbours_unwaited(comm) -> list:  # noqa: ANN001
    """Three messages to the right, three receives from the left; the last of each never
    waited by the caller: ``neighbours`` waits them on the way out."""
    n = comm.world_size
    got = [torch.zeros(4) for _ in range(3)]
    with comm.neighbours(got[0], (comm.rank + 1) % n, (comm.rank - 1) % n, tag=5) as (
            isend, irecv):
        sends = [isend(torch.full((4,), 10.0 * comm.rank + k)) for k in range(3)]
        recvs = [irecv(g) for g in got]
        for work in sends[:2] + recvs[:2]:
            work.wait()
    return [g.tolist() for g in got] + [comm.stats.to_dict()["messages_received"]]


@pytest.mark.parametrize("backend", ["sim", pytest.param("gloo", marks=pytest.mark.gloo)])
def test_neighbours_waits_what_the_caller_left_and_counts_it(backend: str) -> None:
    kwargs = {} if backend == "sim" else {"backend": "gloo", "timeout": 60}
    results = launch(neighbours_unwaited, 3, **kwargs).results
    for rank, got in enumerate(results):
        left = (rank - 1) % 3
        assert got[:3] == [[10.0 * left + k] * 4 for k in range(3)]
        assert got[3] == 3


def ring_in_groups(comm) -> list:  # noqa: ANN001
    """Ranks {0, 2} and {1, 3} each all-reduce with the fast ring in their own group."""
    group = comm.group([r for r in range(4) if r % 2 == comm.rank % 2])
    tensor = torch.full((301,), float(comm.rank))
    RingAllReduce(segment_bytes=64)(group, tensor)
    return [tensor[0].item(), sorted(comm.stats.to_dict()["sent_to"])]


@pytest.mark.parametrize("backend", ["sim", pytest.param("gloo", marks=pytest.mark.gloo)])
def test_the_fast_ring_in_a_group_talks_to_its_group_neighbours(backend: str) -> None:
    kwargs = {} if backend == "sim" else {"backend": "gloo", "timeout": 60}
    results = launch(ring_in_groups, 4, **kwargs).results
    assert [r[0] for r in results] == [2.0, 4.0, 2.0, 4.0]
    assert [r[1] for r in results] == [[2], [3], [0], [1]]  # global ranks


def neighbours_then_bad_tensors(comm) -> list:  # noqa: ANN001
    """A block on these peers and tag (its peers and tag are now known good), then blocks
    with tensors that must still be refused: the tensor is checked on every call."""
    n = comm.world_size
    right, left = (comm.rank + 1) % n, (comm.rank - 1) % n
    good = torch.zeros(4)
    with comm.neighbours(good, right, left, tag=3) as (isend, irecv):
        irecv(good)
        isend(torch.ones(4)).wait()
    refused = []
    for bad in (torch.zeros(4, 2).t(), torch.zeros(4, device="meta"), [0.0] * 4):
        try:
            comm.neighbours(bad, right, left, tag=3)
        except (ValueError, TypeError) as error:
            refused.append(str(error))
        else:
            refused.append("accepted")
    return refused


@pytest.mark.gloo
def test_neighbours_checks_the_tensor_of_every_call_after_the_first() -> None:
    results = launch(neighbours_then_bad_tensors, 2, backend="gloo", timeout=60).results
    for refused in results:
        assert "contiguous" in refused[0]
        assert "meta" in refused[1]
        assert "torch.Tensor" in refused[2]
