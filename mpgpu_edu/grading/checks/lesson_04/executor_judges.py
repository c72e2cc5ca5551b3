"""Exercise 4.5's *judge*: a training step of the learner's executor against one device's
(loss, gradients, parameters after SGD), and what each stage kept alive against the
schedule's microbatches in flight."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpgpu_edu.grading.checks import CheckFailure
from mpgpu_edu.grading.checks._support import bytes_of, expect, expect_close, judge_examples
from mpgpu_edu.grading.checks.lesson_04.executor import SECONDS
from mpgpu_edu.grading.checks.lesson_04.stages import (ABOUT, EARLIER_GRAD, LR, _data,
                                                       _named_schedule, _split)
from mpgpu_edu.pipeline import Schedule, peak_activations, steps_of
from mpgpu_edu.cluster.trace import Trace


def _reference_step(p: int, m: int, partition: str, batch: int, seed: int, model: str
                    ) -> dict:
    """One device: the same stages in a row, gradients accumulated over the same
    microbatches, loss the mean over microbatches; then one SGD step."""
    stages, _ = _split(p, partition, seed, model)
    for w in nn.Sequential(*stages).parameters():
        w.grad = torch.full_like(w, EARLIER_GRAD)
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
    where = f"{schedule}, {p} stages, {m} microbatches" + ABOUT.get(schedule, "")
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
                                    "(loss: mean over microbatches; every .grad held "
                                    f"{EARLIER_GRAD} before the step, and the executor adds to "
                                    "it, never zeroes it)")
            expect_close(results[rank]["params"][name], want["params"][rank][name],
                         f"{where}: stage {rank}'s {name} after one SGD step")


def _judge_runs(runs: list[tuple[dict, dict]]) -> None:
    for facts, example in runs:
        _judge_step(facts, **example)


def _kept_alive(events: list, schedule: Schedule, rank: int, where: str) -> int:
    """Replay one stage's forward/backward events. At the start of each forward and each
    backward the executor may keep alive only the microbatches in flight there (forward run,
    backward not yet run), nothing whose backward has run. Returns the most microbatches kept
    alive at once."""
    mbs = [s.microbatch for s in steps_of(schedule, rank) if s.op == "F"]
    name = (lambda call: mbs[call] if call < len(mbs) else f"#{call}")  # noqa: E731
    started, backed, peak = set(), set(), 0
    for op, call, alive in events:
        stale = sorted(set(alive) - (started - backed))
        if stale:
            raise CheckFailure(
                f"{where}: at the start of {op}({name(call)}) stage {rank} still keeps "
                f"microbatch {name(stale[0])}'s input or output alive, after B("
                f"{name(stale[0])}) has run. A variable keeps a tensor alive too, and so do a "
                "send's Work and a .detach() (they share its memory): after the backward, drop "
                "every name of it (the stash entry, `del` the loop's variables, let go of the "
                "forward's send once waited), so that only the microbatches in flight stay in "
                "memory")
        peak = max(peak, len(alive))
        (started if op == "F" else backed).add(call)
    return peak


def _in_flight(order: list[list[Any]], rank: int) -> int:
    """The most microbatches stage ``rank`` (not the last) had in flight, read from its
    program's messages in the order the grader's router saw them: at each activation it
    sends on, activations sent so far less gradients received back (waited for) by then. No
    time enters: where a rank reports its compute moves nothing here."""
    sent = back = peak = 0
    for kind, peer, _tag in order:
        if peer != rank + 1:
            continue
        if kind == "send":
            sent += 1
            peak = max(peak, sent - back)
        else:
            back += 1
    return peak


def _judge_pipeline_messages(facts: dict, e: dict) -> None:
    """Every stage sent exactly its pipeline's messages: one activation per microbatch to the
    next stage (tag 2 m) and one gradient per microbatch to the previous one (tag 2 m + 1),
    nothing else, so that the messages the in-flight count reads are the pipeline's own (a
    message sent back for another reason would count as a gradient come back)."""
    p, m = e["p"], e["m"]
    where = f"{e['schedule']}, {p} stages, {m} microbatches"
    for rank in range(p):
        tags: dict[int, list[int]] = {}
        for peer, tag, _nbytes in facts["sends"][rank]:
            tags.setdefault(peer, []).append(tag)
        want = {}
        if rank < p - 1:
            want[rank + 1] = [2 * k for k in range(m)]
        if rank > 0:
            want[rank - 1] = [2 * k + 1 for k in range(m)]
        got = {peer: sorted(t) for peer, t in tags.items()}
        expect(got == want,
               f"{where}: stage {rank} sent messages with tags {got} (per stage); a pipeline "
               f"step sends {want}: per microbatch one activation to the next stage (tag 2 m) "
               "and one gradient to the previous one (tag 2 m + 1), and nothing else")


def _judge_in_flight_messages(facts: dict, e: dict) -> None:
    schedule = _named_schedule(e["schedule"], e["p"], e["m"])
    want = peak_activations(schedule)
    where = f"{e['schedule']}, {e['p']} stages, {e['m']} microbatches"
    _judge_pipeline_messages(facts, e)
    got = [_in_flight(facts["order"][rank], rank) for rank in range(e["p"] - 1)]
    expect(all(g <= w for g, w in zip(got, want)),
           f"{where}: by the messages, stages 0..{e['p'] - 2} had up to {got} microbatches in "
           f"flight (activations sent on before the gradient of an earlier one had been "
           f"received back); the schedule has {want[:-1]}: does the executor run the "
           "schedule's steps in its order, a backward as soon as the schedule says?")


def _judge_in_flight_step(facts: dict, e: dict) -> None:
    """A step right to one device's numbers, whose messages keep within the schedule's
    microbatches in flight."""
    _judge_step(facts, **e)
    _judge_in_flight_messages(facts, e)


def _judge_in_flight_runs(runs: list) -> None:
    for facts, e in runs:
        _judge_in_flight_step(facts, e)


def _judge_in_flight(runs: list) -> None:
    """Feedback only: what each stage kept alive, watched inside its process."""
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
            for peer, tag, _n in facts["sends"][rank]:
                what, mb = ("activation", tag // 2) if peer == rank + 1 else ("gradient",
                                                                              (tag - 1) // 2)
                expect(tag == (2 * mb if peer == rank + 1 else 2 * mb + 1) and 0 <= mb < m,
                       f"{where}: stage {rank} sent a {what} to stage {peer} with tag {tag}; "
                       "message_tag(step) gives 2 m for microbatch m's activation and "
                       "2 m + 1 for its gradient, so that no tag means two things")


def _judge_timed_executor(runs: list) -> None:
    for facts, e in runs:
        _judge_step(facts, **e)  # regions of the right length around a step that is right
        _judge_pipeline_messages(facts, e)
        trace = Trace.from_dict(facts["trace"])
        for rank in range(e["p"]):
            for kind, seconds in zip(("forward", "backward"), SECONDS):
                events = [ev for ev in trace.on(rank, "compute") if ev.kind == kind]
                seen = sorted({round(ev.duration * 1e3, 6) for ev in events})
                expect(len(events) == e["m"] and all(abs(ev.duration - seconds) < 1e-9
                                                     for ev in events),
                       f"{e['schedule']}: stage {rank} has {len(events)} {kind} compute "
                       f"events lasting {seen} ms, expected {e['m']} of {seconds * 1e3:g} ms "
                       f"each: pass seconds=stage_seconds[{kind == 'backward':d}] to "
                       f"comm.compute(\"{kind}\", ...)")


def _judge_hidden_executor(records: list[dict]) -> None:
    judge_examples(records, lambda out, **example: _judge_in_flight_step(out, example))
