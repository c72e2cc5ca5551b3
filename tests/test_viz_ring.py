"""Ring all-reduce step by step: the schedule and state as data, then the figure's content."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from mpgpu_edu.viz import palette  # noqa: E402
from mpgpu_edu.viz.ring import (  # noqa: E402
    plot_ring_step, ring_frames, ring_state, ring_steps, save_ring_frames,
)

WORLD_SIZES = range(1, 8)


# ---- the schedule ----------------------------------------------------------------------------
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_steps_follow_the_standard_algorithm(n: int) -> None:
    steps = ring_steps(n)
    assert len(steps) == 2 * (n - 1)
    for s in steps:
        k = s.step if s.phase == "reduce-scatter" else s.step - (n - 1)
        assert s.phase == ("reduce-scatter" if s.step < n - 1 else "all-gather")
        for r in range(n):
            if s.phase == "reduce-scatter":
                assert (s.sends[r], s.recvs[r]) == ((r - k) % n, (r - k - 1) % n)
            else:
                assert (s.sends[r], s.recvs[r]) == ((r + 1 - k) % n, (r - k) % n)
            assert s.recvs[r] == s.sends[(r - 1) % n]  # what the left neighbour sent
        assert sorted(s.sends) == list(range(n))  # every chunk is on the move once per step
    assert {s.op for s in steps} <= {"add", "copy"}


def test_no_ranks_no_ring() -> None:
    with pytest.raises(ValueError):
        ring_steps(0)


# ---- the state -------------------------------------------------------------------------------
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_state_invariants(n: int) -> None:
    everyone = set(range(n))
    assert ring_state(n, 0) == [[{r}] * n for r in range(n)]
    scattered = ring_state(n, n - 1)
    for r in range(n):
        full = [c for c in range(n) if scattered[r][c] == everyone]
        assert full == [(r + 1) % n]  # reduce-scatter leaves rank r the sum of chunk r+1
    done = ring_state(n, 2 * (n - 1))
    assert all(chunk == everyone for rank in done for chunk in rank)
    with pytest.raises(ValueError):
        ring_state(n, 2 * (n - 1) + 1)


@given(n=st.integers(1, 9), data=st.data())
def test_contributions_only_grow(n: int, data: st.DataObject) -> None:
    step = data.draw(st.integers(0, 2 * (n - 1) - 1)) if n > 1 else 0
    before, after = ring_state(n, step), ring_state(n, step + 1 if n > 1 else 0)
    for r in range(n):
        for c in range(n):
            assert before[r][c] <= after[r][c]
            assert r in after[r][c] or after[r][c] == set(range(n))


# ---- the figure ------------------------------------------------------------------------------
def gids(ax, prefix: str) -> list:
    return [a for a in (*ax.patches, *ax.texts) if (a.get_gid() or "").startswith(prefix)]


def test_step_figure_shows_arrows_chunks_and_title() -> None:
    n, step = 4, 2
    ax = plot_ring_step(n, step).axes[0]
    title = ax.get_title(loc="left")
    assert title.startswith("step 3 of 6 — reduce-scatter: each rank sends one chunk (S/N bytes)")
    assert "right neighbour" in title
    assert len(gids(ax, "ring-arrow")) == n
    sends = ring_steps(n)[step].sends
    assert [t.get_text() for t in gids(ax, "arrow-label")] == [f"chunk {c}" for c in sends]
    state = ring_state(n, step)
    complete = sum(len(chunk) == n for rank in state for chunk in rank)
    assert len(gids(ax, "complete")) == complete
    assert len(gids(ax, "partial")) == n * n - complete
    sent_cell, = gids(ax, f"cell:0:{sends[0]}")
    assert sent_cell.get_edgecolor() == to_rgba(palette.KIND_COLORS["send"])


def test_all_gather_and_final_frames() -> None:
    ax = plot_ring_step(3, 3, nbytes=3 * 2**20).axes[0]
    assert ax.get_title(loc="left").startswith(
        "step 4 of 4 — all-gather: each rank sends one chunk (S/N = 1 MiB)")
    final = plot_ring_step(3, 4).axes[0]
    assert final.get_title(loc="left").startswith("done after 4 steps")
    assert gids(final, "ring-arrow") == [] and gids(final, "partial") == []
    assert len(gids(final, "complete")) == 9


def test_frames(tmp_path) -> None:
    assert len(ring_frames(3)) == 5
    lone = plot_ring_step(1, 0).axes[0]
    assert gids(lone, "ring-arrow") == [] and len(gids(lone, "complete")) == 1
    paths = save_ring_frames(2, tmp_path)
    assert [p.name for p in paths] == ["ring_N2_step00.png", "ring_N2_step01.png",
                                       "ring_N2_step02.png"]
    assert all(p.stat().st_size > 0 for p in paths)
