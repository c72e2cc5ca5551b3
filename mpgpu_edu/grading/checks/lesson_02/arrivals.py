"""Exercise 2.3's server loop against workers of uneven speed: it takes gradients as they
arrive, updates only once every gradient of the step is in, and waits on every isend and
irecv. The server's communicator is a ``WorkLedger`` that watches its parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.grading.checks._ledger import WorkLedger
from mpgpu_edu.grading.checks._support import (counting_calls, expect, expect_close,
                                               from_scratch, launch_facts, rank_inputs,
                                               run_spmd)
from mpgpu_edu.grading.checks.lesson_02.steps import (LR, _reference_worker, _server_traffic,
                                                      judge_sends_after_receives,
                                                      judge_updates)

Impl = Callable[..., Any]
DELAYS = (3e-3, 1e-3, 2e-3)  # seconds of compute of workers 0, 1, 2: worker 0 is the slowest
UNEVEN_STEPS = 2


def _uneven_workers(impl: Impl) -> dict:
    """compute: the learner's server loop for two steps against reference workers that need
    ``DELAYS`` seconds per gradient; the server's communicator is a ``WorkLedger`` watching its
    parameters."""
    n, numel = len(DELAYS) + 1, 100
    params, grads = torch.linspace(-1, 1, numel), rank_inputs(n, numel, 1)
    watched: list[Any] = [None] * n  # the server's: what its parameters held at each receive
    held: list[Any] = [[] for _ in range(n)]

    def program(comm: Any) -> torch.Tensor:
        mine = params.clone()
        if comm.rank == n - 1:
            ledger = WorkLedger(comm, watch=mine)
            watched[n - 1] = ledger.at_receive
            impl(ledger, mine, UNEVEN_STEPS, LR)
            return mine
        for _step in range(UNEVEN_STEPS):
            with comm.compute("backward", "gradient", seconds=DELAYS[comm.rank]):
                pass
            held[comm.rank].append(mine.clone())  # what this step's gradient is computed at
            _reference_worker(comm, mine, grads[comm.rank].clone(), n - 1)
        return mine

    with from_scratch(impl, "2.3"), counting_calls(impl, ["sgd_update"]) as calls:
        facts = launch_facts(run_spmd(program, n, hide=[grads], collect=[watched, held]),
                             with_trace=True)
    facts["updates"] = calls["sgd_update"].count(n - 1)
    facts["at_receive"] = watched[n - 1]  # the server's parameters
    facts["held"] = held[: n - 1]  # each worker's parameters when it sent each gradient
    return facts


def _judge_uneven(facts: dict) -> None:
    n = len(DELAYS) + 1
    server = n - 1
    recvs = sorted((e for e in facts["trace"]["events"] if e["device"] == server
                    and e["stream"] == "comm" and e["kind"] == "recv"),
                   key=lambda e: e["start"])
    first = [e["peer"] for e in recvs[: n - 1]]
    want = sorted(range(n - 1), key=lambda w: DELAYS[w])
    finish = ", ".join(f"{d * 1e3:g}" for d in DELAYS)
    expect(first == want,
           f"workers 0, 1, 2 finish their gradients after {finish} ms; the server received "
           f"the first step's gradients from workers {first}, in that order, so a fast "
           f"worker's message waited for a slower one's (arrival order: {want})")
    _server_traffic(facts, n, steps=UNEVEN_STEPS)


def _judge_no_early_send(facts: dict) -> None:
    """From what the grader sees and the check's own workers hold: each step's parameters go
    out only once every gradient of the step is in (the grader's timeline), and every worker
    computes each step's gradient at the same parameters (what the server sent; the workers
    run the check's code, never the learner's)."""
    n = len(DELAYS) + 1
    judge_sends_after_receives(facts["trace"], n - 1, n - 1, UNEVEN_STEPS)
    held = facts["held"]
    for step in range(1, UNEVEN_STEPS):
        for worker in range(1, n - 1):
            expect(torch.equal(held[worker][step], held[0][step]),
                   f"step {step}: workers 0 and {worker} computed their gradients at "
                   "different parameters: the server sent them different ones (one update "
                   "per step, once every gradient is in, then the same parameters to all)")


def _judge_no_early_update(facts: dict) -> None:
    """Feedback only (seen inside the server's process): the server's parameters, each time
    one of its receives completed, against the parameters the worker that sent it held when
    it computed that gradient (what the server sent it the step before; the start's in step
    0)."""
    n = len(DELAYS) + 1
    seen, held = facts["at_receive"], facts["held"]
    expect(len(seen) == UNEVEN_STEPS * (n - 1),
           f"in {UNEVEN_STEPS} steps with {n - 1} workers the server should complete "
           f"{UNEVEN_STEPS * (n - 1)} receives; it completed {len(seen)}")
    for i, record in enumerate(seen):
        step, k = divmod(i, n - 1)
        src = record["src"] if record["src"] is not None else 0
        who = "" if record["src"] is None else f" (from worker {record['src']})"
        expect_close(record["params"], held[src][step],
                     f"step {step}: when gradient {k + 1} of {n - 1}{who} arrived, the "
                     "server's parameters were not those the worker computed it at (the ones "
                     "the server sent it last): the server changed them before every gradient "
                     "of the step was in, or sent the workers parameters other than its "
                     "updated ones")
    judge_updates(facts["updates"], UNEVEN_STEPS, "the server")
