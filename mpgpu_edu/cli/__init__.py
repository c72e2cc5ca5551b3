"""The ``mpgpu-edu`` command line.

Each command is a module in this package with two functions::

    def add_parser(sub: argparse._SubParsersAction) -> None   # registers its sub-parser
    def run(args: argparse.Namespace) -> int                    # does the work, returns exit code

``add_parser`` must call ``parser.set_defaults(func=run)``, and the command's name is the
module's name (``mpgpu-edu memory`` lives in ``cli/memory.py``): ``main`` imports only the
module of the command it runs, so one command's heavy imports never slow down another. Bad input raises ``UsageError``
(or ``ValueError``); ``main`` prints one line and exits with status 2, never a traceback.
Commands that report numbers take ``--json`` and print one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.exit(2, f"mpgpu-edu: error: {message}\n")


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
    args = build_parser(only).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError) as exc:
        print(f"mpgpu-edu {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mpgpu-edu: interrupted", file=sys.stderr)
        return 130


def parse_size(text: str) -> int:
    """``"4096"``, ``"64KiB"``, ``"1GiB"``, ``"10MB"`` -> bytes. Raises UsageError otherwise."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 2**10, "M": 2**20,
             "G": 2**30}
    s = text.strip().replace(" ", "")
    i = len(s)
    while i > 0 and not (s[i - 1].isdigit() or s[i - 1] == "."):
        i -= 1
    number, unit = s[:i], s[i:].upper()
    try:
        value = float(number)
    except ValueError:
        raise UsageError(f"cannot read size {text!r}: write a number with an optional unit, "
                         "e.g. 4096, 64KiB, 1GiB") from None
    if unit not in units:
        raise UsageError(f"unknown size unit {s[i:]!r} in {text!r}: use B, KiB, MiB, GiB "
                         "(or KB, MB, GB)")
    if value < 0:
        raise UsageError(f"size must not be negative, got {text!r}")
    return int(value * units[unit])
