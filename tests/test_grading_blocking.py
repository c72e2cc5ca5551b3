"""``checks._blocking``: code made to raise however it is reached, and put back after; the
package's own bindings watched for changes."""

from __future__ import annotations

import functools
import sys
import types

import pytest

from mpgpu_edu.grading.checks._blocking import (changed_bindings, code_blocked, functions_of,
                                                package_bindings)


class Blocked(AssertionError):
    pass


def target(a, b=2):
    return a + b


def _closure():
    x = 5

    def inner(y):
        return x + y
    return inner


closure = _closure()


class Base:
    def __init__(self):
        self.v = 1

    def method(self):
        return super().__repr__()

    @staticmethod
    def static():
        return "static"

    @property
    def prop(self):
        return "prop"


@functools.wraps(target)
def wrapper(*args, **kwargs):
    return target(*args, **kwargs)


def test_every_way_of_reaching_blocked_code_raises_and_all_is_put_back():
    kept = {"fn": target}
    keeper = (lambda f=target: f(1))

    class Sub(Base):
        pass

    with code_blocked([(target, "no target"), (closure, "no closure"), (Base, "no Base")],
                      Blocked):
        for call in (lambda: target(1), lambda: kept["fn"](1), keeper, lambda: closure(1),
                     lambda: wrapper(1), Sub, Base, lambda: Base.static(),
                     lambda: Base.method(object.__new__(Base)),
                     lambda: Base.prop.fget(object.__new__(Base))):
            with pytest.raises(Blocked):
                call()
        with pytest.raises(Blocked, match="no target"):
            target(1)
    assert target(1) == 3 and kept["fn"](1) == 3 and keeper() == 3 and closure(1) == 6
    assert wrapper(1) == 3 and Sub().v == 1 and Base.static() == "static"
    assert Base().prop == "prop" and "Base object" in Base().method()


def test_code_is_put_back_when_the_block_raises():
    with pytest.raises(RuntimeError), code_blocked([(target, "no")], Blocked):
        raise RuntimeError("inside")
    assert target(1) == 3


def test_a_wrapper_is_followed_to_what_it_wraps():
    assert target in functions_of(wrapper) and wrapper in functions_of(wrapper)
    assert set(functions_of(Base)) >= {Base.__init__, Base.method, Base.__dict__["static"].__func__,
                                       Base.__dict__["prop"].fget}


def test_rebinding_or_swapping_the_packages_code_is_noticed(tmp_path):
    import mpgpu_edu.collectives.cost as cost

    before = package_bindings()
    original, code = cost.message_time, cost.message_time.__code__
    try:
        cost.message_time = lambda *args: 0.0
        assert "mpgpu_edu.collectives.cost.message_time" in changed_bindings(before)
        cost.message_time = original
        assert changed_bindings(before) == []
        cost.message_time.__code__ = (lambda *args: 0.0).__code__
        assert "mpgpu_edu.collectives.cost.message_time" in changed_bindings(before)
    finally:
        cost.message_time, cost.message_time.__code__ = original, code
    assert changed_bindings(before) == []


def test_code_from_the_learners_file_bound_in_a_package_module_is_noticed(tmp_path):
    """Also in a module first imported after the snapshot was taken."""
    import mpgpu_edu.collectives.cost as cost

    learner = tmp_path / "ex_mine.py"
    learner.write_text("def mine(*args):\n    return 0.0\n")
    namespace: dict = {}
    exec(compile(learner.read_text(), str(learner), "exec"), namespace)
    before = {key: ids for key, ids in package_bindings().items()
              if key[0] != "mpgpu_edu.collectives.cost"}  # as if cost was imported since
    cost.added_by_learner = namespace["mine"]
    try:
        assert changed_bindings(before, str(learner)) == [
            "mpgpu_edu.collectives.cost.added_by_learner"]
    finally:
        del cost.added_by_learner
    assert isinstance(sys.modules["mpgpu_edu.collectives.cost"], types.ModuleType)


def test_a_class_grading_child_keeps_the_references_blocked_between_cases(tmp_path,
                                                                          monkeypatch):
    """The child of class grading (the grader judges) blocks the references before the file
    is imported and unblocks them only at its end: a thread that watches them between two
    cases never sees them callable. A learner's own check (the child judges, with them)
    blocks them case by case, and the watcher sees the gaps."""
    import threading
    import time

    from mpgpu_edu.grading import compute
    from mpgpu_edu.grading.checks import Case
    from mpgpu_edu.pipeline import schedules

    seen: dict[str, bool] = {}

    def watch(impl):
        def look():
            end = time.monotonic() + 0.4
            while time.monotonic() < end:
                if schedules._one_f_one_b_order.__code__.co_filename != "<blocked>":
                    seen["callable"] = True
                time.sleep(0.0005)
        threading.Thread(target=look, daemon=True).start()
        return 0

    def later(impl):
        time.sleep(0.5)
        return 0

    cases = [Case("watch", 1, watch, lambda data: None),
             Case("later", 1, later, lambda data: None)]
    monkeypatch.setattr("mpgpu_edu.grading.checks.cases_for", lambda exercise: cases)
    def judged(case, message, request, sent):  # a judge takes its time, references callable
        time.sleep(0.05)
        return {**message, "type": "judged", "status": "passed", "message": "", "text": ""}

    monkeypatch.setattr(compute, "_judged", judged)
    learner = tmp_path / "ex04_pipeline.py"
    learner.write_text("def one_f_one_b_orders(n_stages, n_microbatches):\n    return []\n")
    for judge, gaps in ((False, False), (True, True)):
        seen.clear()
        sent: list = []
        request = {"exercise": "4.3", "judge": judge, "file": str(learner),
                   "function": "one_f_one_b_orders", "budget_s": 30.0, "start": 0,
                   "case_timeout_s": None, "memory_bytes": 2**30,
                   "display_file": "ex04_pipeline.py", "figures": False}
        def send(message, sent=sent):  # the pipe to the grader takes its time too
            sent.append(message)
            time.sleep(0.02)

        compute._run(send, request, compute.CappedOutput(1000))
        assert seen.get("callable", False) is gaps, (judge, seen)
        assert [m["type"] for m in sent][-1] == "done"
    assert schedules._one_f_one_b_order(0, 2, 2)  # and all is put back at the end
