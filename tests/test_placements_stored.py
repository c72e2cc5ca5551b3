"""Lesson 10's stored placement study (``mpgpu_edu.lessons._placements_stored``) against a
fresh simulation of every placement: the notebook reads the stored numbers, so they must be
what ``simulate step`` gives today. About 10-15 s for each of three placements on 2 cores."""

from __future__ import annotations

import pytest

from mpgpu_edu.lessons import planning as pl


@pytest.mark.slow
@pytest.mark.parametrize("placement", pl.PLACEMENTS, ids=lambda p: p.name.replace("\n", " "))
def test_stored_placements_equal_a_fresh_simulation(placement: pl.Placement) -> None:
    from mpgpu_edu.lessons._placements_stored import ROWS

    key = pl.placement_key("llama-7b", "2x8xH100-ib", 2048, placement)
    assert key in ROWS, f"no stored numbers for {key}: regenerate _placements_stored.py"
    fresh = pl.simulate_placement.__wrapped__("llama-7b", "2x8xH100-ib", 2048, placement)
    assert set(ROWS[key]) == set(fresh)
    for name, value in fresh.items():
        assert ROWS[key][name] == pytest.approx(value, rel=1e-9), name
    stored = pl.placement_rows(placements=(placement,))[0]
    assert stored["step_s"] == ROWS[key]["step_s"] and stored["why"] == placement.why


def test_every_stored_entry_is_a_placement_of_the_notebook() -> None:
    from mpgpu_edu.lessons._placements_stored import ROWS

    keys = {pl.placement_key("llama-7b", "2x8xH100-ib", 2048, p) for p in pl.PLACEMENTS}
    assert set(ROWS) == keys
