"""Checks of exercise 4.4, the executor's forward step: the last stage's outputs against the
whole model on one device, one activation per microbatch to the next stage tagged
``message_tag(step)``, forward compute on the timeline, and a graph that reaches back to the
received activation."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.grading.checks import _support
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, expect_waited,
                                               forward_flops, launch_facts, run_spmd, uniform)
from mpgpu_edu.pipeline import Schedule, gpipe, steps_of
from mpgpu_edu.cluster.trace import Trace

Impl = Callable[..., Any]


WIDTH, ROWS = 8, 4


def _stages(n_stages: int) -> list[nn.Module]:
    torch.manual_seed(_support.secret_seed(4))
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(n_stages)]


def _batch(n_microbatches: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_support.secret_seed(5))
    return torch.randn(n_microbatches * ROWS, WIDTH, generator=generator)


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


def _forward_program(impl: Impl, stages: list[nn.Module], microbatches: list[Any],
                     schedule: Schedule) -> Callable[[Any], list[dict]]:
    """``stages``: one per rank; ``microbatches``: per rank, the first stage's microbatches
    (None on the others)."""
    def program(comm: Any) -> list[dict]:
        stage, p = copy.deepcopy(stages[comm.rank]), schedule.n_stages
        records = []
        for step in steps_of(schedule, comm.rank):
            if step.op != "F":
                continue
            x = microbatches[comm.rank][step.microbatch] if comm.rank == 0 else None
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
    firsts = [microbatches if r == 0 else None for r in range(n_stages)]
    stages = _stages(n_stages)
    result = run_spmd(_forward_program(impl, stages, firsts, schedule), uniform(n_stages),
                      hide=[stages, firsts])
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
        if rank < p - 1:
            tags, expected = [tag for _peer, tag, _n in facts["sends"][rank]], [2 * mb for mb
                                                                               in range(m)]
            expect(tags == expected,
                   f"rank {rank} tagged its activations for microbatches 0..{m - 1} {tags}; "
                   f"message_tag(step) gives {expected} (2 m for microbatch m's activation, "
                   "2 m + 1 for its gradient): a neighbour that receives with message_tag "
                   "would wait for ever, or take another microbatch's message")
    for rank, works in enumerate(facts["works"]):
        expect_waited(works, f"rank {rank}")


def _judge_timed(facts: dict) -> None:
    _judge_values(facts)  # regions of the right FLOPs around a forward that is right
    p, m, trace = facts["p"], facts["m"], Trace.from_dict(facts["trace"])
    microbatches = list(torch.tensor_split(_batch(m), m))
    for rank, stage in enumerate(_stages(p)):
        forwards = [e for e in trace.on(rank, "compute") if e.kind == "forward"]
        expect(len(forwards) == m, f"rank {rank} has {len(forwards)} forward compute events "
                                   f"on the timeline, expected {m}")
        want = sum(forward_flops(stage, mb) for mb in microbatches)  # counted by the grader
        got = sum(e.flops for e in forwards)
        expect(abs(got - want) <= 1e-6 * want,
               f"rank {rank}'s forward compute events add up to {got:.4g} FLOPs; the stage's "
               f"forward on its {m} microbatches is {want:.4g} FLOPs: run stage(x) inside "
               "comm.compute(\"forward\", ...)")


def _judge_backward_reaches_input(facts: dict) -> None:
    """Feedback only: the output's autograd graph is seen only inside the rank's process."""
    p, m = facts["p"], facts["m"]
    for rank in range(p):
        expect(all(r["graph"] for r in facts["results"][rank]),
               f"rank {rank}'s outputs are detached from the autograd graph: a backward step "
               "could not reach this stage's parameters")
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
