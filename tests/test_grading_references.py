"""A submission that hands in the package's own implementation of the function it is asked to
write scores nothing: while its code computes, every reference a lesson names in
``REFERENCES`` raises, wherever it was imported (the learner's module included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpgpu_edu.grading import check
from mpgpu_edu.grading.checks import lesson_module
from mpgpu_edu.grading.registry import EXERCISES, get

ROOT = Path(__file__).resolve().parents[1]

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


# The package's code reached some other way than by a name the grader could rebind: kept in a
# dict, a tuple or a default argument at import time, subclassed, a private helper, an
# engineered collective. ("exercise", file, source, what the result says)
HELD = {
    "1.3 the engineered ring": ("1.3", "ex01_communication.py",
                                "from mpgpu_edu.collectives import ring_fast as rf\n"
                                "def ring_all_reduce(comm, tensor):\n"
                                "    rf.RingAllReduce(segment_bytes=None)(comm, tensor)\n",
                                "comm.send/recv/isend/irecv only"),
    "1.6 kept in a dict": ("1.6", "ex01_communication.py",
                           "from mpgpu_edu.lessons import communication as cm\n"
                           "_KEPT = {'tree': cm.binary_tree_all_reduce}\n"
                           "def tree_all_reduce(comm, tensor):\n"
                           "    _KEPT['tree'](comm, tensor)\n", "yours to write"),
    "0.2 the lesson's own copy": ("0.2", "ex00_devices.py",
                                  "from mpgpu_edu.lessons.welcome import device_ids_for\n"
                                  "def data_parallel_device_ids(visible, physical_gpus):\n"
                                  "    return device_ids_for(visible, physical_gpus)\n",
                                  "yours to write"),
    "3.4 a default argument": ("3.4", "ex03_data_parallel.py",
                               "from mpgpu_edu.memory import bytes_per_param as _b\n"
                               "def adam_memory(model, precision='fp32', _bpp=_b):\n"
                               "    b = _bpp('adam', precision)\n"
                               "    n = sum(p.numel() for p in model.parameters())\n"
                               "    return {k: n * b[k] for k in "
                               "('parameters', 'gradients', 'optimizer')}\n",
                               "yours to write"),
    "3.5 a subclass": ("3.5", "ex03_data_parallel.py",
                       "import mpgpu_edu.dp.wrapper as w\n"
                       "class _Mine(w.DDPWrapper):\n    pass\n"
                       "def wrap_ddp(comm, module, bucket_cap_bytes):\n"
                       "    return _Mine(comm, module, bucket_cap_bytes)\n", "yours to write"),
    "4.3 a private helper": ("4.3", "ex04_pipeline.py",
                             "from mpgpu_edu.pipeline import schedules as s\n"
                             "def one_f_one_b_orders(n_stages, n_microbatches):\n"
                             "    return [s._one_f_one_b_order(p, n_stages, n_microbatches)\n"
                             "            for p in range(n_stages)]\n", "yours to write"),
    "10.2 kept in a tuple": ("10.2", "ex10_planning.py",
                             "from mpgpu_edu.pipeline import schedules as s\n"
                             "_K = (s._interleaved_order,)\n"
                             "def interleaved_orders(n_stages, n_microbatches, n_chunks):\n"
                             "    return [_K[0](p, n_stages, n_microbatches, n_chunks)\n"
                             "            for p in range(n_stages)]\n", "yours to write"),
    "1.3 another exercise's answer": ("1.3", "ex01_communication.py",
                                      "from mpgpu_edu.lessons import communication as cm\n"
                                      "def ring_all_reduce(comm, tensor):\n"
                                      "    cm.binary_tree_all_reduce(comm, tensor)\n",
                                      "yours to write"),
    "1.2 another lesson's server": ("1.2", "ex01_communication.py",
                                    "from mpgpu_edu.lessons import parameter_server as ps\n"
                                    "def naive_all_reduce(comm, tensor):\n"
                                    "    if comm.rank == 0:\n"
                                    "        ps.reference_server_loop(comm, tensor, 1,\n"
                                    "                                 -(comm.world_size - 1))\n"
                                    "    else:\n"
                                    "        ps.reference_worker_step(comm, tensor, tensor, 0)\n",
                                    "yours to write"),
    "4.3 a table made at import": ("4.3", "ex04_pipeline.py",
                                   "from mpgpu_edu.pipeline import schedules as s\n"
                                   "_TABLE = {(p, m): [s._one_f_one_b_order(q, p, m)\n"
                                   "                   for q in range(p)]\n"
                                   "          for p in range(1, 9) for m in range(1, 17)}\n"
                                   "def one_f_one_b_orders(n_stages, n_microbatches):\n"
                                   "    return _TABLE[(n_stages, n_microbatches)]\n",
                                   "cannot be called"),
    "4.3 rebuilt from the code": ("4.3", "ex04_pipeline.py",
                                  "import types\n"
                                  "from mpgpu_edu.pipeline import schedules as s\n"
                                  "_COPY = types.FunctionType(s._one_f_one_b_order.__code__,\n"
                                  "                           s.__dict__, 'copy')\n"
                                  "def one_f_one_b_orders(n_stages, n_microbatches):\n"
                                  "    return [_COPY(p, n_stages, n_microbatches)\n"
                                  "            for p in range(n_stages)]\n",
                                  "cannot be called"),
    "8.2 a subclass": ("8.2", "ex08_bigger_models.py",
                       "import mpgpu_edu.dp.fsdp as f\n"
                       "class _R(f.FSDPReplica):\n    pass\n"
                       "def wrap_fsdp(comm, module, prefetch=False):\n"
                       "    return _R(comm, module, prefetch)\n", "the package's own"),
}


@pytest.mark.parametrize("name", sorted(HELD))
def test_the_packages_code_reached_any_other_way_scores_nothing(name: str,
                                                                 tmp_path: Path) -> None:
    exercise_id, filename, source, said = HELD[name]
    assert get(exercise_id).filename == filename
    (tmp_path / filename).write_text(source)
    result = check(exercise_id, impl=str(tmp_path), figures=False)
    assert result.points == 0, str(result)
    assert said in str(result)


def test_in_class_grading_the_references_stay_blocked_for_the_whole_run(tmp_path: Path
                                                                         ) -> None:
    """A thread the file starts at import, which calls the reference once the import is
    over (between two cases, or while a case runs), finds it blocked: in class grading the
    child blocks the references from before the import to its end."""
    from mpgpu_edu.grading.runner import run_exercise

    learner = tmp_path / "ex04_pipeline.py"
    learner.write_text(
        "import threading, time\n"
        "from mpgpu_edu.pipeline import schedules as s\n"
        "_TABLE = {}\n"
        "def _fill():\n"
        "    time.sleep(0.3)\n"
        "    for p in range(1, 9):\n"
        "        for m in range(1, 17):\n"
        "            _TABLE[(p, m)] = [s._one_f_one_b_order(q, p, m) for q in range(p)]\n"
        "threading.Thread(target=_fill, daemon=True).start()\n"
        "def one_f_one_b_orders(n_stages, n_microbatches):\n"
        "    for _ in range(40):\n"
        "        if (n_stages, n_microbatches) in _TABLE:\n"
        "            return _TABLE[(n_stages, n_microbatches)]\n"
        "        time.sleep(0.05)\n"
        "    raise RuntimeError('no table')\n")
    result = run_exercise("4.3", learner, judge_here=True)
    assert result.points == 0, str(result)


def test_changing_the_packages_own_code_fails_the_case(tmp_path: Path) -> None:
    """A correct answer from a file that rebinds one of the package's functions (at import,
    or while it runs) scores nothing, and is told why."""
    solved = (ROOT / "solutions" / "ex00_devices.py").read_text()
    (tmp_path / "ex00_devices.py").write_text(
        solved + "\nimport mpgpu_edu.collectives.cost as _cost\n"
                 "_cost.message_time = lambda *args: 0.0\n")
    result = check("0.1", impl=str(tmp_path), figures=False)
    assert result.points == 0, str(result)
    assert "changed the package's own mpgpu_edu.collectives.cost.message_time" in str(result)
    import mpgpu_edu.collectives.cost as cost  # this process is untouched: the check's child
    assert cost.message_time(0, 1e-5, 1e9) == pytest.approx(1e-5)


def test_every_reference_names_a_real_function_of_its_lesson() -> None:
    """A typo in ``REFERENCES`` would block nothing: every target must import, and every key
    must be an exercise of that lesson."""
    from mpgpu_edu.grading.checks._blocking import functions_of
    from mpgpu_edu.grading.compute import resolve_reference

    for lesson in sorted({e.lesson for e in EXERCISES.values()}):
        references = getattr(lesson_module(lesson), "REFERENCES", {})
        for exercise_id, targets in references.items():
            assert get(exercise_id).lesson == lesson
            for target in targets:
                resolved = resolve_reference(target)
                assert resolved, target
                for owner, _name in resolved:
                    assert functions_of(owner), target  # some Python code to block


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


# Every route to the package's own code that does not call it by name: its original code
# object dug out of the interpreter (gc), its module's source compiled again, its compiled
# module (__pycache__) loaded, its loader asked for either.
_DIG = '''
import gc, importlib.util, marshal, types

def _dig(module, name):
    """The package's own ``module.name``, by any route but its name."""
    routes = []
    def from_gc():
        seen, todo = set(), list(gc.get_objects())
        while todo:
            obj = todo.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if (isinstance(obj, types.CodeType) and obj.co_name == name
                    and obj.co_filename == module.__file__):
                return types.FunctionType(obj, vars(module))
            if isinstance(obj, (list, tuple, dict, types.FunctionType, types.CodeType)):
                todo.extend(gc.get_referents(obj))
    def from_source():
        namespace = {"__name__": module.__name__}
        exec(compile(open(module.__file__).read(), module.__file__, "exec"), namespace)
        return namespace[name]
    def from_cache():
        data = open(importlib.util.cache_from_source(module.__file__), "rb").read()
        namespace = {"__name__": module.__name__}
        exec(marshal.loads(data[16:]), namespace)
        return namespace[name]
    def from_loader():
        namespace = {"__name__": module.__name__}
        exec(module.__loader__.get_code(module.__name__), namespace)
        return namespace[name]
    for route in (from_gc, from_source, from_cache, from_loader):
        try:
            found = route()
            if found is not None:
                routes.append(found)
        except Exception:
            pass
    return routes
'''


def test_in_class_grading_the_packages_code_cannot_be_dug_out_or_compiled_again(
        tmp_path: Path) -> None:
    """4.3 answered with the package's own 1F1B order, reached through the interpreter's
    objects or through the module's source, compiled copy or loader: in a learner's own check
    the routes work (it need not resist its own learner), in class grading every one finds
    nothing (the original code is forgotten, the files read as empty) and the file scores
    nothing."""
    from mpgpu_edu.grading.runner import run_exercise

    learner = tmp_path / "ex04_pipeline.py"
    learner.write_text(_DIG + '''
from mpgpu_edu.pipeline import schedules as _s

def one_f_one_b_orders(n_stages, n_microbatches):
    for found in _dig(_s, "_one_f_one_b_order"):
        try:
            return [found(p, n_stages, n_microbatches) for p in range(n_stages)]
        except Exception:
            pass
    raise NotImplementedError("no route")
''')
    own = check("4.3", impl=str(tmp_path), figures=False)
    assert own.points == own.max_points, str(own)  # the routes work among the learner's own
    graded = run_exercise("4.3", learner, judge_here=True)
    assert graded.points == 0, str(graded)


def test_in_class_grading_a_rank_cannot_dig_out_the_blocked_collectives(tmp_path: Path
                                                                         ) -> None:
    """1.3 answered with the package's own ring, dug out in the rank's process: nothing."""
    from mpgpu_edu.grading.runner import run_exercise

    solved = (ROOT / "solutions" / "ex01_communication.py").read_text()
    start = solved.index("    ### BEGIN SOLUTION 1.3")
    end = solved.index("    ### END SOLUTION", start) + len("    ### END SOLUTION")
    body = '''    import mpgpu_edu.collectives.allreduce as _a
    for found in _dig(_a, "all_reduce_ring"):
        try:
            return found(comm, tensor)
        except Exception:
            pass
    raise NotImplementedError("no route")
'''
    learner = tmp_path / "ex01_communication.py"
    learner.write_text(_DIG + solved[:start] + body + solved[end:])
    graded = run_exercise("1.3", learner, judge_here=True)
    assert graded.points == 0, str(graded)
