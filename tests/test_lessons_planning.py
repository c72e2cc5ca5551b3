"""Lesson 10's programs and figures: the master copy keeps small updates, placements on a
2-node mesh put tensor parallelism inside a node, and the interleaved view matches
(P-1)/(V M)."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from mpgpu_edu.explore.live import Explorer
from mpgpu_edu.lessons import planning as pl


def test_a_bf16_weight_loses_small_updates_and_the_master_copy_keeps_them() -> None:
    curves = pl.master_copy_demo(steps=100, update=1e-3)
    assert curves["bf16 only"][-1] == 1.0
    assert curves["fp32"][-1] == pytest.approx(1.1, abs=1e-5)
    assert abs(curves["fp32 master, bf16 copy"][-1] - 1.1) < 0.01
    assert isinstance(pl.plot_master_copy(curves), Figure)


@pytest.mark.parametrize("stages, rounds, chunks", [(4, 2, 2), (3, 1, 3), (2, 4, 1)])
def test_interleaved_view_matches_the_closed_form(stages: int, rounds: int,
                                                  chunks: int) -> None:
    figure, info = pl.interleaved_view(stages, rounds, chunks)
    m = stages * rounds
    assert info["overhead_interleaved"] == pytest.approx((stages - 1) / (chunks * m))
    assert info["overhead_1f1b"] == pytest.approx((stages - 1) / m)
    assert info["idle_1f1b"] == pytest.approx((stages - 1) / (m + stages - 1))
    plain = next(iter(pl.schedule_traces(stages, m, chunks).values()))
    assert info["idle_1f1b"] == pytest.approx(plain.idle_fraction(0))  # the row's "idle"
    assert isinstance(figure, Figure)
    assert "(P-1)/(V M)" in pl.describe_interleaved(info)


def test_interleaved_explorer_redraws() -> None:
    explorer = pl.interleaved_explorer()
    assert isinstance(explorer, Explorer) and explorer.renders == 1
    explorer.controls["chunks"].value = 3
    assert explorer.renders == 2 and explorer.info["chunks"] == 3


def test_placements_put_tensor_parallelism_inside_a_node() -> None:
    rows = pl.placement_rows("gpt2-small", seq=256, placements=pl.PLACEMENTS[:2])
    inside, spread = rows
    assert inside["step_s"] < spread["step_s"]
    assert inside["across_bytes"] < spread["across_bytes"] / 4
    assert inside["tokens_per_step"] == spread["tokens_per_step"] == 16 * 256
    fig = pl.plot_placements(rows)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("NVLink" in t for t in texts) and any("across the network" in t for t in texts)


def test_the_placements_figure_says_whose_bytes_it_shows() -> None:
    rows = pl.placement_rows()
    fig = pl.plot_placements(rows)
    assert all("(busiest GPU)" in t.get_text() for t in fig.axes[0].texts[::2])
    assert fig.axes[0].get_xlim()[1] < max(r["step_s"] for r in rows) * 1.2


def test_placement_rows_simulate_what_is_not_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    import mpgpu_edu.lessons._placements_stored as stored

    monkeypatch.setattr(stored, "ROWS", {})
    calls = []
    monkeypatch.setattr(pl, "simulate_placement", lambda *a: calls.append(a) or {"step_s": 1.0})
    assert pl.placement_rows(placements=pl.PLACEMENTS[:1])[0]["step_s"] == 1.0
    assert calls == [("llama-7b", "2x8xH100-ib", 2048, pl.PLACEMENTS[0])]
