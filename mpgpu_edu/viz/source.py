"""Show a program's source in a notebook: the SPMD function a demo runs, read from its module
(which keeps it importable, so the same function also runs on real gloo processes)."""

from __future__ import annotations

import html
import inspect
from collections.abc import Callable
from typing import Any


class Source:
    """The source of one function; shows as highlighted code in a notebook, text elsewhere."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        target = getattr(fn, "fn", fn)  # a ``Chosen`` shows the function it wraps
        self.name = getattr(target, "__qualname__", repr(target))
        self.module = getattr(target, "__module__", "")
        self.text = inspect.getsource(target)

    def __str__(self) -> str:
        return f"# {self.module}.{self.name}\n{self.text}"

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer
        except ImportError:
            return f"<pre>{html.escape(str(self))}</pre>"
        return highlight(str(self), PythonLexer(), HtmlFormatter(noclasses=True))


def show_source(fn: Callable[..., Any]) -> Source:
    """The source of ``fn`` (a function, or what ``mp.yours`` chose), for a notebook cell."""
    return Source(fn)
