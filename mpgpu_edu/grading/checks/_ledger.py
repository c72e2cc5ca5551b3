"""A rank's communicator that writes down what a tensor held each time a receive completed
(the works a rank started and waited on, the grader counts from the run's record:
``_clock.works_of``)."""

from __future__ import annotations

from typing import Any

import torch


class WorkLedger:
    """A rank's communicator that writes down, as plain data for the judge, a copy of the
    tensor ``watch`` each time a receive completes (``at_receive``); everything else goes to
    the real one. It tracks its isend/irecv works only to see each receive complete once."""

    def __init__(self, comm: Any, watch: torch.Tensor | None = None) -> None:
        self._comm, self._watch_tensor = comm, watch
        self.started: list[str] = []
        self.waited: set[int] = set()
        self.at_receive: list[dict] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def _received(self, src: Any) -> None:
        if self._watch_tensor is not None:
            self.at_receive.append({"src": src, "params": self._watch_tensor.clone()})

    def _work(self, what: str, work: Any, src: int | None = None) -> Any:
        ledger, index = self, len(self.started)
        self.started.append(what)

        class Watched:
            inner, number = work, index

            def wait(self) -> Any:
                result = work.wait()
                if index not in ledger.waited and what == "irecv":
                    ledger._received(src)
                ledger.waited.add(index)
                return result
        return Watched()

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        self._comm.recv(tensor, src, tag)
        self._received(src)

    def recv_any(self, tensor: torch.Tensor, sources: Any, tag: int = 0) -> int:
        src = self._comm.recv_any(tensor, sources, tag)
        self._received(src)
        return src

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Any:
        return self._work("isend", self._comm.isend(tensor, dst, tag))

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Any:
        return self._work("irecv", self._comm.irecv(tensor, src, tag), src)

    def wait_any(self, works: Any) -> int:
        index = self._comm.wait_any([getattr(w, "inner", w) for w in works])
        number = getattr(works[index], "number", None)
        if number is not None and number not in self.waited:
            if self.started[number] == "irecv":
                self._received(None)
            self.waited.add(number)
        return index

