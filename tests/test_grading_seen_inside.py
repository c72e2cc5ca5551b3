"""Facts that only a rank's own process can see earn no points (``checks.FEEDBACK``); the
scored cases that stood for them judge what the grader sees itself: the messages of its own
record, its own clock. Here a run's reported facts are made to say what the contract wants
while its messages are a wrong answer's: the feedback case passes, the scored one fails."""

from __future__ import annotations

import pytest

from mpgpu_edu.grading.checks import FEEDBACK, FEEDBACK_COMPUTE, CheckFailure, cases_for
from mpgpu_edu.grading.checks._clock import resolve
from mpgpu_edu.grading.checks._plain import plain
from mpgpu_edu.grading.registry import EXERCISES
from tests.mutants import lesson_03, lesson_04, lesson_08
from tests.test_grading_checks import ROOT, solution


def _data(compute, fn):  # noqa: ANN001, ANN202 - a case's halves
    return resolve(plain(compute(fn)))


def test_every_case_worth_nothing_says_so_and_every_exercise_still_earns_points() -> None:
    for exercise in EXERCISES:
        cases = cases_for(exercise)
        assert sum(case.points for case in cases) > 0, exercise
        for case in cases:
            assert (case.points == 0) == case.name.endswith((FEEDBACK, FEEDBACK_COMPUTE)) or (
                exercise == "5.1" and "no points" in case.name), (exercise, case.name)


def test_ddp_buckets_are_read_from_the_messages_not_from_the_reported_calls() -> None:
    from mpgpu_edu.grading.checks.lesson_03.ddp import (_ddp_basic, _judge_ddp_buckets,
                                                        _judge_ddp_calls)

    right = _data(_ddp_basic, solution("ex03_data_parallel").wrap_ddp)
    wrong = _data(_ddp_basic, lesson_03.ddp_no_buckets)  # one all-reduce per parameter
    _judge_ddp_calls(right)
    _judge_ddp_buckets(right)
    lying = dict(wrong, all_reduce=right["all_reduce"], broadcast=right["broadcast"])
    _judge_ddp_calls(lying)  # the reported calls say buckets...
    with pytest.raises(CheckFailure, match="not those of the contract's collectives"):
        _judge_ddp_buckets(lying)  # ...the messages say one per parameter


def test_fsdp_collectives_are_read_from_the_messages() -> None:
    from mpgpu_edu.grading.checks.lesson_08.judges import (_judge_basic_calls,
                                                           _judge_basic_messages)
    from mpgpu_edu.grading.checks.lesson_08.wrapper import _basic

    right = _data(_basic, solution("ex08_bigger_models").wrap_fsdp)
    wrong = _data(_basic, lesson_08.fsdp_all_reduces)
    _judge_basic_messages(right)
    lying = dict(wrong, calls=right["calls"], results=right["results"])
    _judge_basic_calls(lying)
    with pytest.raises(CheckFailure, match="not those of the contract's collectives"):
        _judge_basic_messages(lying)


def test_microbatches_in_flight_are_read_from_the_messages() -> None:
    from mpgpu_edu.grading.checks.lesson_04.executor import IN_FLIGHT, SECONDS, _runs
    from mpgpu_edu.grading.checks.lesson_04.executor_judges import _judge_in_flight_runs

    one_f_one_b = [e for e in IN_FLIGHT if e["schedule"] == "1f1b"][:1]
    _judge_in_flight_runs(_data(_runs(one_f_one_b, seconds=SECONDS), lesson_04._execute))
    with pytest.raises(CheckFailure, match="microbatches in flight"):
        _judge_in_flight_runs(_data(_runs(one_f_one_b, seconds=SECONDS),
                                    lesson_04.executor_always_gpipe))


def test_a_timeline_with_compute_other_than_the_models_fails() -> None:
    """A rank counts and times its own compute regions: the grader holds their FLOPs to its
    own count of the model's forward and backward (``model_flops``) and each region's time to
    at least its FLOPs' in fp32, so a timeline that drops or adds compute, or runs it at
    another precision's speed (to show an overlap that did not happen), fails."""
    from mpgpu_edu.grading.checks.lesson_03.ddp import _ddp_timeline, _judge_ddp_timeline

    data = _data(_ddp_timeline, solution("ex03_data_parallel").wrap_ddp)
    _judge_ddp_timeline(data)
    events = data["trace"]["events"]
    last = max((e for e in events if e["device"] == 1 and e["kind"] == "backward"),
               key=lambda e: e["end"])
    for changed in (0.5, 1.5):
        forged = dict(data, trace=dict(data["trace"], events=[
            dict(e, flops=e["flops"] * changed) if e is last else e for e in events]))
        with pytest.raises(CheckFailure, match="not the model's own compute|model is fp32"):
            _judge_ddp_timeline(forged)


def test_a_timeline_whose_compute_runs_faster_than_fp32_fails() -> None:
    """Every FLOP still counted, but a region timed as bf16 (16 times faster on an A100):
    the prefetch timeline of 8.2 could otherwise pass with no prefetch at all."""
    from mpgpu_edu.grading.checks.lesson_03.ddp import _ddp_timeline, _judge_ddp_timeline

    data = _data(_ddp_timeline, solution("ex03_data_parallel").wrap_ddp)
    events = data["trace"]["events"]
    first = min((e for e in events if e["device"] == 0 and e["kind"] == "backward"),
                key=lambda e: e["start"])
    forged = dict(data, trace=dict(data["trace"], events=[
        dict(e, end=e["start"] + (e["end"] - e["start"]) / 16) if e is first else e
        for e in events]))
    with pytest.raises(CheckFailure, match="the model is fp32"):
        _judge_ddp_timeline(forged)


def test_a_token_message_during_backward_does_not_make_an_overlap() -> None:
    """3.3's timeline: all-reduces after backward, plus one small message exchanged from a
    hook while backward runs (so that communication seems to start during backward). The
    messages must be one all-reduce per parameter, as the grader's baseline sends."""
    import torch

    from mpgpu_edu.collectives import all_reduce

    def token_then_after(comm, model, loss):  # noqa: ANN001, ANN202 - the exercise's signature
        sent: list[int] = []

        def hook(_param):  # noqa: ANN001, ANN202
            if not sent:
                sent.append(1)
                peer = 1 - comm.rank
                work = comm.isend(torch.zeros(1), peer)
                comm.recv(torch.zeros(1), peer)
                work.wait()
        handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()]
        loss.backward()
        for handle in handles:
            handle.remove()
        for param in model.parameters():
            all_reduce(comm, param.grad, op="mean")

    timeline = next(c for c in cases_for("3.3") if c.name.startswith("timeline"))
    with pytest.raises(CheckFailure, match="not one all-reduce per parameter"):
        timeline.run(token_then_after)


# ---- a rank shapes its own timeline: time that is no step's, a baseline of its own ---------

def test_an_empty_backward_region_after_the_messages_is_not_backward() -> None:
    """3.5: all-reduces after backward, then an empty ``comm.compute("backward", ...,
    seconds=...)`` that stretches "backward" past the first message: the judge reads the
    model's backward from the regions that count FLOPs."""
    wrap_ddp = solution("ex03_data_parallel").wrap_ddp
    from tests.mutants.lesson_03 import ddp_all_reduce_in_finish

    def stretched(comm, module, cap):  # noqa: ANN001, ANN202 - the exercise's signature
        replica = ddp_all_reduce_in_finish(comm, module, cap)
        finish = replica.finish

        def finish_then_pad() -> None:
            finish()
            with comm.compute("backward", "backward", seconds=300e-6):
                pass
        replica.finish = finish_then_pad
        return replica

    timeline = next(c for c in cases_for("3.5") if c.name.startswith("timeline"))
    timeline.run(wrap_ddp)
    with pytest.raises(CheckFailure, match="after backward ends"):
        timeline.run(stretched)


def test_a_slowed_baseline_does_not_make_a_prefetch() -> None:
    """8.2: no prefetch at all, but the prefetch=False run slowed with an empty region: the
    prefetch run is also held to the grader's own run of the package's wrapper."""
    wrap_fsdp = solution("ex08_bigger_models").wrap_fsdp

    class Slowed:
        """The wrapper, with an empty region before each forward and each finish()."""

        def __init__(self, comm, replica):  # noqa: ANN001, ANN204
            self.comm, self.replica = comm, replica

        def __call__(self, x):  # noqa: ANN001, ANN204
            with self.comm.compute("compute", "pad", seconds=100e-6):
                pass
            return self.replica(x)

        def finish(self):  # noqa: ANN204 - backward's phase ends with finish()
            with self.comm.compute("compute", "pad", seconds=400e-6):
                pass
            self.replica.finish()

        def __getattr__(self, name):  # noqa: ANN001, ANN204
            return getattr(self.replica, name)

    def slowed(comm, module, prefetch=False):  # noqa: ANN001, ANN202
        replica = wrap_fsdp(comm, module, False)
        return replica if prefetch else Slowed(comm, replica)

    timeline = next(c for c in cases_for("8.2") if c.name.startswith("timeline"))
    with pytest.raises(CheckFailure, match="the package's wrapper without prefetch"):
        timeline.run(slowed)


def test_time_a_stage_reports_moves_nothing_in_the_in_flight_case() -> None:
    """4.5: microbatches in flight are counted from the order of each stage's messages, so
    compute a stage reports (here an idle region before every step, which once could hold a
    send back on the timeline) changes nothing; GPipe run where 1F1B is due still fails."""
    execute = solution("ex04_pipeline").execute_schedule

    def padded(comm, *args):  # noqa: ANN001, ANN202
        with comm.compute("idle", "idle", seconds=1e-3):
            pass
        return execute(comm, *args)

    def gpipe_always(comm, schedule, *args):  # noqa: ANN001, ANN202
        from mpgpu_edu.pipeline import gpipe
        with comm.compute("idle", "idle", seconds=1e-3):
            pass
        return execute(comm, gpipe(schedule.n_stages, schedule.n_microbatches), *args)

    in_flight = next(c for c in cases_for("4.5") if c.name.startswith("in flight"))
    in_flight.run(execute)
    in_flight.run(padded)
    with pytest.raises(CheckFailure, match="microbatches in flight"):
        in_flight.run(gpipe_always)


def test_activations_sent_from_comm_stream_jobs_still_count_in_flight(tmp_path) -> None:
    """4.5: a GPipe executor whose activations travel in comm-stream jobs (a hunt's cheat:
    the in-flight count read the program's own messages only, and scored 18 of 18 where the
    same executor without jobs scores 12). A job's sends count where it was submitted, its
    receives where the program waited for it."""
    import importlib.util

    source = (ROOT / "solutions" / "ex04_pipeline.py").read_text()
    for old, new in (
            ("    for step in steps_of(schedule, comm.rank):",
             "    steps = list(steps_of(schedule, comm.rank))\n"
             "    for step in sorted(steps, key=lambda s: (s.op == 'B', s.microbatch)):"),
            ("comm.recv(x, source, tag)", "comm.run_async(comm.recv, x, source, tag).wait()"),
            ("sent[m] = comm.isend(y.detach(), target, tag)",
             "sent[m] = comm.run_async(comm.send, y.detach(), target, tag)")):
        assert old in source, old
        source = source.replace(old, new)
    path = tmp_path / "gpipe_in_jobs.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("gpipe_in_jobs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    in_flight = next(c for c in cases_for("4.5") if c.name.startswith("in flight"))
    with pytest.raises(CheckFailure, match="microbatches in flight"):
        in_flight.run(module.execute_schedule)


# ---- a rank reports its compute after the messages that needed it ---------------------------

def _held_back_averaging(comm, model, loss):  # noqa: ANN001, ANN202 - 3.3's signature
    """All of backward first with the rank's counting held back (``flush_region`` shadowed
    on the communicator), every all-reduce submitted, then the FLOPs reported: the timeline
    shows backward running beside all-reduces whose gradients it had already made."""
    from mpgpu_edu.collectives import all_reduce

    comm.flush_region = lambda actor: None  # noqa: ARG005 - shadows the method
    works = []
    try:
        loss.backward()
        for param in model.parameters():
            works.append(comm.run_async(all_reduce, comm, param.grad, "mean"))
    finally:
        del comm.flush_region
    for work in works:
        work.wait()


def test_compute_reported_after_the_all_reduces_that_needed_it_fails() -> None:
    """3.3 and 3.5: a job cannot send a gradient before the compute that makes it was
    reported (``judge_jobs_after_compute``, against the grader's own run whose jobs start as
    soon as their data exists); the solutions pass."""
    module = solution("ex03_data_parallel")
    timeline = next(c for c in cases_for("3.3") if c.name.startswith("timeline"))
    timeline.run(module.backward_with_overlap)
    with pytest.raises(CheckFailure, match="reported after the messages that needed it"):
        timeline.run(_held_back_averaging)

    class HeldBack:
        """The solution's wrapper; from the first gradient of backward to the last, the
        rank's counting is held back, so every bucket's all-reduce but the first is
        submitted before the backward that made it is reported."""

        def __init__(self, comm, inner, params):  # noqa: ANN001, ANN204
            self.comm, self.inner, self.seen, self.count = comm, inner, 0, len(params)
            for param in params:
                param.register_post_accumulate_grad_hook(self._hook)

        def _hook(self, _param):  # noqa: ANN001, ANN202
            self.seen += 1
            if self.seen == 1:
                self.comm.flush_region = lambda actor: None  # noqa: ARG005
            if self.seen == self.count:
                del self.comm.flush_region
                self.seen = 0

        def __call__(self, x):  # noqa: ANN001, ANN204
            return self.inner(x)

        def finish(self):  # noqa: ANN204
            self.inner.finish()

    def held_back_ddp(comm, module_, cap):  # noqa: ANN001, ANN202 - 3.5's signature
        return HeldBack(comm, module.wrap_ddp(comm, module_, cap), list(module_.parameters()))

    ddp_timeline = next(c for c in cases_for("3.5") if c.name.startswith("timeline"))
    ddp_timeline.run(module.wrap_ddp)
    with pytest.raises(CheckFailure, match="reported after the messages that needed it"):
        ddp_timeline.run(held_back_ddp)


# ---- a second hunt: cases that read the messages or the regions must see a right answer ------

def test_extra_messages_back_are_not_gradients_come_back() -> None:
    """4.5's in-flight count reads the messages: a 1-element message sent back after every
    activation (a GPipe executor that acknowledges each one) counted as a gradient come back
    and showed one microbatch in flight. A pipeline step's messages must be its own."""
    from mpgpu_edu.grading.checks.lesson_04.executor import IN_FLIGHT, SECONDS, _run_executor
    from mpgpu_edu.grading.checks.lesson_04.executor_judges import _judge_in_flight_messages

    e = IN_FLIGHT[0]
    facts = _data(lambda impl: _run_executor(impl, seconds=SECONDS, **e),
                  solution("ex04_pipeline").execute_schedule)
    _judge_in_flight_messages(facts, e)
    facts["sends"][1].append([0, 100_000, 4])  # an acknowledgement back to stage 0
    with pytest.raises(CheckFailure, match="and nothing else"):
        _judge_in_flight_messages(facts, e)


def _idle_executor(comm, schedule, stage, microbatches, targets, recv_shapes,  # noqa: ANN001, ANN202
                   loss_fn=None, stage_seconds=None):
    """Runs nothing: an empty region of the step's seconds per step, no message."""
    from mpgpu_edu.pipeline import steps_of

    for step in steps_of(schedule, comm.rank):
        seconds = None if stage_seconds is None else stage_seconds[step.op == "B"]
        with comm.compute("forward" if step.op == "F" else "backward", step.token,
                          seconds=seconds):
            pass
    return None


def _forward_on_zeros(comm, stage, step, n_stages, x, in_shape):  # noqa: ANN001, ANN202
    """4.4 without a message: every later stage runs on zeros."""
    import torch

    inp = x if comm.rank == 0 else torch.zeros(in_shape, requires_grad=True)
    with comm.compute("forward", step.token):
        return stage(inp)


def test_timed_and_traffic_cases_need_a_right_answer() -> None:
    """An executor that runs nothing passed 4.5's in-flight and timed cases (no message, no
    microbatch in flight; regions of the right length), a forward on zeros 4.4's timed case,
    and a ZeRO-1 step that sends nothing 5.2's traffic case. Each now judges the values
    first."""
    names = {"4.5": ("in flight", "timed"), "4.4": ("timed",), "5.2": ("traffic",)}
    fns = {"4.5": _idle_executor, "4.4": _forward_on_zeros,
           "5.2": lambda comm, params, grad, state, *a, **k: None}
    for exercise, starts in names.items():
        for case in cases_for(exercise):
            if case.name.startswith(starts):
                with pytest.raises(CheckFailure):
                    case.run(fns[exercise])


# ---- 3.2, 4.1, 8.1, 9.2: what a function did to its inputs, or shares with them ------------

def _changes_its_input(exercise: str):  # noqa: ANN202 - the exercise's function
    """The solution, but it changes what the caller handed it after computing its answer
    (8.1: negates the vector after the last rank's shard, so every shard is still right)."""
    if exercise == "3.2":
        make_buckets = solution("ex03_data_parallel").make_buckets

        def changed(sizes, bucket_bytes):  # noqa: ANN001, ANN202
            out = make_buckets(list(sizes), bucket_bytes)
            sizes.append(0)
            return out
        return changed
    if exercise == "4.1":
        balanced = solution("ex04_pipeline").balanced_boundaries

        def changed(costs, n_stages):  # noqa: ANN001, ANN202
            out = balanced(list(costs), n_stages)
            costs.reverse()
            costs.append(0)
            return out
        return changed
    if exercise == "8.1":
        shard_of = solution("ex08_bigger_models").shard_of

        def changed(flat, rank, world_size):  # noqa: ANN001, ANN202
            out = shard_of(flat, rank, world_size).clone()
            if rank == world_size - 1:
                flat.add_(1)
            return out
        return changed
    from tests.mutants.lesson_09 import recompute_marks_the_input
    return recompute_marks_the_input  # switches on the caller's x.requires_grad


@pytest.mark.parametrize(("exercise", "feedback", "words"), [
    ("3.2", "the caller's list left unchanged", "changed its input"),
    ("4.1", "the caller's costs left unchanged", "changed its input"),
    ("8.1", "each a tensor of its own, the vector left as it was", "changed its input"),
    ("9.2", "the caller's x left as it was", "changed the caller's x"),
])
def test_a_right_answer_that_changes_its_input_loses_no_points(exercise: str, feedback: str,
                                                               words: str) -> None:
    """Where the caller's input went after the call is seen only inside the learner's
    process: every scored case passes, and the feedback case (worth 0) says what changed."""
    fn = _changes_its_input(exercise)
    for case in cases_for(exercise):
        if case.points:
            case.run(fn)
    case = next(c for c in cases_for(exercise) if c.name.startswith(feedback))
    assert case.points == 0 and case.name.endswith(FEEDBACK)
    with pytest.raises(CheckFailure, match=words):
        case.run(fn)


@pytest.mark.parametrize(("exercise", "name"), [
    ("8.1", "shard_as_view"), ("8.1", "shard_view_of_padded"),
    ("9.2", "recompute_nothing"), ("9.2", "recompute_keeps_outputs"),
    ("9.2", "recompute_from_the_start"),
])
def test_memory_kept_and_forwards_run_earn_no_points(exercise: str, name: str) -> None:
    """A shard that shares the vector's (or a padded copy's) memory, a recomputation that
    keeps every activation or runs forwards again from the start: right values, so every
    scored case passes; a feedback case fails."""
    import importlib

    fn = getattr(importlib.import_module(f"tests.mutants.lesson_0{exercise[0]}"), name)
    failed = []
    for case in cases_for(exercise):
        try:
            case.run(fn)
        except CheckFailure:
            failed.append(case)
    assert failed and all(case.points == 0 and case.name.endswith(FEEDBACK)
                          for case in failed), [case.name for case in failed]
