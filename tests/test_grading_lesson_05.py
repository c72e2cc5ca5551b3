"""Lesson 05's checks beyond the mutants: handing in the package's own implementation scores
nothing (the notebook takes its reference from the lesson module, never by the exercise's
name), and the messages of the wrong answers the checks were written against name the
problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mpgpu_edu.grading import check
from tests.mutants import failures
from tests.mutants import lesson_05 as mutants

ROOT = Path(__file__).resolve().parents[1]
FILE = "ex05_tensor_and_hybrid.py"

WRAPPERS = {
    "5.1": ("from mpgpu_edu.tensor.mappings import gather_from_parallel\n"
            "def column_parallel_linear(comm, x, weight_shard, bias_shard):\n"
            "    local = x @ weight_shard.T\n"
            "    if bias_shard is not None:\n"
            "        local = local + bias_shard\n"
            "    return gather_from_parallel(local, comm, -1)\n"),
    "5.3": ("from mpgpu_edu.hybrid import Mesh\n"
            "def hybrid_groups(world_size, pp_size):\n"
            "    mesh = Mesh(world_size // pp_size, pp_size)\n"
            "    return ([mesh.replica_ranks(d) for d in range(mesh.dp)],\n"
            "            [mesh.stage_ranks(s) for s in range(mesh.pp)])\n"),
    "5.4": ("from mpgpu_edu.tensor import megatron_mlp as _theirs\n"
            "def megatron_mlp(comm, x, w1_shard, b1_shard, w2_shard, b2):\n"
            "    return _theirs(comm, x, w1_shard, b1_shard, w2_shard, b2)\n"),
    "5.4-lesson": ("from mpgpu_edu.lessons import tensor_and_hybrid as th\n"
                   "def megatron_mlp(comm, x, w1_shard, b1_shard, w2_shard, b2):\n"
                   "    return th.reference_megatron_mlp(comm, x, w1_shard, b1_shard, w2_shard,"
                   " b2)\n"),
    "5.4-f-and-g": ("from mpgpu_edu.tensor import copy_to_parallel, reduce_from_parallel\n"
                    "from torch.nn import functional as F\n"
                    "def megatron_mlp(comm, x, w1_shard, b1_shard, w2_shard, b2):\n"
                    "    h = F.gelu(F.linear(copy_to_parallel(x, comm), w1_shard, b1_shard))\n"
                    "    out = reduce_from_parallel(F.linear(h, w2_shard), comm)\n"
                    "    return out + b2 if b2 is not None else out\n"),
}


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_a_wrapper_of_the_packages_own_scores_nothing(name: str, tmp_path: Path) -> None:
    (tmp_path / FILE).write_text(WRAPPERS[name])
    result = check(name.split("-")[0], impl=str(tmp_path), figures=False)
    assert result.points == 0, str(result)
    assert "yours to write" in str(result)


def test_the_notebook_takes_the_reference_from_the_lesson_module() -> None:
    cells = json.loads((ROOT / "notebooks" / "05_tensor_and_hybrid.ipynb").read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "import megatron_mlp" not in code
    assert code.count("reference=th.reference_megatron_mlp") == 2


@pytest.mark.parametrize("exercise_id, mutant, words", [
    ("5.1", "column_zeroes_callers_x", "no longer holds what the caller passed in"),
    ("5.1", "column_casts_to_float32", "returned float32 for float64 inputs"),
    ("5.2", "zero1_divides_callers_grad", "grad is not what it passed in"),
    ("5.3", "groups_checks_pp_size_only", "hybrid_groups(0, 1) returned"),
    ("5.3", "groups_asserts", "raised AssertionError; it must raise ValueError"),
    ("5.4", "megatron_hook_on_x", "not in a hook on x"),
])
def test_each_new_wrong_answer_is_told_what_is_wrong(exercise_id: str, mutant: str,
                                                     words: str) -> None:
    failed = failures(exercise_id, getattr(mutants, mutant))
    assert any(words in message for message in failed.values()), failed


def test_a_hook_on_x_fails_both_the_residual_and_the_second_call() -> None:
    from mpgpu_edu.grading.checks._clock import resolve
    from mpgpu_edu.grading.checks._plain import plain
    from mpgpu_edu.grading.checks.lesson_05.megatron import (_MLP_REUSED, _mlp_compute,
                                                             _mlp_reused_input_grad)

    assert {example["reuse"] for example in _MLP_REUSED} == {"residual", "twice"}
    for example in _MLP_REUSED:
        facts = resolve(plain(_mlp_compute(mutants.megatron_hook_on_x, **example)))
        with pytest.raises(AssertionError, match="hook on x"):
            _mlp_reused_input_grad(facts, **example)
