"""Checks of lesson 03: gradient averaging, buckets, overlap with backward, Adam's memory.

References: single-device training (averaging), ``mpgpu_edu.dp.make_buckets`` (buckets),
``mpgpu_edu.memory.bytes_per_param`` and ``estimate_memory`` (memory).

The oracle for averaging is single-device training: the mean of the ranks' gradients on
equal slices of a batch is the gradient of the whole batch. Overlap is read off the
simulator's timeline: communication must run while backward is still computing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.dp import make_buckets
from mpgpu_edu.grading.checks import Case, CheckFailure, Evidence
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, property_check,
                                               run_spmd, showing, uniform)
from mpgpu_edu.memory import bytes_per_param, estimate_memory

Impl = Callable[..., Any]


def _model(widths: tuple[int, ...], seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _batch(n_samples: int, widths: tuple[int, ...], seed: int = 1) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n_samples, widths[0], generator=generator),
            torch.randn(n_samples, widths[-1], generator=generator))


def _local_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def _averaging_program(impl: Impl, widths: tuple[int, ...], x: torch.Tensor, y: torch.Tensor,
                       overlap: bool = False) -> Callable[..., Any]:
    base = _model(widths)  # built here: rank threads must not share the global RNG

    def program(comm: Any) -> list[torch.Tensor]:
        model = copy.deepcopy(base)
        xs, ys = (torch.tensor_split(t, comm.world_size)[comm.rank] for t in (x, y))
        loss = nn.functional.mse_loss(model(xs), ys)
        if overlap:
            with comm.compute("backward", "backward"):
                impl(comm, model, loss)
        else:
            loss.backward()
            impl(comm, model)
        return [p.grad.clone() for p in model.parameters()]
    return program


def _check_mean(impl: Impl, n: int, widths: tuple[int, ...], n_samples: int,
                overlap: bool = False, cluster: Cluster | None = None) -> Any:
    x, y = _batch(n_samples, widths)
    model = _model(widths)
    per_rank = [_local_grads(model, torch.tensor_split(x, n)[r], torch.tensor_split(y, n)[r])
                for r in range(n)]
    want = [torch.stack(grads).mean(0) for grads in zip(*per_rank)]
    result = run_spmd(_averaging_program(impl, widths, x, y, overlap), cluster or uniform(n))
    names = [name for name, _ in model.named_parameters()]
    for rank, grads in enumerate(result.results):
        for name, got, expected in zip(names, grads, want):
            expect_close(got, expected, f"N={n}: rank {rank}'s gradient of {name}")
    return result


WIDTHS = (6, 5, 3)


def _mean(impl: Impl) -> None:
    _check_mean(impl, 3, WIDTHS, 12)


def _single_device(impl: Impl) -> None:
    x, y = _batch(12, WIDTHS)
    model = _model(WIDTHS)
    full = _local_grads(model, x, y)
    result = run_spmd(_averaging_program(impl, WIDTHS, x, y), uniform(4))
    for rank, grads in enumerate(result.results):
        for (name, _), got, want in zip(model.named_parameters(), grads, full):
            expect_close(got, want, f"rank {rank}'s gradient of {name} against one device "
                                    "training on the whole batch")


def _averaging_traffic(impl: Impl) -> None:
    n = 4
    result = _check_mean(impl, n, WIDTHS, 12)
    sizes = [p.numel() for p in _model(WIDTHS).parameters()]
    most = sum(2 * (n - 1) * bytes_of(-(-numel // n)) for numel in sizes)
    busiest = max(result.bytes_sent_per_rank)
    expect(busiest <= most, f"the busiest rank sent {busiest} bytes; a ring all-reduce of "
                            f"every gradient sends at most {most} per rank (is one rank doing "
                            "all the work, as in a naive all-reduce?)")


def _averaging_property(impl: Impl) -> None:
    from hypothesis import strategies as st

    def body(world_size: int, hidden: int) -> None:
        _check_mean(impl, world_size, (4, hidden, 2), 2 * world_size)

    property_check(body, max_examples=10, world_size=st.integers(1, 5),
                   hidden=st.integers(1, 6))


# ---- 3.2 buckets ------------------------------------------------------------------------------

def _reference_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """The package's ``make_buckets``, on byte-sized meta tensors, as parameter indices."""
    params = [torch.empty(size, dtype=torch.uint8, device="meta") for size in sizes]
    index = {id(p): i for i, p in enumerate(params)}
    return [[index[id(p)] for p in bucket] for bucket in make_buckets(params, bucket_bytes)]


def _buckets_agree(impl: Impl, sizes: list[int], bucket_bytes: int) -> None:
    given = list(sizes)
    got = impl(given, bucket_bytes)
    expect(given == sizes, f"make_buckets changed its input: {sizes} became {given}")
    want = _reference_buckets(sizes, bucket_bytes)
    if got != want:
        flat = [i for bucket in got for i in bucket] if isinstance(got, list) else None
        why = ("every parameter must be in exactly one bucket"
               if flat is None or sorted(flat) != list(range(len(sizes)))
               else "walk from the last parameter to the first, filling each bucket up to "
                    f"{bucket_bytes} bytes")
        raise CheckFailure(f"make_buckets({sizes}, {bucket_bytes}) returned {got}, expected "
                           f"{want}: {why}")


def _bucket_cases(examples: list[tuple[list[int], int]]) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        for sizes, bucket_bytes in examples:
            _buckets_agree(impl, sizes, bucket_bytes)
    return run


def _buckets_property(impl: Impl) -> None:
    from hypothesis import strategies as st

    property_check(lambda sizes, bucket_bytes: _buckets_agree(impl, sizes, bucket_bytes),
                   max_examples=50, sizes=st.lists(st.integers(1, 64), max_size=12),
                   bucket_bytes=st.integers(1, 100))


# ---- 3.3 overlap ------------------------------------------------------------------------------

OVERLAP_WIDTHS = (256, 256, 256, 256, 256)
OVERLAP_SAMPLES = 64


def _overlap_cluster(n: int) -> Cluster:
    # A slow device on a fast network: backward and the all-reduces take similar time.
    return Cluster.uniform(n, alpha_s=1e-6, beta_Bps=5e10, gpu="CPU-16GB")


def _overlap_values(impl: Impl) -> None:
    _check_mean(impl, 3, OVERLAP_WIDTHS[:3], 12, overlap=True, cluster=_overlap_cluster(3))


def _after_backward(comm: Any, model: nn.Module, loss: torch.Tensor) -> None:
    loss.backward()
    for param in model.parameters():
        all_reduce(comm, param.grad, op="mean")


def _intervals_overlap(trace: Any, device: int) -> float:
    """Seconds during which ``device`` computed backward and communicated at once."""
    compute = [(e.start, e.end) for e in trace.on(device, "compute") if e.kind == "backward"]
    comm = [(e.start, e.end) for e in trace.on(device, "comm")]
    return sum(max(0.0, min(a1, b1) - max(a0, b0)) for a0, a1 in compute for b0, b1 in comm)


def _overlap_timeline(impl: Impl) -> Evidence:
    n = 2
    x, y = _batch(OVERLAP_SAMPLES, OVERLAP_WIDTHS)
    cluster = _overlap_cluster(n)
    yours = run_spmd(_averaging_program(impl, OVERLAP_WIDTHS, x, y, True), cluster)
    plain = run_spmd(_averaging_program(_after_backward, OVERLAP_WIDTHS, x, y, True), cluster)
    traces = {"yours": yours.trace, "no overlap (all-reduce after backward)": plain.trace}
    with showing(Evidence(traces=traces)) as evidence:
        compute = yours.trace.on(0, "compute")
        backward_end = max(e.end for e in compute if e.kind == "backward")
        first_comm = min((e.start for e in yours.trace.on(0, "comm")), default=float("inf"))
        expect(first_comm < backward_end,
               f"communication starts at {first_comm * 1e6:.1f} us, after backward ends at "
               f"{backward_end * 1e6:.1f} us: start each all-reduce from the gradient's hook")
        expect(_intervals_overlap(yours.trace, 0) > 0,
               "communication and backward never run at the same time: the hook must start "
               "the all-reduce on the comm stream (comm.run_async) instead of waiting for it")
        expect(yours.trace.makespan < plain.trace.makespan,
               f"the step takes {yours.trace.makespan * 1e6:.1f} us, no faster than "
               f"all-reducing after backward ({plain.trace.makespan * 1e6:.1f} us)")
    return evidence


def _hooks_removed(impl: Impl) -> None:
    x, y = _batch(8, WIDTHS)
    base = _model(WIDTHS)

    def program(comm: Any) -> tuple[int, int]:
        model = copy.deepcopy(base)
        impl(comm, model, nn.functional.mse_loss(model(x), y))
        before = comm.stats.messages_sent
        nn.functional.mse_loss(model(x), y).backward()
        comm.run_async(lambda: None).wait()  # the comm stream is FIFO: earlier jobs are done
        return before, comm.stats.messages_sent

    result = run_spmd(program, uniform(2))
    for rank, (before, after) in enumerate(result.results):
        expect(after == before, f"rank {rank} sent {after - before} messages during a later "
                                "backward: remove the hooks (handle.remove()) before returning")


# ---- 3.4 Adam's memory -----------------------------------------------------------------------

def _expected_memory(model: nn.Module, precision: str) -> dict[str, int]:
    per = bytes_per_param("adam", precision)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"parameters": per["parameters"] * total, "gradients": per["gradients"] * trainable,
            "optimizer": per["optimizer"] * trainable}


def _memory_agrees(impl: Impl, model: nn.Module, precision: str, what: str) -> None:
    got = impl(model, precision)
    want = _expected_memory(model, precision)
    expect(isinstance(got, dict), f"adam_memory should return a dict, got {type(got).__name__}")
    expect({k: got.get(k) for k in want} == want,
           f"{what}, {precision}: got {got}, expected {want}")


def _memory_fp32(impl: Impl) -> None:
    model = _model((10, 5, 2))
    _memory_agrees(impl, model, "fp32", "a 2-layer MLP")
    n = sum(p.numel() for p in model.parameters())
    total = sum(impl(model, "fp32").get(k, 0) for k in ("parameters", "gradients", "optimizer"))
    expect(total == 16 * n, f"fp32 Adam holds 16 bytes per parameter: {16 * n}, got {total}")


def _memory_mixed(impl: Impl) -> None:
    _memory_agrees(impl, _model((10, 5, 2)), "mixed", "a 2-layer MLP")


def _memory_frozen(impl: Impl) -> None:
    model = _model((8, 4, 4, 2))
    model[0].requires_grad_(False)
    for precision in ("fp32", "mixed"):
        _memory_agrees(impl, model, precision, "an MLP whose first layer is frozen")


def _memory_meta(impl: Impl) -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Embedding(50257, 768), nn.Linear(768, 3072))
    _memory_agrees(impl, model, "mixed", "a model on the meta device")
    n = sum(p.numel() for p in model.parameters())
    want = estimate_memory(n, "adam", "mixed", "single", 1).per_device
    got = impl(model, "mixed")
    expect(all(got.get(k) == want[k] for k in ("parameters", "gradients", "optimizer")),
           f"estimate_memory says {want}, you say {got}")


def _memory_bad_precision(impl: Impl) -> None:
    try:
        got = impl(_model((2, 2)), "fp8")
    except ValueError:
        return
    raise CheckFailure(f"adam_memory(model, 'fp8') returned {got}; raise ValueError for a "
                       "precision other than 'fp32' or 'mixed'")


CASES: dict[str, list[Case]] = {
    "3.1": [
        Case("every replica holds the mean gradient", 1, _mean),
        Case("same gradients as one device on the whole batch", 2, _single_device),
        Case("traffic: no rank sends more than a ring all-reduce", 1, _averaging_traffic),
        Case("hidden: random world sizes and widths", 1, _averaging_property, hidden=True),
    ],
    "3.2": [
        Case("the docstring's example", 1, _bucket_cases([([4, 4, 4, 8], 8)])),
        Case("reverse order, full buckets", 1,
             _bucket_cases([([1, 2, 3, 4, 5, 6], 7), ([5, 5, 5, 5], 10), ([], 4)])),
        Case("a parameter larger than a bucket gets its own", 1,
             _bucket_cases([([2, 40, 2, 2], 8), ([9], 8)])),
        Case("hidden: random sizes", 2, _buckets_property, hidden=True),
    ],
    "3.3": [
        Case("gradients are averaged", 2, _overlap_values),
        Case("timeline: communication overlaps backward", 4, _overlap_timeline,
             timeout_s=40.0),
        Case("hooks are removed afterwards", 2, _hooks_removed),
    ],
    "3.4": [
        Case("fp32: 16 bytes per parameter", 1, _memory_fp32),
        Case("mixed precision: 2 + 2 + 12 bytes", 1, _memory_mixed),
        Case("frozen parameters: weights only", 1, _memory_frozen),
        Case("meta device and bad precision", 1,
             lambda impl: (_memory_meta(impl), _memory_bad_precision(impl))[0]),
    ],
}
