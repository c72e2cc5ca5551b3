"""A submission that hands in the package's own implementation of the function it is asked to
write scores nothing: while its code computes, every reference a lesson names in
``REFERENCES`` raises, wherever it was imported (the learner's module included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpgpu_edu.grading import check
from mpgpu_edu.grading.checks import lesson_module
from mpgpu_edu.grading.registry import EXERCISES, get

CHEATS = {
    "1.1": ("ex01_communication.py", "def p2p_time(cluster, src, dst, nbytes):\n"
            "    return cluster.route(src, dst).seconds(nbytes)\n"),
    "1.6": ("ex01_communication.py", "from mpgpu_edu.lessons import communication as cm\n"
            "def tree_all_reduce(comm, tensor):\n"
            "    cm.binary_tree_all_reduce(comm, tensor)\n"),
    "2.2": ("ex02_parameter_server.py",
            "from mpgpu_edu.lessons.parameter_server import reference_server_loop\n"
            "def ps_server_step(comm, params, lr):\n"
            "    reference_server_loop(comm, params, 1, lr)\n"),
    "3.1": ("ex03_data_parallel.py", "from mpgpu_edu.hybrid.train import all_reduce_gradients\n"
            "def average_gradients(comm, model):\n"
            "    all_reduce_gradients(comm, model)\n"
            "    for p in model.parameters():\n"
            "        p.grad /= comm.world_size\n"),
    "3.5": ("ex03_data_parallel.py", "from mpgpu_edu.dp.wrapper import wrap_ddp as _theirs\n"
            "def wrap_ddp(comm, module, bucket_cap_bytes):\n"
            "    return _theirs(comm, module, bucket_cap_bytes)\n"),
    "4.2": ("ex04_pipeline.py", "from mpgpu_edu.pipeline import gpipe\n"
            "def gpipe_orders(n_stages, n_microbatches):\n"
            "    return [list(row) for row in gpipe(n_stages, n_microbatches).grid]\n"),
    "6.4": ("ex06_choosing.py", "from mpgpu_edu.lessons import choosing_and_debugging as cd\n"
            "def find_straggler(logs):\n    return cd.find_straggler_reference(logs)\n"),
    "6.3": ("ex06_choosing.py", "from mpgpu_edu.lessons import choosing_and_debugging as cd\n"
            "def smooth_ring(comm, block, steps):\n"
            "    return cd.smooth_ring_reference(comm, block, steps)\n"),
    "7.1": ("ex07_many_machines.py",
            "from mpgpu_edu.collectives.hierarchical import node_groups, rail_groups\n"
            "def node_and_rail_groups(world_size, per_node):\n"
            "    nodes = world_size // per_node\n"
            "    return node_groups(nodes, per_node), rail_groups(nodes, per_node)\n"),
    "8.1": ("ex08_bigger_models.py", "from mpgpu_edu.dp.fsdp import flat_shard\n"
            "def shard_of(flat, rank, world_size):\n"
            "    return flat_shard([flat], rank, world_size)\n"),
}


@pytest.mark.parametrize("exercise_id", sorted(CHEATS))
def test_handing_in_the_packages_reference_scores_nothing(exercise_id: str,
                                                          tmp_path: Path) -> None:
    filename, source = CHEATS[exercise_id]
    (tmp_path / filename).write_text(source)
    result = check(exercise_id, impl=str(tmp_path), figures=False)
    assert result.points == 0, str(result)
    assert "yours to write" in str(result)


def test_every_reference_names_a_real_function_of_its_lesson() -> None:
    """A typo in ``REFERENCES`` would block nothing: every target must import, and every key
    must be an exercise of that lesson."""
    import importlib

    for lesson in sorted({e.lesson for e in EXERCISES.values()}):
        references = getattr(lesson_module(lesson), "REFERENCES", {})
        for exercise_id, targets in references.items():
            assert get(exercise_id).lesson == lesson
            for target in targets:
                module, _, name = target.partition(":")
                owner = importlib.import_module(module)
                for part in name.split("."):
                    owner = getattr(owner, part)
                assert callable(owner), target


def test_a_function_checked_in_the_kernel_cannot_call_the_reference_either() -> None:
    """``check("1.6", fn)`` with a notebook's function runs in this process: its compute
    half has the lesson's reference tree out of reach too, and its judge still uses it."""
    from mpgpu_edu.lessons import communication as cm

    def tree_all_reduce(comm, tensor):  # noqa: ANN001, ANN202 - as a notebook defines it
        cm.binary_tree_all_reduce(comm, tensor)

    tree_all_reduce.__module__ = "__main__"
    result = check("1.6", tree_all_reduce, figures=False)
    assert result.points == 0, str(result)
    assert "yours to write" in str(result)
    assert cm.binary_tree_all_reduce.__name__ == "binary_tree_all_reduce"  # put back after
