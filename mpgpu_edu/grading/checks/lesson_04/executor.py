"""Exercise 4.5's *compute*: the learner's executor runs a training step on the simulator,
each stage wrapped so that it counts forwards and backwards and, watching the tensors each
forward hands out (``weakref.finalize``), sees at the start of every forward and every
backward which microbatches the executor still keeps alive."""

from __future__ import annotations

import copy
import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from mpgpu_edu.grading.checks._support import (compute_examples, examples, launch_facts,
                                               run_spmd, uniform)
from mpgpu_edu.grading.checks import CheckFailure
from mpgpu_edu.grading.checks.lesson_04.stages import (ABOUT, EARLIER_GRAD, LR, _data,
                                                       _named_schedule, _split)
from mpgpu_edu.pipeline import Schedule

Impl = Callable[..., Any]


class _Release(torch.autograd.Function):
    """Identity on the stage's output whose backward (the start of that microbatch's backward
    in this stage) records which forwards' tensors are still alive."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, counter: _Counted, call: int) -> torch.Tensor:
        ctx.counter, ctx.call = counter, call
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.counter.backwards += 1
        ctx.counter.events.append(["B", ctx.call, ctx.counter.kept()])
        return grad, None, None


class _Counted(nn.Module):
    """The stage as the learner gets it: counts forwards and backwards, and watches the
    tensors each forward hands out (its output and, on a later stage, the received input)
    with ``weakref.finalize`` and their memory with a weak reference to its storage, so that
    at the start of every forward and every backward it knows which forwards' tensors the
    executor still keeps alive, itself or through a view, a ``.detach()`` or a send's Work."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.forwards = self.backwards = 0
        self.events: list[list] = []  # ["F" or "B", call, [calls still alive at its start]]
        self.alive: dict[int, int] = {}  # watch number -> forward call
        self.memory: list[tuple[int, StorageWeakRef]] = []  # forward call, its memory
        self._keys = itertools.count()

    def _watch(self, tensor: torch.Tensor, call: int) -> None:
        key = next(self._keys)
        self.alive[key] = call
        weakref.finalize(tensor, self.alive.pop, key, None)
        self.memory.append((call, StorageWeakRef(tensor.untyped_storage())))

    def kept(self) -> list[int]:
        """The forwards whose tensors, or their memory (a ``.detach()``, a send's Work), are
        still alive."""
        self.memory = [(call, ref) for call, ref in self.memory if not ref.expired()]
        return sorted(set(self.alive.values()) | {call for call, _ in self.memory})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        call = self.forwards
        self.forwards += 1
        self.events.append(["F", call, self.kept()])
        y = self.inner(x)
        if not y.requires_grad:
            return y
        out = _Release.apply(y, self, call)
        self._watch(out, call)
        if x.requires_grad:  # a received activation (the caller's microbatches never are)
            self._watch(x, call)
        return out


def _executor_program(impl: Impl, stages: list[nn.Sequential], widths_in: list[int],
                      schedule: Schedule, data: tuple[list, list], sizes: list[int],
                      seconds: tuple[float, float] | None) -> Callable[[Any], dict]:
    """``stages``: one per rank; ``data``: per rank, its microbatches and its targets (the
    first stage's and the last one's, None elsewhere); ``sizes``: each microbatch's rows."""
    def program(comm: Any) -> dict:
        rank = comm.rank
        xs, ys = data[0][rank], data[1][rank]  # the first stage's microbatches, the last's targets
        stage = _Counted(copy.deepcopy(stages[rank]))
        for w in stage.inner.parameters():  # as after an earlier accumulation step
            w.grad = torch.full_like(w, EARLIER_GRAD)
        shapes = [(rows, widths_in[rank]) for rows in sizes] if rank > 0 else None
        loss = impl(comm, schedule, stage, xs, ys, shapes, nn.functional.mse_loss, seconds)
        grads = {n: w.grad for n, w in stage.inner.named_parameters()}
        with torch.no_grad():
            for w in stage.inner.parameters():
                if w.grad is not None:
                    w -= LR * w.grad
        return {"loss": loss, "grads": grads, "forwards": stage.forwards,
                "backwards": stage.backwards, "events": stage.events,
                "params": {n: w.detach() for n, w in stage.inner.named_parameters()}}
    return program


def _run_executor(impl: Impl, p: int, m: int, schedule: str, partition: str = "balanced",
                  batch: int = 0, seed: int = 0, model: str = "mlp",
                  seconds: tuple[float, float] | None = None) -> dict:
    stages, widths_in = _split(p, partition, seed, model)
    xs, ys = _data(batch or 2 * m, m, seed, model)
    inputs = [xs if r == 0 else None for r in range(p)]  # each only where it is given
    targets = [ys if r == p - 1 else None for r in range(p)]
    program = _executor_program(impl, stages, widths_in, _named_schedule(schedule, p, m),
                                (inputs, targets), [len(x) for x in xs], seconds)
    try:
        result = run_spmd(program, uniform(p), timeout=45.0, hide=[stages, inputs, targets])
    except CheckFailure as exc:  # a deadlock or mismatched messages: say on which schedule
        raise CheckFailure(f"{schedule}, {p} stages, {m} microbatches{ABOUT.get(schedule, '')}:"
                           f" {exc}") from None
    return launch_facts(result, with_trace=True)


def _runs(examples_: list[dict], seconds: tuple[float, float] | None = None
          ) -> Callable[[Impl], list]:
    return lambda impl: [[_run_executor(impl, seconds=seconds, **e), e] for e in examples_]


STEP_GPIPE = [{"p": 3, "m": 4, "schedule": "gpipe"}, {"p": 2, "m": 1, "schedule": "gpipe"}]
STEP_1F1B = [{"p": 3, "m": 4, "schedule": "1f1b"}, {"p": 4, "m": 6, "schedule": "1f1b"}]
STEP_OTHER = [{"p": 3, "m": 3, "schedule": "backwards-last-first"},
              {"p": 4, "m": 3, "schedule": "neighbours-differ"},
              {"p": 3, "m": 3, "schedule": "forwards-differ"}]
IN_FLIGHT = [{"p": 4, "m": 6, "schedule": "gpipe"}, {"p": 4, "m": 6, "schedule": "1f1b"},
             {"p": 3, "m": 2, "schedule": "1f1b"}]
SECONDS = (0.002, 0.004)


HIDDEN_EXECUTOR = [  # then 6 drawn at random
    {"p": 3, "m": 4, "schedule": "1f1b", "partition": "random", "batch": 11, "seed": 3,
     "model": "hourglass"},
    {"p": 5, "m": 7, "schedule": "1f1b", "partition": "balanced", "batch": 16, "seed": 5,
     "model": "hourglass"},
    {"p": 5, "m": 3, "schedule": "gpipe", "partition": "random", "batch": 7, "seed": 7,
     "model": "mlp"},
    {"p": 4, "m": 9, "schedule": "backwards-last-first", "partition": "random", "batch": 21,
     "seed": 9, "model": "hourglass"},
]


def _hidden_executor(impl: Impl) -> list[dict]:
    drawn = examples(6, seed=45, p=(2, 5), m=(1, 7), seed_=(0, 999), extra_rows=(0, 5))
    cases = HIDDEN_EXECUTOR + [
        {"p": d["p"], "m": d["m"] + (d["m"] % d["p"] == 0),  # never a multiple of P
         "schedule": ("gpipe", "1f1b", "neighbours-differ", "forwards-differ")[i % 4], "partition": ("random", "balanced")[i % 3 > 0],
         "batch": 2 * (d["m"] + 1) + d["extra_rows"], "seed": d["seed_"],
         "model": ("mlp", "hourglass")[i % 2]}
        for i, d in enumerate(drawn)]

    def body(**example: Any) -> dict:  # the run's record: results and messages
        return _run_executor(impl, **example, seconds=SECONDS)
    return compute_examples(body, cases)
