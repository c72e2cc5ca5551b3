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
