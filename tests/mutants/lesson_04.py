"""Plausible wrong answers for lesson 04 (see tests/mutants/__init__.py)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from mpgpu_edu.pipeline import Schedule, Step, recv_from, send_to, steps_of
from mpgpu_edu.pipeline.executor import message_tag

# ---- 4.1 ----------------------------------------------------------------------------------------


def equal_layer_counts(costs: list[float], n_stages: int) -> list[int]:
    """Not balanced: gives every stage the same number of layers, whatever they cost."""
    if not 1 <= n_stages <= len(costs):
        raise ValueError("bad stage count")
    return [round(i * len(costs) / n_stages) for i in range(1, n_stages)]


def greedy_fill(costs: list[float], n_stages: int) -> list[int]:
    """Greedy: closes a stage once it reaches the average cost, which is not always the best
    split (and can leave the last stages empty-handed)."""
    if not 1 <= n_stages <= len(costs):
        raise ValueError("bad stage count")
    share, boundaries, held = sum(costs) / n_stages, [], 0.0
    for i, cost in enumerate(costs):
        left = len(costs) - i
        if held > 0 and (held + cost > share or left <= n_stages - 1 - len(boundaries)) \
                and len(boundaries) < n_stages - 1:
            boundaries.append(i)
            held = 0.0
        held += cost
    while len(boundaries) < n_stages - 1:
        boundaries.append(len(costs) - (n_stages - 1 - len(boundaries)))
    return boundaries


def _fill(costs: list[float], limit: float) -> list[int]:
    """Greedy: a new stage whenever the next layer would take this one past ``limit``."""
    boundaries, held = [], 0.0
    for i, cost in enumerate(costs):
        if i > 0 and held + cost > limit:
            boundaries.append(i)
            held = 0.0
        held += cost
    return boundaries


def _split_off_singles(boundaries: list[int], costs: list[float], n_stages: int) -> list[int]:
    """More stages than the fill needed: split off single layers from the end."""
    boundaries = list(boundaries)
    for i in range(len(costs) - 1, 0, -1):
        if len(boundaries) < n_stages - 1 and i not in boundaries:
            boundaries.append(i)
    return sorted(boundaries)


def whole_number_limits(costs: list[float], n_stages: int) -> list[int]:
    """Binary search over whole-number limits for the largest stage, then a greedy fill: right
    for whole costs, but with costs in fractions of a millisecond the best limit lies between
    two whole numbers."""
    if not 1 <= n_stages <= len(costs):
        raise ValueError("bad stage count")
    low, high = math.ceil(max(costs)), math.ceil(sum(costs))
    while low < high:
        middle = (low + high) // 2
        if len(_fill(costs, middle)) + 1 <= n_stages:
            high = middle
        else:
            low = middle + 1
    return _split_off_singles(_fill(costs, low), costs, n_stages)


def bisection_to_a_fixed_epsilon(costs: list[float], n_stages: int) -> list[int]:
    """Bisects the limit on the largest stage until the interval is below 1e-6: fine for costs
    in milliseconds, but for costs in seconds (a layer takes 1e-7 s) it stops at once, far from
    the best split."""
    if not 1 <= n_stages <= len(costs):
        raise ValueError("bad stage count")
    low, high = max(costs), sum(costs)
    while high - low > 1e-6:
        middle = (low + high) / 2
        if len(_fill(costs, middle)) + 1 <= n_stages:
            high = middle
        else:
            low = middle
    return _split_off_singles(_fill(costs, high), costs, n_stages)


def cut_nearest_the_even_share(costs: list[float], n_stages: int) -> list[int]:
    """Cuts where the running total comes closest to k/P of the whole: often the best split,
    but not always ([9, 6, 10, 8] in 3 stages: [1, 3] leaves a stage of 16, [2, 3] at most
    15)."""
    if not 1 <= n_stages <= len(costs):
        raise ValueError("bad stage count")
    prefix = [sum(costs[:i]) for i in range(len(costs) + 1)]
    boundaries: list[int] = []
    for k in range(1, n_stages):
        low = (boundaries[-1] + 1) if boundaries else 1
        high = len(costs) - (n_stages - k)
        share = k * prefix[-1] / n_stages
        boundaries.append(min(range(low, high + 1), key=lambda i: abs(prefix[i] - share)))
    return boundaries


def search_every_split(costs: list[float], n_stages: int) -> list[int]:
    """Right, but tries every split: about 10^10 for 96 layers in 8 stages. Not in MUTANTS (the
    mutant test runs cases in its own process, with no time limit); the grader's child process
    is stopped at the case's limit instead (tests/test_grading_checks.py)."""
    if not 1 <= n_stages <= len(costs):
        raise ValueError("bad stage count")
    best = min(itertools.combinations(range(1, len(costs)), n_stages - 1),
               key=lambda cut: max(sum(costs[a:b]) for a, b in
                                   zip((0, *cut), (*cut, len(costs)))))
    return list(best)


# ---- 4.2 ----------------------------------------------------------------------------------------


def gpipe_interleaved(n_stages: int, n_microbatches: int) -> list[list[Step]]:
    """Interleaves each microbatch's forward and backward (F0 B0 F1 B1 ...): a valid schedule,
    but not GPipe, and no pipelining at all."""
    return [[step for m in range(n_microbatches) for step in (Step(p, m, "F"), Step(p, m, "B"))]
            for p in range(n_stages)]


def gpipe_backwards_reversed(n_stages: int, n_microbatches: int) -> list[list[Step]]:
    """Runs the backwards last microbatch first (valid, but not the order GPipe uses here)."""
    mbs = range(n_microbatches)
    return [[*(Step(p, m, "F") for m in mbs), *(Step(p, m, "B") for m in reversed(mbs))]
            for p in range(n_stages)]


# ---- 4.3 ----------------------------------------------------------------------------------------


def _one_f_one_b(n_stages: int, n_microbatches: int, warmup_of: Callable[[int], int]
                 ) -> list[list[Step]]:
    orders = []
    for p in range(n_stages):
        warmup = warmup_of(p)
        forwards = [Step(p, m, "F") for m in range(n_microbatches)]
        backwards = [Step(p, m, "B") for m in range(n_microbatches)]
        steady = [step for pair in zip(forwards[warmup:], backwards) for step in pair]
        orders.append(forwards[:warmup] + steady + backwards[len(steady) // 2:])
    return orders


def one_f_one_b_warmup_off_by_one(n_stages: int, n_microbatches: int) -> list[list[Step]]:
    """Off-by-one warm-up: P - p forwards instead of P - 1 - p, one microbatch too many held."""
    return _one_f_one_b(n_stages, n_microbatches, lambda p: min(n_stages - p, n_microbatches))


def one_f_one_b_unclamped(n_stages: int, n_microbatches: int) -> list[list[Step]]:
    """Forgets min(., M): with fewer microbatches than stages the leftover backwards are
    counted from a warm-up longer than M."""
    orders = []
    for p in range(n_stages):
        warmup = n_stages - 1 - p
        forwards = [Step(p, m, "F") for m in range(n_microbatches)]
        backwards = [Step(p, m, "B") for m in range(n_microbatches)]
        steady = [step for pair in zip(forwards[warmup:], backwards) for step in pair]
        orders.append(forwards[:warmup] + steady + backwards[n_microbatches - warmup:])
    return orders


# ---- 4.4 ----------------------------------------------------------------------------------------


def _forward(comm: Any, stage: nn.Module, step: Step, n_stages: int, x: torch.Tensor | None,
             in_shape: tuple[int, ...], *, grad: bool = True, detach_output: bool = False,
             tag_of: Callable[[Step], int] = message_tag, blocking: bool = True
             ) -> torch.Tensor:
    """4.4's forward step with one slip switched on by the keywords (the defaults: right)."""
    source = recv_from(step, n_stages)
    if source is not None:
        x = torch.empty(in_shape)
        comm.recv(x, source, tag=tag_of(step))
        if grad:
            x.requires_grad_()
    with comm.compute("forward", step.token):
        y = stage(x)
    y = y.detach() if detach_output else y
    target = send_to(step, n_stages)
    if target is not None:
        (comm.send if blocking else comm.isend)(y.detach(), target, tag=tag_of(step))
    return y


def forward_cuts_the_graph(*args: Any) -> torch.Tensor:
    """Receives into a plain tensor that never requires grad: the output's graph stops at the
    stage's parameters, and no gradient can go back to the previous stage."""
    return _forward(*args, grad=False)


def forward_returns_detached(*args: Any) -> torch.Tensor:
    """Returns the detached copy it sent: a backward step could not reach the parameters."""
    return _forward(*args, detach_output=True)


def forward_tags_by_microbatch(*args: Any) -> torch.Tensor:
    """Tags microbatch m's activation m instead of ``message_tag(step)`` (2 m): it arrives here,
    but a neighbour that receives with ``message_tag`` waits for ever or takes a gradient's
    tag."""
    return _forward(*args, tag_of=lambda step: step.microbatch)


def forward_never_waits(*args: Any) -> torch.Tensor:
    """Sends with ``isend`` and drops the work: the activation arrives on the simulator, but
    on gloo or NCCL its buffer may be read or reused before it has left."""
    return _forward(*args, blocking=False)


# ---- 4.5 ----------------------------------------------------------------------------------------

Tensors = Sequence[torch.Tensor] | None
Shapes = Sequence[tuple[int, ...]] | None
Seconds = tuple[float, float] | None
MSE = nn.functional.mse_loss


def _execute(comm: Any, schedule: Schedule, stage: nn.Module,
             microbatches: Sequence[torch.Tensor] | None, targets: Sequence[torch.Tensor] | None,
             recv_shapes: Sequence[tuple[int, ...]] | None, loss_fn: Any,
             stage_seconds: tuple[float, float] | None, *, stash_all: bool = True,
             grad_back: int = -1, mean: bool = True, steps: list[Step] | None = None,
             leaf: bool = True, keep: bool = False, tag_of: Any = message_tag,
             forget: bool = True, hold_sends: bool = False, block_forward: bool = False,
             zero: bool = False) -> float | None:
    """The executor with one mistake switched on (each mutant below names its own)."""
    if zero:
        stage.zero_grad()
    n_stages, n_mbs = schedule.n_stages, schedule.n_microbatches
    forward_s, backward_s = stage_seconds or (None, None)
    stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    sent: dict[int, Any] = {}
    sends, losses = [], []
    for step in steps if steps is not None else steps_of(schedule, comm.rank):
        m, tag = step.microbatch, tag_of(step)
        source, target = recv_from(step, n_stages), send_to(step, n_stages)
        if step.op == "F":
            if source is None:
                x = microbatches[m]
            else:
                x = torch.empty(recv_shapes[m])
                comm.recv(x, source, tag)
                if leaf:
                    x.requires_grad_()
            with comm.compute("forward", step.token, seconds=forward_s):
                y = stage(x)
                if target is None:
                    y = loss_fn(y, targets[m]) / (n_mbs if mean else 1)
                    losses.append(y.item())
            if not stash_all:
                stash.clear()
            stash[m] = (x, y)
            if target is not None and block_forward:
                comm.send(y.detach(), target, tag)
            elif target is not None and hold_sends:
                message = y.detach()
                sends.append((comm.isend(message, target, tag), message))
            elif target is not None:
                sent[m] = comm.isend(y.detach(), target, tag)
        else:
            if keep:
                x, y = stash[m]
            else:
                x, y = stash.pop(m) if m in stash else next(iter(stash.values()))
            if m in sent:
                sent.pop(m).wait()
            grad = None
            if source is not None:
                grad = torch.empty_like(y)
                comm.recv(grad, source, tag)
            with comm.compute("backward", step.token, seconds=backward_s):
                torch.autograd.backward(y, grad, retain_graph=not stash_all)
            if target is not None:
                peer = target if grad_back < 0 else (comm.rank + 1) % n_stages
                sends.append((comm.isend(x.grad, peer, tag), x.grad))
            if forget:
                del x, y
    for work, _ in sends:
        work.wait()
    for work in sent.values():
        work.wait()
    return sum(losses) if comm.rank == n_stages - 1 else None


def executor_stashes_one(comm: Any, schedule: Schedule, stage: nn.Module, microbatches: Tensors,
                         targets: Tensors, recv_shapes: Shapes, loss_fn: Any = MSE,
                         stage_seconds: Seconds = None) -> float | None:
    """Forgets to stash per microbatch: keeps only the latest microbatch's input and output,
    so a backward that runs after a later forward uses the wrong activations."""
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, stash_all=False)


def executor_grads_to_next_stage(comm: Any, schedule: Schedule, stage: nn.Module,
                                 microbatches: Tensors, targets: Tensors, recv_shapes: Shapes,
                                 loss_fn: Any = MSE, stage_seconds: Seconds = None) -> float | None:
    """Sends the input's gradient to the wrong stage (the next one, where activations go)."""
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, grad_back=1)


def executor_sums_losses(comm: Any, schedule: Schedule, stage: nn.Module, microbatches: Tensors,
                         targets: Tensors, recv_shapes: Shapes, loss_fn: Any = MSE,
                         stage_seconds: Seconds = None) -> float | None:
    """Sums the microbatches' losses instead of taking their mean: gradients M times too big."""
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, mean=False)


def executor_always_gpipe(comm: Any, schedule: Schedule, stage: nn.Module, microbatches: Tensors,
                          targets: Tensors, recv_shapes: Shapes, loss_fn: Any = MSE,
                          stage_seconds: Seconds = None) -> float | None:
    """Ignores the schedule's order: every forward, then every backward (GPipe), so 1F1B's
    stages hold all M microbatches."""
    steps = [Step(comm.rank, m, op) for op in ("F", "B")
             for m in range(schedule.n_microbatches)]
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, steps=steps)


def executor_cuts_the_graph(comm: Any, schedule: Schedule, stage: nn.Module, microbatches: Tensors,
                            targets: Tensors, recv_shapes: Shapes, loss_fn: Any = MSE,
                            stage_seconds: Seconds = None) -> float | None:
    """The received activation never requires grad: there is no input gradient to send back."""
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, leaf=False)


def executor_never_frees(comm: Any, schedule: Schedule, stage: nn.Module, microbatches: Tensors,
                         targets: Tensors, recv_shapes: Shapes, loss_fn: Any = MSE,
                         stage_seconds: Seconds = None) -> float | None:
    """Reads the stash with ``stash[m]`` instead of ``stash.pop(m)``: the numbers are right,
    but no microbatch's input or output is ever freed, so every stage ends up holding all M,
    whatever the schedule."""
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, keep=True)


def executor_one_tag(comm: Any, schedule: Schedule, stage: nn.Module, microbatches: Tensors,
                     targets: Tensors, recv_shapes: Shapes, loss_fn: Any = MSE,
                     stage_seconds: Seconds = None) -> float | None:
    """Tags every message 0: right while messages arrive in the order they are received, but
    when a neighbour runs its backwards in another order, a stage takes another microbatch's
    gradient."""
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, tag_of=lambda step: 0)


def executor_keeps_loop_variables(comm: Any, schedule: Schedule, stage: nn.Module,
                                  microbatches: Tensors, targets: Tensors, recv_shapes: Shapes,
                                  loss_fn: Any = MSE, stage_seconds: Seconds = None
                                  ) -> float | None:
    """Pops the stash but never drops the loop's own names for the tensors: ``y`` still holds
    the last backward's output while the next forward runs, one microbatch more than the
    schedule has in flight (5 instead of 4 on 1F1B's first stage)."""
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, forget=False)


def executor_holds_every_send(comm: Any, schedule: Schedule, stage: nn.Module,
                              microbatches: Tensors, targets: Tensors, recv_shapes: Shapes,
                              loss_fn: Any = MSE, stage_seconds: Seconds = None
                              ) -> float | None:
    """Keeps every send's Work and ``y.detach()`` in a list until the end of the step: the
    detached copy shares y's memory, so every microbatch's output stays in memory until the
    step ends, whatever the schedule."""
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, hold_sends=True)


def executor_blocking_forward_sends(comm: Any, schedule: Schedule, stage: nn.Module,
                                    microbatches: Tensors, targets: Tensors,
                                    recv_shapes: Shapes, loss_fn: Any = MSE,
                                    stage_seconds: Seconds = None) -> float | None:
    """Sends activations with the blocking ``comm.send`` (gradients with isend): fine on GPipe
    and 1F1B, but a schedule whose neighbours run their forwards in different orders
    deadlocks: stage 0 waits in its send of microbatch 0 while stage 1 waits for microbatch
    2."""
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, block_forward=True)


def executor_zeroes_gradients(comm: Any, schedule: Schedule, stage: nn.Module,
                              microbatches: Tensors, targets: Tensors, recv_shapes: Shapes,
                              loss_fn: Any = MSE, stage_seconds: Seconds = None
                              ) -> float | None:
    """Calls ``stage.zero_grad()`` first: right for one step alone, but it throws away what an
    earlier step of gradient accumulation left in ``.grad``."""
    return _execute(comm, schedule, stage, microbatches, targets, recv_shapes, loss_fn,
                    stage_seconds, zero=True)


MUTANTS: dict[str, list[str]] = {
    "4.1": ["equal_layer_counts", "greedy_fill", "whole_number_limits",
            "bisection_to_a_fixed_epsilon", "cut_nearest_the_even_share"],
    "4.2": ["gpipe_interleaved", "gpipe_backwards_reversed"],
    "4.3": ["one_f_one_b_warmup_off_by_one", "one_f_one_b_unclamped"],
    "4.4": ["forward_cuts_the_graph", "forward_returns_detached", "forward_tags_by_microbatch",
            "forward_never_waits"],
    "4.5": ["executor_stashes_one", "executor_grads_to_next_stage", "executor_sums_losses",
            "executor_always_gpipe", "executor_cuts_the_graph", "executor_never_frees",
            "executor_one_tag", "executor_keeps_loop_variables", "executor_holds_every_send",
            "executor_blocking_forward_sends", "executor_zeroes_gradients"],
}
