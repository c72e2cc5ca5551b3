"""Lesson 02's one-step cases (2.1 the worker, 2.2 the server, 2.3's loop for one step): the
learner's side runs on the simulator against the reference of the other side, and the judge
rebuilds the parameters after one SGD step on the mean gradient."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._ledger import WorkLedger
from mpgpu_edu.grading.checks._support import (bytes_of, compute_examples, counting_calls,
                                               examples, expect, expect_close, expect_waited,
                                               from_scratch, judge_examples, launch_facts,
                                               rank_inputs, run_spmd)

Impl = Callable[..., Any]
LR = 0.1


# ---- the reference sides ---------------------------------------------------------------------

def _reference_worker(comm: Any, params: torch.Tensor, grad: torch.Tensor, server: int) -> None:
    comm.send(grad, server)
    comm.recv(params, server)


def _reference_server(comm: Any, params: torch.Tensor, lr: float) -> None:
    workers = [r for r in range(comm.world_size) if r != comm.rank]
    total, buffer = torch.zeros_like(params), torch.empty_like(params)
    for worker in workers:
        comm.recv(buffer, worker)
        total.add_(buffer)
    params.sub_(total / len(workers), alpha=lr)
    for worker in workers:
        comm.send(params, worker)


def start_and_grads(n: int, numel: int, seed: int, dtype: str = "float32"
                    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The parameters every rank starts from and each rank's gradient; in float64 plus
    sevenths, which float32 cannot hold."""
    params, grads = torch.linspace(-1, 1, numel), rank_inputs(n, numel, seed)
    if dtype == "float64":
        params = params.double() + 1 / 7
        grads = [g.double() + (r + 1) / 7 for r, g in enumerate(grads)]
    return params, grads


def tolerance(dtype: str) -> tuple[float, ...]:
    """expect_close's rtol and atol: float64's precision for float64 runs."""
    return (1e-12, 1e-12) if dtype == "float64" else ()


def _one_step(n: int, numel: int, server: int | None, seed: int, dtype: str = "float32"
              ) -> torch.Tensor:
    """Parameters after one SGD step on the mean gradient of the workers (``server`` is
    None: every rank is a worker)."""
    params, grads = start_and_grads(n, numel, seed, dtype)
    mean = torch.stack([g for r, g in enumerate(grads) if r != server]).mean(0)
    return params - LR * mean


# ---- one step, one side from the learner ---------------------------------------------------

def _run_step(impl: Impl, side: str, n: int, numel: int, server: int, seed: int = 0,
              with_trace: bool = False, watch: bool = False, dtype: str = "float32") -> dict:
    """One step with the learner's ``side`` ("worker", "server" or "loop": 2.3 for one step)
    against the reference of the other side. ``grad_changed``: per rank, whether the
    learner's worker changed the gradient it was handed; ``watch``: the server's
    communicator is a ``WorkLedger``, and ``at_receive`` what its parameters held each time
    one of its receives completed."""
    params, grads = start_and_grads(n, numel, seed, dtype)
    changed: list[Any] = [False] * n
    watched: list[Any] = [None] * n  # the server's: what its parameters held at each receive

    def program(comm: Any) -> torch.Tensor:
        mine = params.clone()
        if comm.rank == server:
            if watch:
                comm = WorkLedger(comm, watch=mine)
                watched[server] = comm.at_receive
            if side == "server":
                impl(comm, mine, LR)
            elif side == "loop":
                impl(comm, mine, 1, LR)
            else:
                _reference_server(comm, mine, LR)
        elif side == "worker":
            grad = grads[comm.rank].clone()
            impl(comm, mine, grad, server)
            changed[comm.rank] = not torch.equal(grad, grads[comm.rank])
        else:
            _reference_worker(comm, mine, grads[comm.rank].clone(), server)
        return mine

    exercise = {"worker": "2.1", "server": "2.2", "loop": "2.3"}[side]
    with from_scratch(impl, exercise), counting_calls(impl, ["sgd_update"]) as calls:
        facts = launch_facts(run_spmd(program, n, hide=[grads], collect=[changed, watched]),
                             with_trace or watch)
    facts["grad_changed"] = changed
    facts["updates"] = [calls["sgd_update"].count(r) for r in range(n)]
    if watch:
        facts["at_receive"] = watched[server]
    return facts


def _judge_step(facts: dict, n: int, numel: int, server: int, seed: int = 0,
                dtype: str = "float32") -> None:
    want, start = _one_step(n, numel, server, seed, dtype), start_and_grads(n, numel, seed,
                                                                              dtype)[0]
    for rank, got in enumerate(facts["results"]):
        who = "the server" if rank == server else f"worker {rank}"
        # (a draw whose mean gradient is zero leaves the parameters where they were)
        expect(not (isinstance(got, torch.Tensor) and torch.equal(got, start))
               or torch.equal(want, start),
               f"N={n}, server rank {server}: the parameters on {who} never changed in the "
               "step: update the caller's params in place (sgd_update, copy_, recv into it; "
               "a new tensor bound to the name params is lost when the function returns), and "
               "send them after the update")
        expect_close(got, want, f"N={n}, server rank {server}, {dtype}: parameters on {who} "
                                "after the step" + (" (kept to float64's precision: make "
                                "buffers with the parameters' dtype)" if tolerance(dtype) else ""),
                     *tolerance(dtype))


def _steps(side: str, setups: list[tuple]) -> Case:
    """compute and judge for one step on each (N, server) of ``setups``, or (N, server,
    dtype)."""
    typed = [(run[0], run[1], run[2] if len(run) > 2 else "float32") for run in setups]

    def compute(impl: Impl) -> list:
        return [_run_step(impl, side, n, 10, server, dtype=dtype) for n, server, dtype in typed]

    def judge(runs: list) -> None:
        for facts, (n, server, dtype) in zip(runs, typed):
            _judge_step(facts, n, 10, server, dtype=dtype)
    return compute, judge


def _worker_traffic(facts: dict) -> None:
    n, numel, server = 4, 100, 3
    _judge_step(facts, n, numel, server)
    size = bytes_of(numel)
    for rank in range(n - 1):
        expect_waited(facts["works"][rank], f"worker {rank}")
        stats = facts["stats"][rank]
        expect(stats["sent_to"] == {server: size} and stats["messages_sent"] == 1
               and stats["bytes_received"] == size,
               f"worker {rank} should send one gradient ({size} bytes) to the server and "
               f"receive the parameters once; it sent {stats['sent_to']} (bytes per peer) "
               f"in {stats['messages_sent']} messages and received {stats['bytes_received']} "
               "bytes")


def _worker_grad_kept(facts: dict) -> None:
    """Feedback only: whether a worker changed the caller's gradient is seen only in its own
    process (the messages it sent were right either way)."""
    for rank, changed in enumerate(facts["grad_changed"]):
        expect(not changed,
               f"worker {rank} changed the gradient it was handed (grad is the caller's: it "
               "only travels to the server); receive the parameters into params")


def _judge_one_update(facts: dict, n: int, numel: int) -> None:
    """The server's parameters at each of its receives in one step: still the start's."""
    start = torch.linspace(-1, 1, numel)
    seen = facts["at_receive"]
    for k, record in enumerate(seen):
        expect(torch.equal(record["params"], start),
               f"when gradient {k + 1} of {n - 1} arrived, the server's parameters had already "
               "changed: it updated before every gradient of the step was in (with plain SGD "
               "the numbers come out the same, with momentum or Adam they would not); add "
               "the gradients up, then update once")


def _server_step_traffic(facts: dict) -> None:
    n, numel = 5, 100
    _judge_step(facts, n, numel, n - 1)
    _server_traffic(facts, n)
    expect_waited(facts["works"][n - 1], "the server")
    judge_sends_after_receives(facts["trace"], n - 1, n - 1, 1)


def _server_one_update(facts: dict) -> None:
    """Feedback only: what the server's parameters held at each receive, and its calls of
    ``sgd_update``, are seen inside its own process."""
    n, numel = 5, 100
    _judge_one_update(facts, n, numel)
    judge_updates(facts["updates"][n - 1], 1, "the server")


def judge_sends_after_receives(trace: dict, server: int, workers: int, steps: int) -> None:
    """From the grader's timeline: each step's parameters leave the server only once every
    gradient of that step has arrived."""
    events = [e for e in trace["events"] if e["device"] == server and e["stream"] == "comm"]
    recvs = sorted(e["end"] for e in events if e["kind"] == "recv")
    sends = sorted(e["start"] for e in events if e["kind"] == "send")
    for k, start in enumerate(sends):
        step = k // workers
        last = (step + 1) * workers - 1
        expect(last < len(recvs) and start >= recvs[last],
               f"step {step}: the server sent parameters to a worker before the "
               f"{workers} gradients of the step were all in (send {k % workers + 1} of the "
               "step started before the last gradient arrived): add the gradients up, "
               "update once, then send")


def judge_updates(calls: int, steps: int, who: str) -> None:
    """``who`` called ``sgd_update`` at most once per step (inlining it is allowed)."""
    expect(calls <= steps,
           f"{who} called sgd_update {calls} times in {steps} step(s): one update per step, "
           "on the mean of every gradient, once they are all in (with plain SGD several "
           "partial updates, even on a copy, come to the same numbers; with momentum or "
           "Adam they would not)")


def _server_traffic(facts: dict, n: int = 5, steps: int = 1) -> None:
    numel, server = 100, n - 1
    size = bytes_of(numel)
    stats = facts["stats"][server]
    want = {r: steps * size for r in range(n) if r != server}
    expect(stats["sent_to"] == want and stats["bytes_received"] == steps * (n - 1) * size,
           f"in {steps} step(s) the server should receive one gradient from each of the "
           f"{n - 1} workers per step and send each the parameters once per step ({size} "
           f"bytes each); it received {stats['bytes_received']} bytes and sent "
           f"{stats['sent_to']} (bytes per peer)")
    expect(stats["messages_sent"] == steps * (n - 1),
           f"the server sent {stats['messages_sent']} messages, expected one per worker per "
           f"step ({steps * (n - 1)})")


def _hidden_steps(side: str) -> Case:
    cases = examples(12, 2, world_size=(2, 6), numel=(1, 30), server=(0, 5), data=(0, 3))

    def compute(impl: Impl) -> list:
        def body(world_size: int, numel: int, server: int, data: int) -> dict:
            return _run_step(impl, side, world_size, numel, server % world_size, data)
        return compute_examples(body, cases)

    def judge(records: list) -> None:
        judge_examples(records, lambda out, world_size, numel, server, data: _judge_step(
            out, world_size, numel, server % world_size, data))
    return compute, judge
