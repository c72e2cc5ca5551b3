"""Checks of lesson 02: the parameter server's worker, its server (one step and the whole
loop), and a server sharded over every rank.

*compute* runs the learner's side on the simulator against the reference of the other side
(``_reference_worker``, ``_reference_server``) and hands over plain facts: each rank's
parameters, its traffic, and where asked the timeline. *judge* rebuilds the expected values
from the same seeds with the grader's own arithmetic: one SGD step on the mean gradient, or
plain training on one device for the cases that train a small model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._support import (bytes_of, compute_examples, examples, expect,
                                               expect_close, from_scratch, judge_examples,
                                               launch_facts, rank_inputs, run_spmd)

Impl = Callable[..., Any]
LR = 0.1
SAMPLES = 3  # samples per worker in the training cases
MODELS = {"linear": (5, 2), "mlp": (4, 6, 3)}


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


def _one_step(n: int, numel: int, server: int | None, seed: int) -> torch.Tensor:
    """Parameters after one SGD step on the mean gradient of the workers (``server`` is
    None: every rank is a worker)."""
    params = torch.linspace(-1, 1, numel)
    grads = rank_inputs(n, numel, seed)
    mean = torch.stack([g for r, g in enumerate(grads) if r != server]).mean(0)
    return params - LR * mean


# ---- one step, one side from the learner ---------------------------------------------------

def _run_step(impl: Impl, side: str, n: int, numel: int, server: int, seed: int = 0,
              with_trace: bool = False) -> dict:
    """One step with the learner's ``side`` ("worker", "server" or "loop": 2.3 for one step)
    against the reference of the other side."""
    params, grads = torch.linspace(-1, 1, numel), rank_inputs(n, numel, seed)

    def program(comm: Any) -> torch.Tensor:
        mine = params.clone()
        if comm.rank == server:
            if side == "server":
                impl(comm, mine, LR)
            elif side == "loop":
                impl(comm, mine, 1, LR)
            else:
                _reference_server(comm, mine, LR)
        elif side == "worker":
            impl(comm, mine, grads[comm.rank].clone(), server)
        else:
            _reference_worker(comm, mine, grads[comm.rank].clone(), server)
        return mine

    exercise = {"worker": "2.1", "server": "2.2", "loop": "2.3"}[side]
    with from_scratch(impl, exercise):
        return launch_facts(run_spmd(program, n), with_trace)


def _judge_step(facts: dict, n: int, numel: int, server: int, seed: int = 0) -> None:
    want = _one_step(n, numel, server, seed)
    for rank, got in enumerate(facts["results"]):
        who = "the server" if rank == server else f"worker {rank}"
        expect_close(got, want, f"N={n}, server rank {server}: parameters on {who} after the "
                                "step")


def _steps(side: str, setups: list[tuple[int, int]]) -> Case:
    """compute and judge for one step on each (N, server) of ``setups``."""
    def compute(impl: Impl) -> list:
        return [_run_step(impl, side, n, 10, server) for n, server in setups]

    def judge(runs: list) -> None:
        for facts, (n, server) in zip(runs, setups):
            _judge_step(facts, n, 10, server)
    return compute, judge


def _worker_traffic(facts: dict) -> None:
    n, numel, server = 4, 100, 3
    _judge_step(facts, n, numel, server)
    size = bytes_of(numel)
    for rank in range(n - 1):
        stats = facts["stats"][rank]
        expect(stats["sent_to"] == {server: size} and stats["messages_sent"] == 1
               and stats["bytes_received"] == size,
               f"worker {rank} should send one gradient ({size} bytes) to the server and "
               f"receive the parameters once; it sent {stats['sent_to']} (bytes per peer) "
               f"in {stats['messages_sent']} messages and received {stats['bytes_received']} "
               "bytes")


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


# ---- training a small model: the learner's side against one device ---------------------------

def _model(name: str, seed: int) -> nn.Module:
    torch.manual_seed(1000 + seed)
    sizes = MODELS[name]
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def _batch(name: str, step: int, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(97 * seed + step)
    sizes = MODELS[name]
    return (torch.randn(samples, sizes[0], generator=generator),
            torch.randn(samples, sizes[-1], generator=generator))


def _flat_grad(name: str, seed: int, flat: torch.Tensor, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """Gradient of the mean squared error on (x, y) at the flat parameters ``flat``."""
    model = _model(name, seed)
    nn.utils.vector_to_parameters(flat.detach().clone(), model.parameters())
    nn.functional.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _single_device(name: str, steps: int, n_workers: int, seed: int) -> torch.Tensor:
    flat = nn.utils.parameters_to_vector(_model(name, seed).parameters()).detach()
    for step in range(steps):
        x, y = _batch(name, step, SAMPLES * n_workers, seed)
        flat = flat - LR * _flat_grad(name, seed, flat, x, y)
    return flat


def _train(impl: Impl, exercise: str, n: int, name: str, steps: int, seed: int) -> dict:
    """Train model ``name`` for ``steps`` steps with the learner's exercise: 2.1 (workers,
    reference server), 2.3 (server loop, reference workers), 2.4 (every rank)."""
    start = nn.utils.parameters_to_vector(_model(name, seed).parameters()).detach()
    n_workers = n if exercise == "2.4" else n - 1
    server = None if exercise == "2.4" else n - 1

    def program(comm: Any) -> torch.Tensor:
        flat = start.clone()
        if comm.rank == server:
            if exercise == "2.3":
                impl(comm, flat, steps, LR)
            else:
                for _ in range(steps):
                    _reference_server(comm, flat, LR)
            return flat
        for step in range(steps):
            x, y = _batch(name, step, SAMPLES * n_workers, seed)
            mine = slice(SAMPLES * comm.rank, SAMPLES * (comm.rank + 1))
            grad = _flat_grad(name, seed, flat, x[mine], y[mine])
            if exercise == "2.4":
                impl(comm, flat, grad, LR)
            elif exercise == "2.1":
                impl(comm, flat, grad, server)
            else:
                _reference_worker(comm, flat, grad, server)
        return flat

    with from_scratch(impl, exercise):
        return launch_facts(run_spmd(program, n))


def _judge_training(facts: dict, n: int, name: str, steps: int, seed: int,
                    sharded: bool) -> None:
    want = _single_device(name, steps, n if sharded else n - 1, seed)
    for rank, got in enumerate(facts["results"]):
        expect_close(got, want, f"{name} model, N={n}, {steps} steps: rank {rank}'s "
                                "parameters against training on one device", rtol=1e-4,
                     atol=1e-5)


def _training(exercise: str, setups: list[tuple[int, str, int]], seed: int = 0) -> Case:
    sharded = exercise == "2.4"

    def compute(impl: Impl) -> list:
        return [_train(impl, exercise, n, name, steps, seed) for n, name, steps in setups]

    def judge(runs: list) -> None:
        for facts, (n, name, steps) in zip(runs, setups):
            _judge_training(facts, n, name, steps, seed, sharded)
    return compute, judge


def _hidden_training(exercise: str) -> Case:
    sharded = exercise == "2.4"
    low = 1 if sharded else 2
    cases = examples(8, 5, world_size=(low + 1, 6), model=(0, 1), steps=(1, 3), data=(0, 2))
    names = list(MODELS)

    def compute(impl: Impl) -> list:
        def body(world_size: int, model: int, steps: int, data: int) -> dict:
            return _train(impl, exercise, world_size, names[model], steps, data)
        return compute_examples(body, cases)

    def judge(records: list) -> None:
        judge_examples(records, lambda out, world_size, model, steps, data: _judge_training(
            out, world_size, names[model], steps, data, sharded))
    return compute, judge


# ---- 2.3: the server loop takes gradients as they arrive --------------------------------------

DELAYS = (3e-3, 1e-3, 2e-3)  # seconds of compute of workers 0, 1, 2: worker 0 is the slowest
UNEVEN_STEPS = 2


class _Ledger:
    """A rank's communicator that writes down, as plain data for the judge, the isend/irecv
    works it hands out and which were waited on, and (with ``watch``) a copy of the tensor
    ``watch`` each time a receive completes; everything else goes to the real one."""

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

    def summary(self) -> dict:
        unwaited = [what for i, what in enumerate(self.started) if i not in self.waited]
        return {"isend": self.started.count("isend"), "irecv": self.started.count("irecv"),
                "isend_unwaited": unwaited.count("isend"),
                "irecv_unwaited": unwaited.count("irecv"), "at_receive": self.at_receive}


def _judge_waits(works: dict, where: str) -> None:
    for kind in ("isend", "irecv"):
        left = works[f"{kind}_unwaited"]
        expect(left == 0,
               f"{where} started {works[kind]} {kind}(s) and returned without waiting on "
               f"{left} of them; until its work is waited on, an {kind}'s tensor may still "
               "be in flight (on gloo or NCCL it can be read or overwritten too early)")


def _uneven_workers(impl: Impl) -> dict:
    """compute: the learner's server loop for two steps against reference workers that need
    ``DELAYS`` seconds per gradient; the server's communicator is a ``_Ledger`` watching its
    parameters."""
    n, numel = len(DELAYS) + 1, 100
    params, grads = torch.linspace(-1, 1, numel), rank_inputs(n, numel, 1)
    ledgers: list[Any] = [None]

    def program(comm: Any) -> torch.Tensor:
        mine = params.clone()
        if comm.rank == n - 1:
            ledgers[0] = _Ledger(comm, watch=mine)
            impl(ledgers[0], mine, UNEVEN_STEPS, LR)
            return mine
        for _step in range(UNEVEN_STEPS):
            with comm.compute("backward", "gradient", seconds=DELAYS[comm.rank]):
                pass
            _reference_worker(comm, mine, grads[comm.rank].clone(), n - 1)
        return mine

    with from_scratch(impl, "2.3"):
        facts = launch_facts(run_spmd(program, n), with_trace=True)
    facts["works"] = ledgers[0].summary()
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


def _judge_no_early_update(facts: dict) -> None:
    """The server's parameters, each time one of its receives completed, against the
    parameters every worker started the step from."""
    n, numel = len(DELAYS) + 1, 100
    start, grads = torch.linspace(-1, 1, numel), rank_inputs(n, numel, 1)
    mean = torch.stack(grads[: n - 1]).mean(0)
    seen = facts["works"]["at_receive"]
    expect(len(seen) == UNEVEN_STEPS * (n - 1),
           f"in {UNEVEN_STEPS} steps with {n - 1} workers the server should complete "
           f"{UNEVEN_STEPS * (n - 1)} receives; it completed {len(seen)}")
    for i, record in enumerate(seen):
        step, k = divmod(i, n - 1)
        want = start - step * LR * mean
        who = "" if record["src"] is None else f" (from worker {record['src']})"
        expect_close(record["params"], want,
                     f"step {step}: when gradient {k + 1} of {n - 1}{who} arrived, the "
                     "server's parameters were no longer those the workers computed this "
                     "step's gradients at: they changed before every gradient of the step "
                     "was in")


# ---- 2.4: every rank a worker and the server of one shard ------------------------------------

def _run_sharded(impl: Impl, n: int, numel: int, seed: int = 0,
                 ledger: bool = False) -> dict:
    """compute: the learner's sharded step on every rank (with ``ledger``, each rank's
    communicator a ``_Ledger``: its works, started and waited, go to the judge)."""
    params, grads = torch.linspace(-1, 1, numel), rank_inputs(n, numel, seed)
    ledgers: list[Any] = [None] * n

    def program(comm: Any) -> torch.Tensor:
        mine = params.clone()
        if ledger:
            comm = ledgers[comm.rank] = _Ledger(comm)
        impl(comm, mine, grads[comm.rank].clone(), LR)
        return mine

    with from_scratch(impl, "2.4"):
        facts = launch_facts(run_spmd(program, n))
    if ledger:
        facts["works"] = [one.summary() for one in ledgers]
    return facts


def _judge_sharded_waits(facts: dict, n: int, numel: int) -> None:
    _judge_sharded(facts, n, numel)
    for rank, works in enumerate(facts["works"]):
        _judge_waits(works, f"N={n}: rank {rank}")


def _judge_sharded(facts: dict, n: int, numel: int, seed: int = 0) -> None:
    want = _one_step(n, numel, None, seed)
    for rank, got in enumerate(facts["results"]):
        expect_close(got, want, f"N={n}, {numel} parameters: rank {rank}'s parameters after "
                                "the step")
    sizes = [len(piece) for piece in torch.tensor_split(torch.arange(numel), n)]
    for rank, stats in enumerate(facts["stats"]):
        want_sent = {k: bytes_of(sizes[k] + sizes[rank]) for k in range(n)
                     if k != rank and sizes[k] + sizes[rank] > 0}
        got_sent = {k: v for k, v in stats["sent_to"].items() if v}
        expect(got_sent == want_sent,
               f"N={n}, {numel} parameters (shards of {sizes} elements): rank {rank} should "
               f"send each rank k its gradient's shard k and its own updated shard "
               f"{rank}, {want_sent} bytes per peer; it sent {got_sent}")


def _hidden_sharded() -> Case:
    steps = examples(12, 3, world_size=(2, 6), numel=(1, 23), data=(0, 3))
    training = _hidden_training("2.4")

    def compute(impl: Impl) -> dict:
        def body(world_size: int, numel: int, data: int) -> dict:
            return _run_sharded(impl, world_size, numel, data)
        return {"steps": compute_examples(body, steps), "training": training[0](impl)}

    def judge(facts: dict) -> None:
        judge_examples(facts["steps"], lambda out, world_size, numel, data: _judge_sharded(
            out, world_size, numel, data))
        training[1](facts["training"])
    return compute, judge


CASES: dict[str, list[Case]] = {
    "2.1": [
        Case("sends the gradient, receives the new parameters", 1, *_steps("worker", [(3, 2)])),
        Case("the server need not be the last rank", 1, *_steps("worker", [(4, 0), (2, 1)])),
        Case("traffic: one message each way, with the server only", 1,
             lambda impl: _run_step(impl, "worker", 4, 100, 3), _worker_traffic),
        Case("hidden: random sizes and servers", 1, *_hidden_steps("worker"), hidden=True),
    ],
    "2.2": [
        Case("averages the workers' gradients and updates", 2, *_steps("server", [(4, 3)])),
        Case("any server rank, N = 2, 3, 5", 1, *_steps("server", [(2, 0), (3, 1), (5, 4)])),
        Case("traffic: (N-1) gradients in, (N-1) parameter copies out", 1,
             lambda impl: _run_step(impl, "server", 5, 100, 4),
             lambda facts: (_judge_step(facts, 5, 100, 4), _server_traffic(facts)) and None),
        Case("hidden: random sizes and servers", 1, *_hidden_steps("server"), hidden=True),
    ],
    "2.3": [
        Case("one step: the mean of every worker's gradient", 1, *_steps("loop", [(4, 3)])),
        Case("trains a linear model like one device, N = 3", 2,
             *_training("2.3", [(3, "linear", 4)])),
        Case("a fast worker's gradient is not held behind a slower one's", 1,
             _uneven_workers, _judge_uneven),
        Case("no update before every gradient of the step is in", 2,
             _uneven_workers, _judge_no_early_update),
        Case("waits: every isend and irecv is waited on", 1,
             _uneven_workers, lambda facts: _judge_waits(facts["works"], "the server")),
        Case("hidden: other world sizes, models and step counts", 2,
             *_hidden_training("2.3"), hidden=True),
    ],
    "2.4": [
        Case("one step, N = 4, 12 parameters", 2,
             lambda impl: _run_sharded(impl, 4, 12), lambda f: _judge_sharded(f, 4, 12)),
        Case("shards that differ in size: N = 3, 10 parameters", 2,
             lambda impl: _run_sharded(impl, 3, 10), lambda f: _judge_sharded(f, 3, 10)),
        Case("trains an MLP like one device, N = 4", 2, *_training("2.4", [(4, "mlp", 3)])),
        Case("waits: every isend and irecv is waited on, N = 3, 10 parameters", 1,
             lambda impl: _run_sharded(impl, 3, 10, ledger=True),
             lambda f: _judge_sharded_waits(f, 3, 10)),
        Case("hidden: other world sizes, models, sizes that do not divide", 3,
             *_hidden_sharded(), hidden=True),
    ],
}
