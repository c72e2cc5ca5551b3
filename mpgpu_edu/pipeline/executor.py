"""The pipeline executor: one interpreter that runs any schedule, and a pipeline train step.

A schedule (``mpgpu_edu.pipeline.schedules``) is a value: for each device, the forward and
backward steps it runs, in order. ``run_schedule`` walks this rank's steps and does the same
thing for every one of them, whatever the schedule's name:

    F(m): receive microbatch m's activation from the previous stage (stage 0 reads the batch),
          run the stage forward, keep what backward needs, send the output to the next
          stage (the last stage computes microbatch m's loss instead).
    B(m): receive the gradient of m's output from the next stage (the last stage starts from
          its loss), run backward, free m's activations, send the gradient of m's input to
          the previous stage.

That is the seed's picture: activations flow forward, gradients flow back, and a device
with nothing to receive yet waits (a bubble). Naive model parallelism, GPipe and 1F1B differ
only in the order of steps, which the schedule holds; the executor holds no schedule logic.
Interleaved 1F1B adds one thing to each step, the model chunk it runs: a rank then holds one
module per chunk, and a step's input comes from (and its output goes to) the neighbouring
virtual stage, which wraps from the last rank back to the first.

Messages: sends are ``isend`` (waited for at the end), receives block. In a valid schedule
every step's inputs come from steps at earlier ticks, so by induction on the tick every
receive is eventually matched: no schedule that passes ``validate`` can deadlock here. Each
message's tag names its microbatch and direction (``message_tag``). nccl ignores tags and
matches two ranks' messages in the order they are posted; every builder's schedule runs the
microbatches in the same order on every stage, so that order agrees too.

Cost per microbatch on a stage boundary: one activation message forward and one gradient
message back, each ``alpha + bytes / beta`` on the link between the two devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from mpgpu_edu.comm import Communicator, Work, nbytes_of
from mpgpu_edu.pipeline.measures import steps_of
from mpgpu_edu.pipeline.microbatches import split_batch, stage_inputs_like
from mpgpu_edu.pipeline.steps import Schedule, Step, consumer_of, producer_of

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
StageSeconds = tuple[float, float]


CHUNK_TAG_STRIDE = 1 << 20  # tags of chunk c start at 2c x this: no two chunks' tags meet


def message_tag(step: Step) -> int:
    """The tag of the message a step receives or sends: ``2 m`` for microbatch m's
    activation, ``2 m + 1`` for its gradient (plus ``2 c x 2^20`` for chunk c of an
    interleaved schedule, whose sender tags it with the receiving step)."""
    chunk = 2 * CHUNK_TAG_STRIDE * step.chunk
    return chunk + 2 * step.microbatch + (1 if step.op == "B" else 0)


@dataclass
class _Pipeline:
    """What every step of one ``run_schedule`` call needs (kept together to keep the two step
    functions short)."""

    comm: Communicator
    n_stages: int
    n_chunks: int
    modules: Sequence[nn.Module]  # one per chunk
    microbatches: Sequence[torch.Tensor] | None
    targets: Sequence[torch.Tensor] | None
    loss_fn: LossFn
    recv_like: Sequence[Sequence[torch.Tensor] | None]  # [chunk][microbatch]
    batch_size: int
    seconds: Sequence[StageSeconds] | None  # one pair per chunk
    losses: list[float]


@dataclass
class _Saved:
    """What microbatch m's backward needs: the stage's input (whose grad we send back), its
    output (or the loss, on the last stage) and the memory record of the activations; and the
    send of its output to the next stage, waited for and let go at the backward."""

    inputs: torch.Tensor
    outputs: torch.Tensor
    token: int
    send: Work | None = None


def run_schedule(comm: Communicator, schedule: Schedule,
                 stage_module: nn.Module | Sequence[nn.Module],
                 microbatches: Sequence[torch.Tensor] | None,
                 targets: Sequence[torch.Tensor] | None, loss_fn: LossFn, *,
                 recv_like: Sequence | None = None,
                 batch_size: int | None = None,
                 stage_seconds: StageSeconds | Sequence[StageSeconds] | None = None
                 ) -> float | None:
    """Run this rank's steps of ``schedule`` (rank p runs stage p, row p of the grid).

    Stage 0 reads ``microbatches[m]``; the last stage reads ``targets[m]`` and computes
    ``loss_fn(output, targets[m]) * len(targets[m]) / batch_size`` (``batch_size`` defaults to
    the targets' total length, so with a mean ``loss_fn`` the gradients equal the full batch's
    mean: 1/M per microbatch when they are equal). Any other stage receives its input into a
    tensor of ``recv_like[m]``'s shape and dtype (see ``stage_inputs_like``).

    Gradients accumulate in ``stage_module``'s ``.grad``; the caller zeroes them and steps the
    optimizer. ``stage_seconds=(forward_s, backward_s)`` times every step at fixed seconds on
    the simulator (for teaching), instead of counting FLOPs.

    An interleaved schedule (``schedule.n_chunks`` = V > 1) runs V model chunks on each rank:
    ``stage_module``, ``recv_like`` and ``stage_seconds`` then hold one entry per chunk
    (chunk c of rank p is virtual stage c P + p; the last rank's last chunk computes the loss).

    Returns the summed (scaled) loss on the last stage, ``None`` on the others.
    """
    if schedule.n_stages != comm.world_size:
        raise ValueError(f"schedule {schedule.name!r} has {schedule.n_stages} stages but the "
                         f"communicator has {comm.world_size} ranks: one stage per rank")
    chunks = schedule.n_chunks
    modules = [stage_module] if chunks == 1 else list(stage_module)
    if len(modules) != chunks:
        raise ValueError(f"schedule {schedule.name!r} runs {chunks} chunks per rank: pass one "
                         f"module per chunk, got {len(modules)}")
    likes = [recv_like] if chunks == 1 else list(recv_like or [None] * chunks)
    seconds = None if stage_seconds is None else (
        [stage_seconds] if chunks == 1 else list(stage_seconds))
    is_last = comm.rank == schedule.n_stages - 1
    for chunk, like in enumerate(likes):
        _check_inputs(comm.rank + chunk * schedule.n_stages, is_last, schedule, microbatches,
                      targets, like)
    if batch_size is None:
        batch_size = sum(len(t) for t in targets) if is_last else 1
    run = _Pipeline(comm, schedule.n_stages, chunks, modules, microbatches, targets, loss_fn,
                    likes, batch_size, seconds, [])
    saved: dict[tuple[int, int], _Saved] = {}
    sends: list[Work] = []  # the gradients sent back (a Work holds its tensor until done)
    for step in steps_of(schedule, comm.rank):
        if step.op == "F":
            _forward(run, step, saved)
        else:
            sends += _backward(run, step, saved)
    for work in sends:
        work.wait()
    return sum(run.losses) if is_last else None


def _forward(run: _Pipeline, step: Step, saved: dict[tuple[int, int], _Saved]) -> None:
    comm, m, module = run.comm, step.microbatch, run.modules[step.chunk]
    source = producer_of(step, run.n_stages, run.n_chunks)
    target = consumer_of(step, run.n_stages, run.n_chunks)
    if source is None:
        inputs = run.microbatches[m]
    else:
        like = run.recv_like[step.chunk][m]
        inputs = torch.empty(like.shape, dtype=like.dtype, device=comm.device)
        comm.recv(inputs, source.stage, message_tag(step))
        inputs.requires_grad_()
    seconds = run.seconds[step.chunk][0] if run.seconds else None
    acts = _ActivationBytes(module)
    with comm.compute("forward", step.token, seconds=seconds), acts:
        outputs = module(inputs)
        if target is None:  # the last stage: this microbatch's share of the batch's loss
            share = len(run.targets[m]) / run.batch_size
            outputs = run.loss_fn(outputs, run.targets[m]) * share
            run.losses.append(outputs.item())
    token = comm.memory.alloc("activations", acts.nbytes, f"stage {step.stage} {step.token}")
    send = None if target is None else comm.isend(outputs.detach().contiguous(), target.stage,
                                                  message_tag(target))
    saved[step.chunk, m] = _Saved(inputs, outputs, token, send)


def _backward(run: _Pipeline, step: Step, saved: dict[tuple[int, int], _Saved]) -> list[Work]:
    comm = run.comm
    source = producer_of(step, run.n_stages, run.n_chunks)
    target = consumer_of(step, run.n_stages, run.n_chunks)
    mine = saved.pop((step.chunk, step.microbatch))
    if mine.send is not None:  # delivered by now: the gradient comes back only after it
        mine.send.wait()
    grad = None  # the last stage starts from its loss
    if source is not None:
        grad = torch.empty_like(mine.outputs)
        comm.recv(grad, source.stage, message_tag(step))
    seconds = run.seconds[step.chunk][1] if run.seconds else None
    with comm.compute("backward", step.token, seconds=seconds):
        if mine.outputs.requires_grad:  # False only for a stage with nothing to train
            torch.autograd.backward(mine.outputs, grad)
    comm.memory.free(mine.token)
    if target is None:
        return []
    return [comm.isend(mine.inputs.grad.contiguous(), target.stage, message_tag(target))]


class _ActivationBytes(torch.autograd.graph.saved_tensors_hooks):
    """Counts the bytes of the tensors autograd saves for backward (the activations), each
    once, leaving out the module's parameters, which are held anyway."""

    def __init__(self, module: nn.Module) -> None:
        self.nbytes = 0
        self._seen = {p.data_ptr() for p in module.parameters()}
        super().__init__(self._pack, lambda tensor: tensor)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_meta and tensor.data_ptr() not in self._seen:
            self._seen.add(tensor.data_ptr())
            self.nbytes += nbytes_of(tensor)
        return tensor


def _check_inputs(rank: int, is_last: bool, schedule: Schedule,
                  microbatches: Sequence[torch.Tensor] | None,
                  targets: Sequence[torch.Tensor] | None,
                  recv_like: Sequence[torch.Tensor] | None) -> None:
    """``rank`` is the virtual stage (the rank itself unless the schedule is interleaved)."""
    n = schedule.n_microbatches
    needs = [("microbatches", microbatches, rank == 0), ("targets", targets, is_last),
             ("recv_like", recv_like, rank > 0)]
    for name, value, needed in needs:
        if needed and (value is None or len(value) != n):
            got = "nothing" if value is None else f"{len(value)}"
            raise ValueError(f"stage {rank} needs {n} {name} (one per microbatch of schedule "
                             f"{schedule.name!r}), got {got}")


# ---- a train step ------------------------------------------------------------------------------

def pipeline_train_step(comm: Communicator, model_stages: Sequence[nn.Module],
                        schedule: Schedule, batch: torch.Tensor, targets: torch.Tensor,
                        optimizer: torch.optim.Optimizer | None,
                        loss_fn: LossFn | None = None, *,
                        stage_seconds: StageSeconds | None = None) -> float | None:
    """One optimizer update of pipeline training: split the batch into the schedule's
    microbatches, run the schedule (``run_schedule``), step this stage's ``optimizer`` (None
    for a stage with nothing to train, such as a lone ReLU).

    ``model_stages`` are all the stages (every rank can build the whole model; rank p trains
    ``model_stages[p]``). Returns the batch's mean loss on the last stage, ``None`` elsewhere.
    With ``stage_seconds`` the optimizer step is free, so the timeline shows only the schedule.
    """
    for stage in model_stages[comm.rank::schedule.n_stages]:  # this rank's chunks
        stage.zero_grad(set_to_none=True)
    loss = pipeline_forward_backward(comm, model_stages, schedule, batch, targets, loss_fn,
                                 stage_seconds=stage_seconds)
    if optimizer is not None:
        with comm.compute("optimizer", "step", seconds=0.0 if stage_seconds else None):
            optimizer.step()
    return loss


def pipeline_forward_backward(comm: Communicator, model_stages: Sequence[nn.Module],
                          schedule: Schedule, batch: torch.Tensor, targets: torch.Tensor,
                          loss_fn: LossFn | None = None, *, batch_size: int | None = None,
                          stage_seconds: StageSeconds | Sequence[StageSeconds] | None = None
                          ) -> float | None:
    """Forward and backward of the whole batch through the pipeline, gradients accumulated
    in this rank's stage; no optimizer step (``pipeline_train_step`` adds it). Hybrid
    training passes the global ``batch_size`` when ``batch`` is one replica's shard.
    For an interleaved schedule ``model_stages`` are the P V virtual stages, rank p runs
    ``model_stages[p::P]``, and ``stage_seconds`` holds one pair per chunk."""
    rank, m = comm.rank, schedule.n_microbatches
    microbatches, mb_targets = split_batch(batch, m), split_batch(targets, m)
    if schedule.n_chunks > 1:  # model_stages are the P V virtual stages; rank p runs c P + p
        mine = range(rank, len(model_stages), schedule.n_stages)
        return run_schedule(comm, schedule, [model_stages[v] for v in mine], microbatches,
                            mb_targets, loss_fn or nn.functional.mse_loss,
                            recv_like=[stage_inputs_like(model_stages[:v], microbatches)
                                       if v > 0 else None for v in mine],
                            batch_size=batch_size, stage_seconds=stage_seconds)
    recv_like = stage_inputs_like(model_stages[:rank], microbatches) if rank > 0 else None
    return run_schedule(comm, schedule, model_stages[rank], microbatches, mb_targets,
                        loss_fn or nn.functional.mse_loss, recv_like=recv_like,
                        batch_size=batch_size, stage_seconds=stage_seconds)
