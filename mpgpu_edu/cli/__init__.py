"""The ``mpgpu-edu`` command line.

Each command is a module in this package with two functions::

    def add_parser(sub: argparse._SubParsersAction) -> None   # registers its sub-parser
    def run(args: argparse.Namespace) -> int                    # does the work, returns exit code

``add_parser`` must call ``parser.set_defaults(func=run)``, and the command's name is the
module's name (``mpgpu-edu memory`` lives in ``cli/memory.py``): ``main`` imports only the
module of the command it runs, so one command's heavy imports never slow down another. Bad input raises ``UsageError``
(or ``ValueError``); ``main`` prints one line and exits with status 2, never a traceback.
Commands that report numbers take ``--json`` and print one JSON object on stdout.

Every numeric option takes ``type=number(int or float, low, high)``: argparse then refuses
nan, inf, values below ``low`` and past the stated limit ``high`` before the command starts
any work (tests/test_cli_bad_input.py walks the parser and holds every option to it). Sizes
go through ``parse_size``, whose limit each command states; output files through
``writable_file``, before any long work. An error of a library function that is the user's
input's fault becomes a ``UsageError`` inside ``with usage_errors(KeyError, ...)``; a command
with sub-commands (``mpgpu-edu bench allreduce``) gets its parser from ``add_command_group``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import pkgutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


@contextlib.contextmanager
def usage_errors(*kinds: type[Exception]) -> Iterator[None]:
    """Inside, an exception of one of ``kinds`` becomes a ``UsageError`` with its message (a
    ``KeyError``'s own text, not its quoted repr): the registry's unknown id, a course folder
    that is not found."""
    try:
        yield
    except kinds as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise UsageError(message) from None


def add_command_group(sub: argparse._SubParsersAction, name: str,
                      run: Callable[[argparse.Namespace], int], *, help: str,  # noqa: A002
                      description: str) -> argparse._SubParsersAction:
    """The parser of a command made of sub-commands (``mpgpu-edu NAME WHAT``), which runs
    ``run``; returns the action that each WHAT's parser is added to (a WHAT is required)."""
    parser = sub.add_parser(name, help=help, description=description)
    what = parser.add_subparsers(dest="what", metavar="WHAT")
    what.required = True
    parser.set_defaults(func=run)
    return what


def command_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="mpgpu-edu", description="Multi-GPU training, built from scratch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in command_names():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"{__name__}.{name}")
        if hasattr(module, "add_parser"):
            module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    only = argv[0] if argv and argv[0] in command_names() else None
    try:
        args = build_parser(only).parse_args(argv)
    except SystemExit as exc:  # argparse's errors (one line, see _Parser) and --help
        return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 2
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError) as exc:
        name = " ".join(filter(None, (args.command, getattr(args, "what", None))))
        print(f"mpgpu-edu {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mpgpu-edu: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the output went to `head` or similar, which stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


MAX_SIZE = 2**50  # 1 PiB: no size the course deals with comes near it


def _plain(value: float) -> str:
    """``1024`` -> "1024", ``3.6e6`` -> "3600000", ``1e-3`` -> "0.001"."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}"


def number(kind: type, low: float, high: float, *, above: bool = False,
           hint: str = "") -> Callable[[str], float]:
    """An argparse ``type``: a finite ``kind`` (int or float) from ``low`` (more than ``low``
    when ``above``) to ``high``, the option's stated limit; ``hint`` says how to stay under
    it. Anything else is argparse's one-line error, exit status 2, before any work starts."""
    name = "a whole number" if kind is int else "a number"

    def read(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if value < low or (above and value == low):
            bound = f"more than {_plain(low)}" if above else f"at least {_plain(low)}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(
                f"must be at most {_plain(high)}, got {text!r}" + (f": {hint}" if hint else ""))
        return value

    read.__name__ = kind.__name__
    # what tests/test_cli_bad_input.py reads to know the option is numeric
    read.kind, read.low, read.high, read.above = kind, low, high, above  # type: ignore
    return read


def writable_file(path: str, flag: str) -> Path:
    """Check that ``path`` can be written (its folder exists and is writable), before any
    long work starts; raises UsageError naming ``flag`` and the fix."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise UsageError(f"{flag} {path!r} is a folder: give a file name, e.g. "
                         f"{str(target / 'report.html')!r}")
    if not folder.is_dir():
        raise UsageError(f"{flag} {path!r}: the folder {str(folder)!r} does not exist: create "
                         f"it (mkdir -p {folder}) or write the file elsewhere")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists()
                                                    and not os.access(target, os.W_OK)):
        raise UsageError(f"{flag} {path!r}: permission denied: choose a file in a folder you "
                         "can write")
    return target


def parse_size(text: str, limit: int = MAX_SIZE, what: str = "size", why: str = "") -> int:
    """``"4096"``, ``"64KiB"``, ``"1GiB"``, ``"10MB"`` -> bytes, at most ``limit`` (``why``:
    the reason for it, shown). Raises UsageError naming ``what`` (e.g. the option) otherwise."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 2**10, "M": 2**20,
             "G": 2**30}
    s = text.strip().replace(" ", "")
    i = len(s)
    while i > 0 and not (s[i - 1].isdigit() or s[i - 1] == "."):
        i -= 1
    digits, unit = s[:i], s[i:].upper()
    try:
        value = float(digits)
    except ValueError:
        raise UsageError(f"cannot read {what} {text!r}: write a number with an optional unit, "
                         "e.g. 4096, 64KiB, 1GiB") from None
    if unit not in units:
        raise UsageError(f"unknown size unit {s[i:]!r} in {what} {text!r}: use B, KiB, MiB, "
                         "GiB (or KB, MB, GB)")
    if value < 0:
        raise UsageError(f"{what} must not be negative, got {text!r}")
    if not math.isfinite(value) or value * units[unit] > limit:
        raise UsageError(f"{what} {text!r} is past the limit of {_size_text(limit)}{why}: "
                         "give a smaller size, e.g. 1GiB")
    return int(value * units[unit])


def _size_text(nbytes: int) -> str:
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20),
                        ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} bytes"
