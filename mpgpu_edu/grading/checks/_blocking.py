"""Code out of reach while a learner's code computes, and the package left as it was.

``code_blocked`` makes functions raise by swapping their *code*, not the names that point at
them: a reference kept anywhere (in a dict, a list, a default argument, as the base class of
a subclass, under a name imported before the check started) runs the same function object,
so it raises too. A class is blocked by blocking every function in its own namespace
(methods, static and class methods, properties), which a subclass inherits. A wrapper made
with ``functools.wraps`` is followed to what it wraps (``__wrapped__``), so the inner function
cannot be reached around the wrapper either. Every code object is put back on the way out.

``package_bindings`` and ``changed_bindings`` notice a submission that rebinds the package's
own functions and classes (``mpgpu_edu.dp.wrapper.all_reduce = ...``) or swaps their code:
taken before a case and compared after it, any difference fails the case.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import types
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

_MESSAGE, _ERROR = "\x00mpgpu-blocked-message", "\x00mpgpu-blocked-error"


def functions_of(target: Any) -> list[types.FunctionType]:
    """The Python functions whose code runs when ``target`` (a function, a method, a class, a
    ``staticmethod``/``classmethod``/``property``, a ``functools`` wrapper) is used."""
    found: list[types.FunctionType] = []
    seen: set[int] = set()

    def add(value: Any, depth: int = 0) -> None:
        if value is None or depth > 8 or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, types.FunctionType):
            found.append(value)
        elif isinstance(value, (staticmethod, classmethod, types.MethodType)):
            add(value.__func__, depth + 1)
        elif isinstance(value, property):
            for part in (value.fget, value.fset, value.fdel):
                add(part, depth + 1)
        elif inspect.isclass(value):
            for member in vars(value).values():
                add(member, depth + 1)
            return
        add(getattr(value, "__wrapped__", None), depth + 1)
        add(getattr(value, "func", None) if not inspect.isclass(value) else None, depth + 1)

    add(target)
    return found


def raising_code(fn: types.FunctionType, error: type[BaseException],
                 message: str) -> types.CodeType:
    """A code object that raises ``error(message)``, fit to replace ``fn.__code__``: any
    arguments, and as many free variables as ``fn`` has (a method that calls ``super()``
    has one), which it never reads."""
    code = _template(fn.__code__.co_freevars)
    consts = tuple(error if c == _ERROR else message if c == _MESSAGE else c
                   for c in code.co_consts)
    return code.replace(co_consts=consts, co_name=fn.__code__.co_name,
                        co_qualname=fn.__code__.co_qualname)


@functools.lru_cache(maxsize=None)
def _template(free: tuple[str, ...]) -> types.CodeType:
    """The raising code for functions with the free variables ``free`` (compiled once per
    such tuple: most have none), its error and message still placeholders."""
    source = ["def outer():", *[f"    {name} = None" for name in free],
              "    def blocked(*args, **kwargs):"]
    if free:
        source.append("        (" + ", ".join(free) + ",)")
    source += [f"        raise {_ERROR!r}({_MESSAGE!r})", "    return blocked"]
    namespace: dict[str, Any] = {}
    with warnings.catch_warnings():  # "'str' object is not callable": replaced below
        warnings.simplefilter("ignore")
        exec(compile("\n".join(source), "<blocked>", "exec"), namespace)  # noqa: S102
    return namespace["outer"]().__code__


@contextlib.contextmanager
def code_blocked(targets: Iterable[tuple[Any, str]],
                 error: type[BaseException]) -> Iterator[None]:
    """While inside, calling any of ``targets`` (``(object, message)`` pairs) raises
    ``error(message)``, however the caller reached it."""
    swapped: list[tuple[types.FunctionType, types.CodeType]] = []
    done: set[int] = set()
    mine = _ACTIVE.setdefault(threading.get_ident(), [])
    mine.append(swapped)
    try:
        for target, message in targets:
            for fn in functions_of(target):
                if id(fn) in done:
                    continue
                done.add(id(fn))
                swapped.append((fn, fn.__code__))  # (no local name keeps the original: seal)
                fn.__code__ = raising_code(fn, error, message)
        yield
    finally:
        for fn, original in reversed(swapped):
            fn.__code__ = original
        with contextlib.suppress(ValueError):
            mine.remove(swapped)


# The blocks each thread is inside (``code_blocked``), innermost last: ``release_thread``
# puts their code back for a thread that cannot leave them (a check in the kernel that hangs).
_ACTIVE: dict[int, list[list[tuple[types.FunctionType, types.CodeType]]]] = {}


def release_thread(ident: int) -> None:
    """Put back the code of every block thread ``ident`` is inside, innermost first: the
    thread may go on running (an endless loop in the learner's code), the rest of the
    process gets the package's functions back. Should the thread leave its blocks later, it
    puts back the same code."""
    for swapped in reversed(_ACTIVE.get(ident, [])):
        for fn, original in reversed(swapped):
            fn.__code__ = original


def seal() -> set[str]:
    """In a process that will never put the package's code back (a class-grading child,
    whose references stay blocked until it ends; a rank's process): forget the original code
    of every function blocked now, in every thread, so that no object of the process holds
    it any more; the blocks, on the way out, then put back nothing. Returns the files that
    code came from, for the caller to hide (``runtime.isolate.hide_files``): the code could
    be compiled again from them."""
    files: set[str] = set()
    for blocks in _ACTIVE.values():
        for swapped in blocks:
            files.update(original.co_filename for _fn, original in swapped)
            swapped.clear()
    return files


def package_bindings(prefix: str = "mpgpu_edu") -> dict[tuple[str, str], tuple[int, int]]:
    """Every function, class and module that a loaded module of the package binds, by
    (module, name): the object's id and, for a function, its code's."""
    found: dict[tuple[str, str], tuple[int, int]] = {}
    for module_name, module in list(sys.modules.items()):
        if not (module_name == prefix or module_name.startswith(prefix + ".")):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if isinstance(value, types.FunctionType):
                found[(module_name, name)] = (id(value), id(value.__code__))
            elif inspect.isclass(value) or isinstance(value, types.ModuleType):
                found[(module_name, name)] = (id(value), 0)
    return found


def changed_bindings(before: dict[tuple[str, str], tuple[int, int]],
                     learner_file: str = "", prefix: str = "mpgpu_edu") -> list[str]:
    """``module.name`` of each binding in ``before`` that now points elsewhere (or whose
    function now runs other code), or is gone; and, in every module of the package (those
    imported since ``before`` too), each name bound to a function whose code comes from
    ``learner_file`` or to a class defined there."""
    now = package_bindings(prefix)
    changed = [f"{module}.{name}" for (module, name), ids in before.items()
               if now.get((module, name)) != ids]
    if learner_file:
        for module_name, name in now:
            value = getattr(sys.modules.get(module_name), name, None)
            if _from_file(value, learner_file) and f"{module_name}.{name}" not in changed:
                changed.append(f"{module_name}.{name}")
    return changed


def _from_file(value: Any, filename: str) -> bool:
    """Whether ``value`` is a function whose code, or a class whose methods, were written
    in ``filename``."""
    if isinstance(value, types.FunctionType):
        return value.__code__.co_filename == filename
    if inspect.isclass(value):
        return any(isinstance(member, types.FunctionType)
                   and member.__code__.co_filename == filename
                   for member in vars(value).values())
    return False
