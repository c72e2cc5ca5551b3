"""Exercise 8.1, a rank's shard of a flat vector: both halves. The reference is
``mpgpu_edu.dp.fsdp.flat_shard``. Scored: each shard's values, size and dtype. Seen only
inside the learner's process, and so feedback worth no points: whether the vector was left
as it was, and whether each shard owns its memory (no view of the vector or of a padded
copy)."""

from __future__ import annotations

import torch

from mpgpu_edu.grading.checks import CheckFailure
from mpgpu_edu.grading.checks._support import (compute_examples, examples, expect, expect_close,
                                               judge_examples)
from mpgpu_edu.grading.checks.lesson_08.setup import Impl


def _reference_shard(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    from mpgpu_edu.dp.fsdp import flat_shard

    return flat_shard([flat], rank, world_size)


DTYPES = {str(d): d for d in (torch.float32, torch.float64, torch.int64, torch.bfloat16)}


def _shards(cases: list[tuple[int, int]], dtype: torch.dtype = torch.float32,
            dtypes: list[torch.dtype] | None = None) -> Impl:
    """*compute*: every rank's shard of ``arange(1, E + 1)`` for each (E, N) of ``cases``,
    in ``dtype`` (or case by case in ``dtypes``). Before each call the allocator is handed
    back a block of the padded size filled with 7s, so that padding left uninitialised
    (``torch.empty``) is likely to show."""
    def compute(impl: Impl) -> list[dict]:
        out = []
        for k, (numel, n) in enumerate(cases):
            kind = dtypes[k] if dtypes else dtype
            flat = torch.arange(1, numel + 1).to(kind)
            before = flat.clone()
            got = []
            for r in range(n):
                junk = torch.full((-(-numel // n) * n,), 7, dtype=kind)
                del junk
                got.append(impl(flat, r, n))
            out.append({"numel": numel, "n": n, "shards": got, "dtype": str(kind),
                        "views": [g.untyped_storage().data_ptr()
                                  == flat.untyped_storage().data_ptr() for g in got],
                        "storage": [g.untyped_storage().nbytes() for g in got],
                        "untouched": bool(torch.equal(flat, before))})
        return out
    return compute


def _judge_one_shards(out: dict, numel: int, n: int) -> None:
    kind = DTYPES.get(out["dtype"])
    expect(kind is not None, f"E={numel}, N={n}: not one of the check's dtypes")
    flat = torch.arange(1, numel + 1).to(kind)
    for rank, got in enumerate(out["shards"]):
        want = _reference_shard(flat, rank, n)
        expect(isinstance(got, torch.Tensor) and got.dim() == 1,
               f"E={numel}, N={n}, rank {rank}: expected a 1-D tensor")
        expect(got.numel() == want.numel(),
               f"E={numel}, N={n}, rank {rank}: a shard of {got.numel()} elements; every "
               f"shard has ceil(E/N) = {want.numel()} (all-gather needs equal pieces)")
        expect(got.dtype == flat.dtype, f"E={numel}, N={n}: the shard's dtype is "
                                        f"{got.dtype}, the vector's {flat.dtype} (a zero "
                                        "tensor made without dtype= is float32)")
        expect_close(got, want, f"E={numel}, N={n}, rank {rank}'s shard")


def _judge_shards(records: list[dict]) -> None:
    for out in records:
        _judge_one_shards(out, out["numel"], out["n"])


def _judge_own_memory(records: list[dict]) -> None:
    """Feedback: the right shards first, then the vector left as it was, and each shard
    owning its memory: no view of the vector, nor of a padded copy (whose whole storage a
    view keeps alive)."""
    _judge_shards(records)
    for out in records:
        numel, n = out["numel"], out["n"]
        expect(out["untouched"], f"E={numel}, N={n}: shard_of changed its input")
        for rank, (got, view, storage) in enumerate(zip(out["shards"], out["views"],
                                                        out["storage"])):
            own = got.numel() * got.element_size()
            expect(not view or own == 0,
                   f"E={numel}, N={n}, rank {rank}: the shard is a view of the vector, so the "
                   "whole vector stays in memory")
            expect(storage == own,
                   f"E={numel}, N={n}, rank {rank}: the shard's storage holds {storage} bytes "
                   f"for its {own}: it is a view of a larger tensor (the padded copy?), which "
                   "stays in memory as long as the shard does")


SHARD_EXAMPLES = examples(10, seed=81, numel=(1, 400), n=(2, 9))


def _shards_hidden(impl: Impl) -> list[dict]:
    return compute_examples(lambda numel, n: _shards([(numel, n)], torch.float64)(impl)[0],
                            SHARD_EXAMPLES)


def _judge_shards_hidden(records: list[dict]) -> None:
    def one(out: dict, numel: int, n: int) -> None:
        try:
            _judge_one_shards(out, numel, n)
        except CheckFailure as exc:
            raise AssertionError(str(exc)) from None
    judge_examples(records, one)
