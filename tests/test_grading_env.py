"""CI runs every notebook twice: with the stubs, and with the solutions in strict mode. The
environment selects the mode without touching the notebooks."""

import pytest

import mpgpu_edu as mp
from mpgpu_edu.grading import ExerciseFailed


def test_env_selects_the_solutions(monkeypatch):
    monkeypatch.setenv("MPGPU_EDU_IMPL", "solutions")
    monkeypatch.setenv("MPGPU_EDU_STRICT", "1")
    assert mp.check("0.2").status == "passed"


def test_env_strict_raises_on_a_stub(monkeypatch):
    monkeypatch.delenv("MPGPU_EDU_IMPL", raising=False)
    monkeypatch.setenv("MPGPU_EDU_STRICT", "1")
    with pytest.raises(ExerciseFailed, match="not implemented"):
        mp.check("0.2", impl="exercises")


def test_without_env_a_stub_never_raises(monkeypatch):
    monkeypatch.delenv("MPGPU_EDU_IMPL", raising=False)
    monkeypatch.delenv("MPGPU_EDU_STRICT", raising=False)
    assert mp.check("0.2", impl="exercises").status == "not_implemented"
