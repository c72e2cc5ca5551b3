"""Progress of a long measurement, told while it runs.

A bench or a calibration runs inside the worker processes, for a minute or more, and its
report comes back only at the end. ``Progress`` lets rank 0 say how far it has got, one line
at a time, on the file descriptor 2 it inherited from the launcher (the worker's
``sys.stderr`` is captured for the rank's log; fd 2 is the terminal of the command that
started it). It stays silent unless the launcher asked for it (the CLI does; a notebook's
``bench_allreduce`` does not, as fd 2 there is the Jupyter server's log).
"""

from __future__ import annotations

import contextlib
import os
import time


class Progress:
    """``Progress(comm, what, total, on)``, then ``step(text)`` after each of ``total`` parts:
    rank 0 writes ``"<what>: <text> (<k> of <total>, <s> s)"`` when ``on``."""

    def __init__(self, comm: object, what: str, total: int, on: bool) -> None:
        self.what, self.total, self.done = what, total, 0
        self.on = bool(on) and getattr(comm, "rank", 0) == 0
        self.start = time.monotonic()

    def step(self, text: str) -> None:
        self.done += 1
        if not self.on:
            return
        line = (f"{self.what}: {text} ({self.done} of {self.total}, "
                f"{time.monotonic() - self.start:.0f} s)\n")
        with contextlib.suppress(OSError):
            os.write(2, line.encode())
