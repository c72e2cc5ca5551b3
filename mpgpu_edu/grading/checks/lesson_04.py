"""Checks of lesson 04: partition, GPipe and 1F1B schedules, the forward step, the executor.

Every case has two halves. *compute* runs the learner's function and hands back plain data:
boundaries, step orders as ``[stage, microbatch, op]`` triples, a pipeline run's outputs,
gradients, parameters and counts. *judge* rebuilds the package's reference from the example
alone (``partition_balanced``, ``gpipe``, ``one_f_one_b``, the whole model on one device) and
compares. The executor is held to one device's training step (loss, gradients and parameters
after SGD) on GPipe, 1F1B and a hand-made schedule, and to the schedule's memory: a wrapper
around each stage watches the tensors it hands out (``weakref.finalize``) and sees, at the start
of every backward, which microbatches the executor still keeps alive.
"""

from __future__ import annotations

import copy
import itertools
import random
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.grading.checks import Case, CheckFailure, Evidence
from mpgpu_edu.grading.checks._support import (bytes_of, compute_examples, examples, expect,
                                               expect_close, judge_examples, launch_facts,
                                               run_spmd, uniform)
from mpgpu_edu.pipeline import (LayerCost, Schedule, ScheduleError, Step, from_order, gpipe,
                                makespan_ticks, one_f_one_b, partition_balanced,
                                peak_activations, render, steps_of, validate)
from mpgpu_edu.trace import Trace

Impl = Callable[..., Any]


# ---- 4.1 partition ------------------------------------------------------------------------------

def _stage_costs(costs: list[int], boundaries: list[int]) -> list[int]:
    edges = [0, *boundaries, len(costs)]
    return [sum(costs[a:b]) for a, b in zip(edges, edges[1:])]


def _optimal_max(costs: list[int], n_stages: int) -> int:
    layers = [LayerCost(f"l{i}", n_params=c, flops=0) for i, c in enumerate(costs)]
    return max(stage.n_params for stage in partition_balanced(layers, n_stages).stages)


def _partition_one(impl: Impl, costs: list[int], n_stages: int) -> dict:
    given = list(costs)
    got = impl(given, n_stages)
    return {"got": got, "input_after": given}


def _judge_partition(out: dict, costs: list[int], n_stages: int) -> None:
    got, call = out["got"], f"balanced_boundaries({costs}, {n_stages})"
    expect(out["input_after"] == costs, f"{call} changed its input to {out['input_after']}")
    expect(isinstance(got, list) and len(got) == n_stages - 1,
           f"{call} returned {got!r}; expected a list of {n_stages - 1} boundaries")
    expect(all(type(b) is int for b in got) and all(0 < b < len(costs) for b in got)
           and all(a < b for a, b in zip(got, got[1:])),
           f"{call} returned {got}: boundaries increase strictly and lie in "
           f"1..{len(costs) - 1}, so every stage holds at least one layer")
    best, mine = _optimal_max(costs, n_stages), max(_stage_costs(costs, got))
    expect(mine == best, f"{call} returned {got}: stage costs {_stage_costs(costs, got)}, "
                         f"largest {mine}; the best split has largest stage {best}")


def _partition_case(cases: list[tuple[list[int], int]]) -> tuple[Callable, Callable]:
    listed = [{"costs": costs, "n_stages": n} for costs, n in cases]
    return (lambda impl: compute_examples(lambda **e: _partition_one(impl, **e), listed),
            lambda records: judge_examples(records, _judge_partition))


def _compute_bad(impl: Impl) -> list[dict]:
    records = []
    for costs, n_stages in [([1, 2, 3], 4), ([1, 2], 0)]:
        try:
            got = impl(list(costs), n_stages)
        except ValueError:
            got = "raised ValueError"
        records.append({"costs": costs, "n_stages": n_stages, "got": got})
    return records


def _judge_bad(records: list[dict]) -> None:
    for r in records:
        expect(r["got"] == "raised ValueError",
               f"balanced_boundaries({r['costs']}, {r['n_stages']}) returned {r['got']!r}; it "
               "should raise ValueError (each stage needs at least one layer)")


def _random_costs(n_layers: int, draw: int) -> list[int]:
    rng = random.Random(draw)
    return [rng.randint(0, 20) for _ in range(n_layers)]


def _compute_partition_hidden(impl: Impl) -> list[dict]:
    def body(n_layers: int, n_stages: int, draw: int) -> dict:
        return _partition_one(impl, _random_costs(n_layers, draw), min(n_stages, n_layers))
    return compute_examples(body, examples(40, seed=41, n_layers=(1, 9), n_stages=(1, 5),
                                           draw=(0, 10_000)))


def _judge_partition_hidden(records: list[dict]) -> None:
    def one(out: dict, n_layers: int, n_stages: int, draw: int) -> None:
        _judge_partition(out, _random_costs(n_layers, draw), min(n_stages, n_layers))
    judge_examples(records, one)


# ---- 4.2 / 4.3 schedules ----------------------------------------------------------------------

def _orders_data(got: Any) -> Any:
    """The learner's orders as plain data: rows of [stage, microbatch, op] (a Step) or the
    type name of anything else. A returned Schedule is read row by row."""
    if isinstance(got, Schedule):
        got = [steps_of(got, d) for d in range(got.n_stages)]
    if not isinstance(got, (list, tuple)):
        return type(got).__name__
    rows = []
    for row in got:
        if not isinstance(row, (list, tuple)):
            return type(row).__name__
        rows.append([[int(s.stage), int(s.microbatch), str(s.op)] if isinstance(s, Step)
                     else repr(s) for s in row])
    return rows


def _compute_orders(impl: Impl, sizes: list[tuple[int, int]]) -> list[dict]:
    return [{"p": p, "m": m, "orders": _orders_data(impl(p, m))} for p, m in sizes]


def _schedule(data: dict, name: str, function: str) -> Schedule:
    p, m, rows = data["p"], data["m"], data["orders"]
    call = f"{function}({p}, {m})"
    expect(isinstance(rows, list) and len(rows) == p,
           f"{call} should return one list of Steps per device ({p} lists), got {rows!r:.80}")
    for device, row in enumerate(rows):
        for item in row:
            expect(isinstance(item, list), f"{call}: device {device}'s order holds {item}, "
                                           "not a Step")
    orders = [[Step(s, mb, op) for s, mb, op in row] for row in rows]
    try:
        schedule = from_order(name, orders, m)
        validate(schedule)
    except ScheduleError as exc:
        raise CheckFailure(f"{call} is not a valid schedule: {exc}") from None
    return schedule


def _valid_judge(name: str, function: str) -> Callable[[list[dict]], Evidence]:
    def judge(records: list[dict]) -> Evidence:
        return Evidence(text="\n\n".join(render(_schedule(r, name, function)) for r in records))
    return judge


def _same_judge(reference: Callable[[int, int], Schedule], name: str, function: str
                ) -> Callable[[list[dict]], None]:
    def judge(records: list[dict]) -> None:
        for r in records:
            got, want = _schedule(r, name, function), reference(r["p"], r["m"])
            if [steps_of(got, d) for d in range(r["p"])] != [steps_of(want, d)
                                                             for d in range(r["p"])]:
                raise CheckFailure(f"{r['p']} stages, {r['m']} microbatches: the step order "
                                   f"differs from {want.name}'s\nyours:\n{render(got)}\n\n"
                                   f"expected:\n{render(want)}")
    return judge


MAKESPAN_SIZES = [(2, 3), (4, 4), (4, 8), (3, 1)]


def _makespan_judge(name: str, function: str) -> Callable[[list[dict]], None]:
    def judge(records: list[dict]) -> None:
        for r in records:
            p, m = r["p"], r["m"]
            ticks = makespan_ticks(_schedule(r, name, function))
            expect(ticks == 2 * (m + p - 1), f"{p} stages, {m} microbatches: your schedule "
                                             f"takes {ticks} ticks, expected 2(M+P-1) = "
                                             f"{2 * (m + p - 1)}")
    return judge


def _gpipe_ticks_memory(records: list[dict]) -> None:
    _makespan_judge("gpipe", "gpipe_orders")(records[:len(MAKESPAN_SIZES)])
    for r in records[len(MAKESPAN_SIZES):]:
        peaks = peak_activations(_schedule(r, "gpipe", "gpipe_orders"))
        expect(peaks[0] == r["m"], f"GPipe's stage 0 holds all M = {r['m']} microbatches "
                                   f"before its first backward; yours peaks at {peaks[0]}")


def _one_f_one_b_memory(records: list[dict]) -> None:
    for r in records:
        p, m = r["p"], r["m"]
        schedule = _schedule(r, "1f1b", "one_f_one_b_orders")
        peaks, bounds = peak_activations(schedule), [min(p - s, m) for s in range(p)]
        expect(all(a <= b for a, b in zip(peaks, bounds)),
               f"{p} stages, {m} microbatches: stages hold {peaks} microbatches' activations "
               f"at most; 1F1B holds at most min(P-p, M) = {bounds}\n{render(schedule)}")


def _hidden_orders(impl: Impl) -> list[dict]:
    return compute_examples(lambda p, m: _orders_data(impl(p, m)),
                            examples(30, seed=43, p=(1, 6), m=(1, 9)))


def _hidden_orders_judge(reference: Callable[[int, int], Schedule], name: str,
                         function: str) -> Callable[[list[dict]], None]:
    same = _same_judge(reference, name, function)

    def one(out: Any, p: int, m: int) -> None:
        same([{"p": p, "m": m, "orders": out}])
    return lambda records: judge_examples(records, one)


# ---- 4.4 the executor's forward step ------------------------------------------------------

WIDTH, ROWS = 8, 4


def _stages(n_stages: int) -> list[nn.Module]:
    torch.manual_seed(4)
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(n_stages)]


def _batch(n_microbatches: int) -> torch.Tensor:
    return torch.randn(n_microbatches * ROWS, WIDTH, generator=torch.Generator().manual_seed(5))


def _cotangent(shape: tuple[int, ...], microbatch: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(100 + microbatch))


def _input_leaf(output: torch.Tensor, stage: nn.Module, shape: tuple[int, ...]
                ) -> torch.Tensor | None:
    """The leaf of ``output``'s graph that is not a parameter and has ``shape``: the received
    activation, if the graph reaches it."""
    params, seen = {id(p) for p in stage.parameters()}, set()
    todo = [output.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        leaf = getattr(node, "variable", None)
        if leaf is not None and id(leaf) not in params and tuple(leaf.shape) == shape:
            return leaf
        todo += [child for child, _ in node.next_functions]
    return None


def _forward_program(impl: Impl, stages: list[nn.Module], microbatches: list[torch.Tensor],
                     schedule: Schedule) -> Callable[[Any], list[dict]]:
    def program(comm: Any) -> list[dict]:
        stage, p = copy.deepcopy(stages[comm.rank]), schedule.n_stages
        records = []
        for step in steps_of(schedule, comm.rank):
            if step.op != "F":
                continue
            x = microbatches[step.microbatch] if comm.rank == 0 else None
            y = impl(comm, stage, step, p, x, (ROWS, WIDTH))
            record = {"out": y, "graph": isinstance(y, torch.Tensor) and y.grad_fn is not None,
                      "leaf": None, "leaf_grad": None}
            leaf = _input_leaf(y, stage, (ROWS, WIDTH)) if record["graph"] else None
            if comm.rank > 0 and leaf is not None:
                grad, = torch.autograd.grad(y, leaf, _cotangent(y.shape, step.microbatch),
                                            allow_unused=True)
                record.update(leaf=leaf.detach(), leaf_grad=grad)
            records.append(record)
        return records
    return program


def _compute_forward(impl: Impl, n_stages: int, n_microbatches: int) -> dict:
    schedule = gpipe(n_stages, n_microbatches)
    microbatches = list(torch.tensor_split(_batch(n_microbatches), n_microbatches))
    result = run_spmd(_forward_program(impl, _stages(n_stages), microbatches, schedule),
                      uniform(n_stages))
    return dict(launch_facts(result, with_trace=True), p=n_stages, m=n_microbatches)


def _judge_values(facts: dict) -> None:
    p, m = facts["p"], facts["m"]
    last = facts["results"][-1]
    expect(isinstance(last, list) and all(isinstance(r["out"], torch.Tensor) for r in last),
           "pipeline_forward_step should return the stage's output tensor")
    with torch.no_grad():
        want = nn.Sequential(*_stages(p))(_batch(m))
    expect_close(torch.cat([r["out"] for r in last]), want,
                 f"{p} stages, {m} microbatches: the last stage's outputs against the whole "
                 "model on one device")


def _judge_values_all(runs: list[dict]) -> None:
    for facts in runs:
        _judge_values(facts)


def _judge_traffic(facts: dict) -> None:
    p, m, size = facts["p"], facts["m"], bytes_of(ROWS * WIDTH)
    for rank, stats in enumerate(facts["stats"]):
        want = {rank + 1: m * size} if rank < p - 1 else {}
        expect(stats["sent_to"] == want and stats["messages_sent"] == len(want) * m,
               f"rank {rank} sent {stats['sent_to']} (bytes per peer) in "
               f"{stats['messages_sent']} messages; expected {want}: one activation per "
               "microbatch, to the next stage only")


def _judge_timed(facts: dict) -> None:
    p, m, trace = facts["p"], facts["m"], Trace.from_dict(facts["trace"])
    for rank in range(p):
        forwards = [e for e in trace.on(rank, "compute") if e.kind == "forward"]
        expect(len(forwards) == m, f"rank {rank} has {len(forwards)} forward compute events "
                                   f"on the timeline, expected {m}")
        expect(all(r["graph"] for r in facts["results"][rank]),
               f"rank {rank}'s outputs are detached from the autograd graph: a backward step "
               "could not reach this stage's parameters")


def _judge_backward_reaches_input(facts: dict) -> None:
    p, m = facts["p"], facts["m"]
    stages, microbatches = _stages(p), torch.tensor_split(_batch(m), m)
    for rank in range(1, p):
        for mb, record in enumerate(facts["results"][rank]):
            where = f"stage {rank}, microbatch {mb}"
            expect(record["leaf"] is not None,
                   f"{where}: backward through the stage's output stops inside the stage; it "
                   f"never reaches the activation received from stage {rank - 1}, so the "
                   f"gradient stage {rank - 1} waits for cannot be computed")
            with torch.no_grad():
                sent = nn.Sequential(*stages[:rank])(microbatches[mb])
            expect_close(record["leaf"], sent, f"{where}: the tensor the output's graph starts "
                                               f"from, against what stage {rank - 1} sent")
            x = sent.clone().requires_grad_()
            y = stages[rank](x)
            want, = torch.autograd.grad(y, x, _cotangent(y.shape, mb))
            expect_close(record["leaf_grad"], want,
                         f"{where}: the gradient of the received activation")


# ---- 4.5 the executor -------------------------------------------------------------------------

LR = 0.1
MODELS = {  # the widths of Linear layers with a Tanh between each two
    "mlp": (6, 10, 12, 8, 9, 3),  # 9 layers to split
    "hourglass": (4, 16, 3, 12, 5, 7, 2),  # 11 layers, widths up and down
}


def _layers(widths: tuple[int, ...], seed: int) -> list[nn.Module]:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    return layers


def _split(n_stages: int, partition: str, seed: int, model: str = "mlp"
           ) -> tuple[list[nn.Sequential], list[int]]:
    """The model's stages and the width entering each: "balanced" by parameters, or cuts
    drawn at random (any contiguous split, stage 0 always starts with a Linear)."""
    layers = _layers(MODELS[model], seed)
    if partition == "balanced":
        names = partition_balanced(nn.Sequential(*layers), n_stages).stages
        cuts = [int(stage.layers[0]) for stage in names[1:]]
    else:
        cuts = sorted(random.Random(seed).sample(range(1, len(layers)), n_stages - 1))
    edges = [0, *cuts, len(layers)]
    stages = [nn.Sequential(*layers[a:b]) for a, b in zip(edges, edges[1:])]
    widths_in, width = [], MODELS[model][0]
    for stage in stages:
        widths_in.append(width)
        width = next((l.out_features for l in reversed(stage) if isinstance(l, nn.Linear)),
                     width)
    return stages, widths_in


def _data(batch: int, n_mbs: int, seed: int, model: str = "mlp"
          ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g, widths = torch.Generator().manual_seed(seed), MODELS[model]
    x, y = torch.randn(batch, widths[0], generator=g), torch.randn(batch, widths[-1], generator=g)
    return list(torch.tensor_split(x, n_mbs)), list(torch.tensor_split(y, n_mbs))


def _named_schedule(name: str, p: int, m: int) -> Schedule:
    if name == "gpipe":
        return gpipe(p, m)
    if name == "1f1b":
        return one_f_one_b(p, m)
    # hand-made: all forwards, then the backwards last microbatch first
    orders = [[*(Step(s, i, "F") for i in range(m)), *(Step(s, i, "B") for i in reversed(range(m)))]
              for s in range(p)]
    return from_order("backwards-last-first", orders, m)


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
        ctx.counter.events.append(["B", ctx.call, sorted(set(ctx.counter.alive.values()))])
        return grad, None, None


class _Counted(nn.Module):
    """The stage as the learner gets it: counts forwards and backwards, and watches the
    tensors each forward hands out (its output and, on a later stage, the received input)
    with ``weakref.finalize``, so that at the start of every backward it knows which
    forwards' tensors the executor still keeps alive."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.forwards = self.backwards = 0
        self.events: list[list] = []  # ["F", call] and ["B", call, [calls still alive]]
        self.alive: dict[int, int] = {}  # watch number -> forward call
        self._keys = itertools.count()

    def _watch(self, tensor: torch.Tensor, call: int) -> None:
        key = next(self._keys)
        self.alive[key] = call
        weakref.finalize(tensor, self.alive.pop, key, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        call = self.forwards
        self.forwards += 1
        self.events.append(["F", call])
        y = self.inner(x)
        if not y.requires_grad:
            return y
        out = _Release.apply(y, self, call)
        self._watch(out, call)
        if x.requires_grad:  # a received activation (the caller's microbatches never are)
            self._watch(x, call)
        return out


def _executor_program(impl: Impl, stages: list[nn.Sequential], widths_in: list[int],
                      schedule: Schedule, data: tuple[list, list],
                      seconds: tuple[float, float] | None) -> Callable[[Any], dict]:
    def program(comm: Any) -> dict:
        p, rank, (xs, ys) = schedule.n_stages, comm.rank, data
        stage = _Counted(copy.deepcopy(stages[rank]))
        shapes = [(len(x), widths_in[rank]) for x in xs] if rank > 0 else None
        loss = impl(comm, schedule, stage, xs if rank == 0 else None,
                    ys if rank == p - 1 else None, shapes, nn.functional.mse_loss, seconds)
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
    data = _data(batch or 2 * m, m, seed, model)
    program = _executor_program(impl, stages, widths_in, _named_schedule(schedule, p, m), data,
                                seconds)
    return launch_facts(run_spmd(program, uniform(p), timeout=45.0), with_trace=bool(seconds))


def _reference_step(p: int, m: int, partition: str, batch: int, seed: int, model: str
                    ) -> dict:
    """One device: the same stages in a row, gradients accumulated over the same
    microbatches, loss the mean over microbatches; then one SGD step."""
    stages, _ = _split(p, partition, seed, model)
    xs, ys = _data(batch or 2 * m, m, seed, model)
    loss = 0.0
    for x, y in zip(xs, ys):
        part = nn.functional.mse_loss(nn.Sequential(*stages)(x), y) / m
        part.backward()
        loss += part.item()
    grads = [{n: w.grad.clone() for n, w in s.named_parameters()} for s in stages]
    with torch.no_grad():
        for w in nn.Sequential(*stages).parameters():
            w -= LR * w.grad
    return {"loss": loss, "grads": grads,
            "params": [{n: w.detach() for n, w in s.named_parameters()} for s in stages]}


def _judge_step(facts: dict, p: int, m: int, schedule: str, partition: str = "balanced",
                batch: int = 0, seed: int = 0, model: str = "mlp") -> None:
    want = _reference_step(p, m, partition, batch, seed, model)
    where = f"{schedule}, {p} stages, {m} microbatches"
    results = facts["results"]
    loss = results[-1]["loss"]
    expect(isinstance(loss, (float, int, torch.Tensor)) and not isinstance(loss, bool),
           f"{where}: the last stage returned {loss!r} as the loss, expected a number")
    expect_close(torch.as_tensor(float(loss)), torch.tensor(want["loss"]),
                 f"{where}: the loss returned by the last stage (the mean over microbatches)")
    for rank in range(p):
        expect(results[rank]["loss"] is None or rank == p - 1,
               f"{where}: stage {rank} returned {results[rank]['loss']!r}; only the last "
               "stage has a loss (the others return None)")
        for name, grad in want["grads"][rank].items():
            got = results[rank]["grads"].get(name)
            expect(got is not None, f"{where}: stage {rank}'s {name} has no gradient after "
                                    "the step: backward never reached it")
            expect_close(got, grad, f"{where}: stage {rank}'s {name}.grad against one device "
                                    "(loss: mean over microbatches)")
            expect_close(results[rank]["params"][name], want["params"][rank][name],
                         f"{where}: stage {rank}'s {name} after one SGD step")


def _judge_runs(runs: list[tuple[dict, dict]]) -> None:
    for facts, example in runs:
        _judge_step(facts, **example)


def _runs(examples_: list[dict], seconds: tuple[float, float] | None = None
          ) -> Callable[[Impl], list]:
    return lambda impl: [[_run_executor(impl, seconds=seconds, **e), e] for e in examples_]


STEP_GPIPE = [{"p": 3, "m": 4, "schedule": "gpipe"}, {"p": 2, "m": 1, "schedule": "gpipe"}]
STEP_1F1B = [{"p": 3, "m": 4, "schedule": "1f1b"}, {"p": 4, "m": 6, "schedule": "1f1b"}]
STEP_OTHER = [{"p": 3, "m": 3, "schedule": "backwards-last-first"}]
IN_FLIGHT = [{"p": 4, "m": 6, "schedule": "gpipe"}, {"p": 4, "m": 6, "schedule": "1f1b"},
             {"p": 3, "m": 2, "schedule": "1f1b"}]
SECONDS = (0.002, 0.004)


def _kept_alive(events: list, schedule: Schedule, rank: int, where: str) -> int:
    """Replay one stage's forward/backward events. At the start of each backward the executor
    may keep alive the microbatches in flight (forward run, backward not begun) and, for a
    moment, the one whose backward came just before (a local variable may still name it),
    nothing older. Returns the most microbatches kept alive at once, that lingering one
    aside."""
    mbs = [s.microbatch for s in steps_of(schedule, rank) if s.op == "F"]
    name = (lambda call: mbs[call] if call < len(mbs) else f"#{call}")  # noqa: E731
    started, backed, previous, peak = set(), set(), None, 0
    for event in events:
        if event[0] == "F":
            started.add(event[1])
            continue
        _, call, alive = event
        in_flight = started - backed
        stale = sorted(set(alive) - in_flight - {previous})
        if stale:
            raise CheckFailure(f"{where}: at the start of B({name(call)}) stage {rank} still "
                               f"keeps microbatch {name(stale[0])}'s input or output alive, "
                               f"after B({name(stale[0])}) has run (and another backward "
                               "since)")
        peak = max(peak, len(set(alive) - {previous}))
        backed.add(call)
        previous = call
    return peak


def _judge_in_flight(runs: list) -> None:
    for facts, e in runs:
        schedule = _named_schedule(e["schedule"], e["p"], e["m"])
        want = peak_activations(schedule)
        where = f"{e['schedule']}, {e['p']} stages, {e['m']} microbatches"
        for rank, r in enumerate(facts["results"]):
            expect(r["forwards"] == e["m"] and r["backwards"] == e["m"],
                   f"{where}: stage {rank} ran its forward {r['forwards']} times and its "
                   f"backward {r['backwards']} times; the schedule has {e['m']} of each")
            peak = _kept_alive(r["events"], schedule, rank, where)
            expect(peak == want[rank],
                   f"{where}: stage {rank} kept up to {peak} microbatches' tensors alive at "
                   f"once; the schedule has {want[rank]} in flight there (all stages: {want})")


def _judge_traffic_both(runs: list) -> None:
    for facts, e in runs:
        p, m, where = e["p"], e["m"], f"{e['schedule']}, {e['p']} stages, {e['m']} microbatches"
        _, widths_in = _split(p, "balanced", 0)
        rows = [len(x) for x in _data(2 * m, m, 0)[0]]
        for rank, stats in enumerate(facts["stats"]):
            want = {}
            if rank < p - 1:
                want[rank + 1] = sum(bytes_of(r * widths_in[rank + 1]) for r in rows)
            if rank > 0:
                want[rank - 1] = sum(bytes_of(r * widths_in[rank]) for r in rows)
            expect(stats["sent_to"] == want and stats["messages_sent"] == len(want) * m,
                   f"{where}: stage {rank} sent {stats['sent_to']} (bytes per stage) in "
                   f"{stats['messages_sent']} messages; expected {want}: per microbatch one "
                   "activation to the next stage and one gradient to the previous one")


def _judge_timed_executor(runs: list) -> None:
    for facts, e in runs:
        trace = Trace.from_dict(facts["trace"])
        for rank in range(e["p"]):
            for kind, seconds in zip(("forward", "backward"), SECONDS):
                events = [ev for ev in trace.on(rank, "compute") if ev.kind == kind]
                expect(len(events) == e["m"] and all(abs(ev.duration - seconds) < 1e-9
                                                     for ev in events),
                       f"{e['schedule']}: stage {rank} has {len(events)} {kind} compute "
                       f"events, expected {e['m']} of {seconds * 1e3:g} ms each "
                       "(stage_seconds)")


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
         "schedule": ("gpipe", "1f1b")[i % 2], "partition": ("random", "balanced")[i % 3 > 0],
         "batch": 2 * (d["m"] + 1) + d["extra_rows"], "seed": d["seed_"],
         "model": ("mlp", "hourglass")[i % 2]}
        for i, d in enumerate(drawn)]

    def body(**example: Any) -> dict:
        facts = _run_executor(impl, **example)
        return {"results": facts["results"]}
    return compute_examples(body, cases)


def _judge_hidden_executor(records: list[dict]) -> None:
    def one(out: dict, **example: Any) -> None:
        _judge_step(out, **example)
        schedule = _named_schedule(example["schedule"], example["p"], example["m"])
        peaks = peak_activations(schedule)
        got = [_kept_alive(r["events"], schedule, rank, "memory")
               for rank, r in enumerate(out["results"])]
        expect(got == peaks, f"microbatches kept alive at once per stage {got}, the "
                             f"schedule's {peaks}")
    judge_examples(records, one)


# ---- the cases ----------------------------------------------------------------------------------

def _orders_case(sizes: list[tuple[int, int]]) -> Callable[[Impl], list[dict]]:
    return lambda impl: _compute_orders(impl, sizes)


CASES: dict[str, list[Case]] = {
    "4.1": [
        Case("the docstring's example", 1, *_partition_case([([3, 1, 1, 1, 2], 2)])),
        Case("the best split, uneven layers", 1,
             *_partition_case([([5, 1, 1, 1, 1, 1], 2), ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3),
                               ([4, 4, 4], 3), ([7, 2], 1), ([0, 0, 9, 0], 2)])),
        Case("too many or too few stages raise ValueError", 1, _compute_bad, _judge_bad),
        Case("hidden: random costs", 1, _compute_partition_hidden, _judge_partition_hidden,
             hidden=True),
    ],
    "4.2": [
        Case("a valid schedule", 1, _orders_case([(2, 2), (4, 3)]),
             _valid_judge("gpipe", "gpipe_orders")),
        Case("the GPipe order", 1, _orders_case([(3, 4), (1, 2), (4, 1)]),
             _same_judge(gpipe, "gpipe", "gpipe_orders")),
        Case("2(M+P-1) ticks; stage 0 holds M microbatches", 1,
             _orders_case(MAKESPAN_SIZES + [(4, 6), (2, 3)]), _gpipe_ticks_memory),
        Case("hidden: random sizes", 1, _hidden_orders,
             _hidden_orders_judge(gpipe, "gpipe", "gpipe_orders"), hidden=True),
    ],
    "4.3": [
        Case("a valid schedule", 1, _orders_case([(2, 2), (4, 6)]),
             _valid_judge("1f1b", "one_f_one_b_orders")),
        Case("as fast as GPipe: 2(M+P-1) ticks", 1, _orders_case(MAKESPAN_SIZES),
             _makespan_judge("1f1b", "one_f_one_b_orders")),
        Case("memory: stage p holds at most min(P-p, M) microbatches", 1,
             _orders_case([(4, 8), (4, 2), (3, 5), (5, 12)]), _one_f_one_b_memory),
        Case("the 1F1B order", 1, _orders_case([(4, 6), (3, 2), (1, 3)]),
             _same_judge(one_f_one_b, "1f1b", "one_f_one_b_orders")),
        Case("hidden: random sizes", 1, _hidden_orders,
             _hidden_orders_judge(one_f_one_b, "1f1b", "one_f_one_b_orders"), hidden=True),
    ],
    "4.4": [
        Case("matches the whole model on one device", 1,
             lambda impl: [_compute_forward(impl, 3, 4), _compute_forward(impl, 1, 2)],
             _judge_values_all),
        Case("traffic: one activation per microbatch, to the next stage", 1,
             lambda impl: _compute_forward(impl, 3, 4), _judge_traffic),
        Case("timed as forward compute; output keeps its graph", 1,
             lambda impl: _compute_forward(impl, 2, 3), _judge_timed),
        Case("backward reaches the received activation (its gradient goes back)", 1,
             lambda impl: _compute_forward(impl, 3, 2), _judge_backward_reaches_input),
    ],
    "4.5": [
        Case("GPipe: loss, gradients and parameters after a step equal one device's", 4,
             _runs(STEP_GPIPE), _judge_runs, timeout_s=60),
        Case("1F1B from the same executor: equal to one device", 3, _runs(STEP_1F1B),
             _judge_runs, timeout_s=60),
        Case("any schedule: a hand-made order (backwards last microbatch first)", 2,
             _runs(STEP_OTHER), _judge_runs, timeout_s=60),
        Case("traffic: per microbatch one activation forward, one gradient back", 2,
             _runs(STEP_1F1B[:1]), _judge_traffic_both, timeout_s=60),
        Case("memory: what each stage keeps alive matches the schedule (1F1B <= P)", 3,
             _runs(IN_FLIGHT), _judge_in_flight, timeout_s=60),
        Case("timed: M forwards and M backwards per stage at stage_seconds", 1,
             _runs(STEP_GPIPE[:1] + STEP_1F1B[:1], seconds=SECONDS), _judge_timed_executor,
             timeout_s=60),
        Case("hidden: 2-5 stages, M not a multiple of P, uneven microbatches, other splits", 3,
             _hidden_executor, _judge_hidden_executor, hidden=True, timeout_s=120),
    ],
}
