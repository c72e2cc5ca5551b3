"""Plausible wrong answers for lesson 10 (see tests/mutants/__init__.py)."""

from __future__ import annotations

from mpgpu_edu.pipeline import Step, interleaved_1f1b, steps_of


# ---- 10.1 ---------------------------------------------------------------------------------

def bubble_unchecked(n_stages: int, n_microbatches: int, n_chunks: int) -> float:
    """Checks that M is a multiple of P but not that V and P are at least 1: V=0 divides by
    zero."""
    if n_microbatches % max(n_stages, 1):
        raise ValueError("bad sizes")
    return (n_stages - 1) / (n_chunks * n_microbatches)


def bubble_always_refuses(n_stages: int, n_microbatches: int, n_chunks: int) -> float:
    """A stub that refuses every size: no overhead computed at all."""
    raise ValueError("no")


def bubble_idle_fraction(n_stages: int, n_microbatches: int, n_chunks: int) -> float:
    """The idle share of the makespan, (P-1)/(V M + P - 1), not the share of compute time."""
    if n_microbatches % n_stages or min(n_stages, n_microbatches, n_chunks) < 1:
        raise ValueError("bad sizes")
    return (n_stages - 1) / (n_chunks * n_microbatches + n_stages - 1)


def bubble_ignores_chunks(n_stages: int, n_microbatches: int, n_chunks: int) -> float:
    """1F1B's (P-1)/M: forgets that chunk steps are V times shorter."""
    if n_microbatches % n_stages or min(n_stages, n_microbatches, n_chunks) < 1:
        raise ValueError("bad sizes")
    return (n_stages - 1) / n_microbatches


def bubble_never_refuses(n_stages: int, n_microbatches: int, n_chunks: int) -> float:
    """The right formula, but sizes the schedule cannot run (M not a multiple of P) pass."""
    return (n_stages - 1) / max(1, n_chunks * n_microbatches)


# ---- 10.2 ---------------------------------------------------------------------------------

def _orders(p_: int, m: int, v: int, warmup, forward_order, backward_reversed: bool = True,
            refuse: bool = True, capped: bool = True) -> list[list[Step]]:
    """The solution's orders, with one switch per mistake."""
    if refuse and (min(p_, m, v) < 1 or m % p_):
        raise ValueError("bad sizes")
    total = m * v
    orders = []
    for p in range(p_):
        forwards = [Step(p, mb, "F", c) for mb, c in forward_order(p_, m, v)]
        backwards = [Step(p, mb, "B", (v - 1 - c) if backward_reversed else c)
                     for mb, c in forward_order(p_, m, v)]
        w = min(warmup(p, p_, v), total) if capped else warmup(p, p_, v)
        steady = [s for pair in zip(forwards[w:], backwards) for s in pair]
        orders.append(forwards[:w] + steady + backwards[total - w:])
    return orders


def _rounds(p_: int, m: int, v: int) -> list[tuple[int, int]]:
    """Rounds of P microbatches, chunk by chunk: the right order of the work."""
    return [(r * p_ + i, c) for r in range(m // p_) for c in range(v) for i in range(p_)]


def _megatron(p: int, p_: int, v: int) -> int:
    return p_ - 1 - p if v == 1 else 2 * (p_ - 1 - p) + (v - 1) * p_


def orders_plain_warmup(n_stages: int, n_microbatches: int, n_chunks: int) -> list[list[Step]]:
    """1F1B's warm-up, P-1-p, whatever V: the backwards come too early and wait."""
    return _orders(n_stages, n_microbatches, n_chunks, lambda p, p_, v: p_ - 1 - p, _rounds)


def orders_microbatch_major(n_stages: int, n_microbatches: int,
                            n_chunks: int) -> list[list[Step]]:
    """Each microbatch through all of a device's chunks before the next one (F0.0 F0.1 F1.0
    ...): device 0 waits for microbatch 0 to come round before it can start anything else."""
    def order(p_: int, m: int, v: int) -> list[tuple[int, int]]:
        return [(mb, c) for mb in range(m) for c in range(v)]
    return _orders(n_stages, n_microbatches, n_chunks, _megatron, order)


def orders_chunks_not_reversed(n_stages: int, n_microbatches: int,
                               n_chunks: int) -> list[list[Step]]:
    """Backwards through chunk 0 first, as in forward: chunk 0's backward needs chunk 1's."""
    return _orders(n_stages, n_microbatches, n_chunks, _megatron, _rounds,
                   backward_reversed=False)


def orders_all_forwards_first(n_stages: int, n_microbatches: int,
                              n_chunks: int) -> list[list[Step]]:
    """GPipe's order over the chunks: every forward, then every backward. As fast, but every
    device holds all M x V microbatch-chunks at once."""
    return _orders(n_stages, n_microbatches, n_chunks, lambda p, p_, v: 10**9, _rounds)


def orders_uncapped_warmup(n_stages: int, n_microbatches: int,
                           n_chunks: int) -> list[list[Step]]:
    """The warm-up formula without its cap at M x V: when it is longer than the work, the
    drain's slice starts below zero and drops backwards."""
    return _orders(n_stages, n_microbatches, n_chunks, _megatron, _rounds, capped=False)


def orders_never_refuses(n_stages: int, n_microbatches: int, n_chunks: int) -> list[list[Step]]:
    """The right orders, but M that is not a multiple of P (a last, partial round) passes."""
    def order(p_: int, m: int, v: int) -> list[tuple[int, int]]:
        full = -(-m // p_) if p_ else 0
        return [(r * p_ + i, c) for r in range(full) for c in range(v) for i in range(p_)
                if r * p_ + i < m]
    return _orders(n_stages, n_microbatches, n_chunks, _megatron, order, refuse=False)


def orders_warmup_without_two(n_stages: int, n_microbatches: int,
                              n_chunks: int) -> list[list[Step]]:
    """Warm-up (P-1-p) + (V-1)P, without rule 2's factor 2: with free sends the same bubble
    and less memory, but each device's backwards come before the microbatch is back."""
    return _orders(n_stages, n_microbatches, n_chunks,
                   lambda p, p_, v: p_ - 1 - p + (v - 1) * p_, _rounds)


def orders_always_refuse(n_stages: int, n_microbatches: int, n_chunks: int) -> list[list[Step]]:
    """A stub that refuses every size: no schedule at all."""
    raise ValueError("no")


def orders_from_the_package(n_stages: int, n_microbatches: int,
                            n_chunks: int) -> list[list[Step]]:
    """The package's own schedule: not the learner's to call here."""
    schedule = interleaved_1f1b(n_stages, n_microbatches, n_chunks)
    return [steps_of(schedule, d) for d in range(n_stages)]


MUTANTS: dict[str, list[str]] = {
    "10.1": ["bubble_idle_fraction", "bubble_ignores_chunks", "bubble_never_refuses",
             "bubble_unchecked", "bubble_always_refuses"],
    "10.2": ["orders_plain_warmup", "orders_microbatch_major", "orders_chunks_not_reversed",
             "orders_all_forwards_first", "orders_uncapped_warmup", "orders_never_refuses",
             "orders_warmup_without_two", "orders_always_refuse"],
}
