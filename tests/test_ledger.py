"""The memory ledger: totals, peaks, categories, and an OOM that reads like CUDA's."""

from __future__ import annotations

import pytest

from mpgpu_edu.cluster.ledger import (CATEGORIES, MemoryLedger, SimulatedOutOfMemoryError,
                                      format_bytes)

GIB = 2**30


def test_categories_match_the_trace_layer() -> None:
    from mpgpu_edu.cluster.trace import CATEGORIES as TRACE_CATEGORIES

    assert CATEGORIES == TRACE_CATEGORIES


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (512, "512 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
    (2**20, "1.00 MiB"), (3 * GIB, "3.00 GiB"), (int(22.1 * GIB), "22.10 GiB"),
    (2**40, "1.00 TiB"), (-2 * GIB, "-2.00 GiB"),
])
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_alloc_free_current_and_categories() -> None:
    ledger = MemoryLedger(0, 10 * GIB)
    params = ledger.alloc("parameters", 2 * GIB, "model")
    acts = ledger.alloc("activations", 3 * GIB, "layer 1")
    assert ledger.current() == 5 * GIB
    assert ledger.by_category()["activations"] == 3 * GIB
    assert set(ledger.by_category()) == set(CATEGORIES)
    assert ledger.free(acts) == 3 * GIB
    assert ledger.current() == 2 * GIB
    assert ledger.by_category()["activations"] == 0
    ledger.free(params)
    assert ledger.current() == 0
    assert ledger.free_bytes() == 10 * GIB


def test_tokens_are_distinct() -> None:
    ledger = MemoryLedger(0, 100)
    tokens = {ledger.alloc("other", 1) for _ in range(10)}
    assert len(tokens) == 10


def test_peak_and_breakdown_at_peak() -> None:
    ledger = MemoryLedger(0, 10 * GIB)
    ledger.alloc("parameters", 1 * GIB)
    acts = [ledger.alloc("activations", 1 * GIB, f"microbatch {i}") for i in range(4)]
    for token in acts:
        ledger.free(token)
    ledger.alloc("optimizer", 2 * GIB)
    assert ledger.peak() == 5 * GIB
    assert ledger.current() == 3 * GIB
    at_peak = ledger.peak_by_category()
    assert at_peak["activations"] == 4 * GIB
    assert at_peak["optimizer"] == 0
    assert sum(at_peak.values()) == ledger.peak()


def test_history_records_every_change() -> None:
    ledger = MemoryLedger(0, 10 * GIB)
    token = ledger.alloc("gradients", 100, "bucket 0")
    ledger.free(token)
    assert [tuple(entry) for entry in ledger.history] == [
        (0, "gradients", 100, "bucket 0", 100),
        (1, "gradients", -100, "bucket 0", 0),
    ]
    assert ledger.history[0].total == 100


def test_filling_exactly_to_capacity_is_fine() -> None:
    ledger = MemoryLedger(0, 100)
    ledger.alloc("other", 100)
    assert ledger.free_bytes() == 0
    ledger.alloc("other", 0)


def test_out_of_memory_message_reads_like_cuda() -> None:
    ledger = MemoryLedger(3, 24 * GIB, name="NVIDIA GeForce RTX 4090")
    ledger.alloc("parameters", 7 * GIB)
    ledger.alloc("gradients", 7 * GIB)
    ledger.alloc("optimizer", 8 * GIB)
    with pytest.raises(SimulatedOutOfMemoryError) as info:
        ledger.alloc("activations", 4 * GIB, "layer 3")
    message = str(info.value)
    assert message.startswith("CUDA out of memory (simulated). Tried to allocate 4.00 GiB")
    assert "on device 3 (NVIDIA GeForce RTX 4090, 24.00 GiB total capacity" in message
    assert "22.00 GiB already allocated" in message
    assert "parameters 7.00 GiB, gradients 7.00 GiB, optimizer 8.00 GiB" in message
    assert "2.00 GiB free" in message
    assert "'layer 3'" in message
    assert "batch size" in message and "ZeRO" in message and "pipeline" in message
    assert isinstance(info.value, RuntimeError)
    assert info.value.requested == 4 * GIB
    assert info.value.allocated == 22 * GIB
    assert info.value.breakdown["optimizer"] == 8 * GIB


def test_failed_alloc_leaves_the_ledger_unchanged() -> None:
    ledger = MemoryLedger(0, 10 * GIB)
    ledger.alloc("parameters", 6 * GIB)
    before = (ledger.current(), ledger.peak(), ledger.by_category(),
              ledger.peak_by_category(), list(ledger.history))
    with pytest.raises(SimulatedOutOfMemoryError):
        ledger.alloc("activations", 5 * GIB)
    after = (ledger.current(), ledger.peak(), ledger.by_category(),
             ledger.peak_by_category(), list(ledger.history))
    assert after == before
    ledger.alloc("activations", 4 * GIB)  # what does fit still fits
    assert ledger.current() == 10 * GIB


def test_free_twice_and_unknown_token() -> None:
    ledger = MemoryLedger(0, 100)
    token = ledger.alloc("other", 10)
    ledger.free(token)
    with pytest.raises(ValueError, match="already freed"):
        ledger.free(token)
    with pytest.raises(ValueError, match="never allocated"):
        ledger.free(12345)


def test_bad_inputs() -> None:
    ledger = MemoryLedger(0, 100)
    with pytest.raises(ValueError, match="parameters, gradients, optimizer"):
        ledger.alloc("weights", 1)
    with pytest.raises(ValueError, match="non-negative"):
        ledger.alloc("other", -1)
    with pytest.raises(ValueError, match="non-negative"):
        ledger.alloc("other", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capacity"):
        MemoryLedger(0, -1)
    assert ledger.history == []
