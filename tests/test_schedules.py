"""Pipeline schedules are values: their invariants are checked on the grid, with no tensors."""

from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpgpu_edu.pipeline import (
    Schedule,
    ScheduleError,
    Step,
    bubble_fraction,
    bubble_overhead,
    dependencies,
    earliest_starts,
    from_grid,
    from_order,
    gpipe,
    interleaved_1f1b,
    makespan_ticks,
    naive,
    one_f_one_b,
    peak_activations,
    recv_from,
    render,
    send_to,
    steps_of,
    validate,
)
from mpgpu_edu.pipeline.timing import timed_bubble_overhead

BUILDERS = [gpipe, one_f_one_b]
sizes = st.tuples(st.integers(1, 8), st.integers(1, 16))


def every_step(n_stages: int, n_microbatches: int) -> Counter:
    return Counter(Step(s, m, op) for s in range(n_stages)
                   for m in range(n_microbatches) for op in "FB")


def with_cell(schedule: Schedule, device: int, tick: int, cell: Step | None) -> Schedule:
    grid = [list(row) for row in schedule.grid]
    grid[device][tick] = cell
    return Schedule(schedule.name, schedule.n_stages, schedule.n_microbatches, tuple(grid),
                    schedule.n_chunks)


# ---- the builders' invariants ------------------------------------------------------------------

@pytest.mark.parametrize("build", BUILDERS)
@given(size=sizes)
def test_builders_validate_and_hold_every_step_once(build, size):
    n_stages, n_mbs = size
    schedule = build(n_stages, n_mbs)
    validate(schedule)
    cells = Counter(step for row in schedule.grid for step in row if step is not None)
    assert cells == every_step(n_stages, n_mbs)
    assert all(step.stage == device for device in range(n_stages)
               for step in steps_of(schedule, device))


@pytest.mark.parametrize("build", BUILDERS)
@given(size=sizes)
def test_makespan_and_bubble_match_the_closed_form(build, size):
    n_stages, n_mbs = size
    schedule = build(n_stages, n_mbs)
    assert makespan_ticks(schedule) == 2 * (n_mbs + n_stages - 1)
    expected = (n_stages - 1) / (n_mbs + n_stages - 1)
    assert bubble_fraction(schedule) == pytest.approx(expected, abs=1e-12)


@given(size=sizes)
def test_gpipe_stage_0_holds_every_microbatch(size):
    n_stages, n_mbs = size
    assert peak_activations(gpipe(n_stages, n_mbs)) == [n_mbs] * n_stages


@given(size=sizes)
def test_one_f_one_b_stage_p_holds_at_most_p_minus_stage(size):
    n_stages, n_mbs = size
    peaks = peak_activations(one_f_one_b(n_stages, n_mbs))
    assert peaks[0] == min(n_stages, n_mbs) <= n_stages
    assert peaks == [min(n_stages - p, n_mbs) for p in range(n_stages)]


@given(size=sizes)
def test_one_f_one_b_warms_up_then_alternates(size):
    n_stages, n_mbs = size
    schedule = one_f_one_b(n_stages, n_mbs)
    for p in range(n_stages):
        ops = "".join(step.op for step in steps_of(schedule, p))
        warmup = min(n_stages - 1 - p, n_mbs)
        steady = n_mbs - warmup
        assert ops == "F" * warmup + "FB" * steady + "B" * warmup
        assert [s.microbatch for s in steps_of(schedule, p) if s.op == "B"] == list(range(n_mbs))


@pytest.mark.parametrize("n_stages", range(1, 7))
def test_naive_runs_one_device_at_a_time(n_stages):
    schedule = naive(n_stages)
    validate(schedule)
    assert schedule.n_microbatches == 1
    assert makespan_ticks(schedule) == 2 * n_stages
    assert bubble_fraction(schedule) == pytest.approx((n_stages - 1) / n_stages, abs=1e-12)
    busy_per_tick = [sum(row[t] is not None for row in schedule.grid)
                     for t in range(makespan_ticks(schedule))]
    assert busy_per_tick == [1] * (2 * n_stages)


def test_render_draws_devices_by_ticks():
    assert render(gpipe(2, 2)) == (
        "tick  | 0  1  2  3  4  5  |\n"
        "dev 0 | F0 F1 .  .  B0 B1 |\n"
        "dev 1 | .  F0 F1 B0 B1 .  |")
    assert str(naive(2)) == render(naive(2))


@pytest.mark.parametrize("build", BUILDERS)
def test_from_grid_reads_back_what_render_draws(build):
    schedule = build(4, 6)
    again = from_grid("drawn", render(schedule))
    assert (again.grid, again.n_stages, again.n_microbatches) == (
        schedule.grid, schedule.n_stages, schedule.n_microbatches)


def test_from_grid_accepts_a_learners_rows():
    schedule = from_grid("mine", ["F0 F1 . . B0 B1", ". F0 F1 B0 B1"])
    validate(schedule)
    assert schedule.grid == gpipe(2, 2).grid


def test_from_grid_rejects_an_unreadable_cell():
    with pytest.raises(ScheduleError, match="cannot read 'X1'"):
        from_grid("typo", ["F0 X1"])


def test_dependencies_and_peers_describe_the_data_flow():
    assert dependencies(Step(0, 3, "F"), 4) == ()
    assert dependencies(Step(2, 3, "F"), 4) == (Step(1, 3, "F"),)
    assert dependencies(Step(3, 3, "B"), 4) == (Step(3, 3, "F"),)
    assert dependencies(Step(1, 3, "B"), 4) == (Step(1, 3, "F"), Step(2, 3, "B"))
    assert [recv_from(Step(s, 0, "F"), 3) for s in range(3)] == [None, 0, 1]
    assert [send_to(Step(s, 0, "F"), 3) for s in range(3)] == [1, 2, None]
    assert [recv_from(Step(s, 0, "B"), 3) for s in range(3)] == [1, 2, None]
    assert [send_to(Step(s, 0, "B"), 3) for s in range(3)] == [None, 0, 1]


def test_an_order_that_waits_on_itself_is_reported():
    with pytest.raises(ScheduleError, match="dev 0 cannot run B\\(stage 0, mb 0\\)"):
        from_order("stuck", [[Step(0, 0, "B"), Step(0, 0, "F")]])
    with pytest.raises(ScheduleError, match="can never finish"):
        earliest_starts([[Step(0, 0, "F"), Step(0, 0, "B")], [Step(1, 1, "F")]], lambda s: 1)


def test_from_order_keeps_each_step_where_the_order_put_it():
    with pytest.raises(ScheduleError, match="appears twice in the orders"):
        from_order("twice", [[Step(0, 0, "F"), Step(0, 0, "F"), Step(0, 0, "B")]])
    stray = Step(0, 0, "B")
    misplaced = from_order("wrong row", [[Step(0, 0, "F")],
                                         [Step(1, 0, "F"), Step(1, 0, "B"), stray]])
    assert steps_of(misplaced, 0) == [Step(0, 0, "F")]
    assert misplaced.grid[1][3] == stray
    with pytest.raises(ScheduleError, match="sits on dev 1"):
        validate(misplaced)


def test_builders_reject_empty_pipelines():
    with pytest.raises(ValueError, match="at least 1 stage"):
        gpipe(0, 4)
    with pytest.raises(ValueError, match="at least 1 stage and 1 microbatch"):
        one_f_one_b(2, 0)


# ---- corrupted schedules are rejected, with the grid and the bad step marked ------------------

def test_swapped_steps_break_a_dependency():
    schedule = from_grid("swapped", ["F0 F1 . . B1 B0", ". F0 F1 B0 B1"])
    with pytest.raises(ScheduleError) as error:
        validate(schedule)
    message = str(error.value)
    assert "B(stage 0, mb 1) at tick 4 runs before B(stage 1, mb 1) finishes" in message
    assert "can start at tick 5 at the earliest" in message
    assert "dev 0 | F0 F1 .  .  [B1]! B0" in message
    assert "dev 1 | .  F0 F1 B0 B1" in message


def test_a_forward_before_its_input_arrives_is_marked():
    schedule = from_grid("early", ["F0 F1 . . B0 B1", "F0 F1 . B0 B1"])
    with pytest.raises(ScheduleError, match=r"F\(stage 1, mb 0\) at tick 0 runs before") as error:
        validate(schedule)
    assert "[F0]!" in str(error.value) and "tick  |" in str(error.value)


@given(size=sizes, data=st.data())
def test_a_dropped_step_is_missing(size, data):
    schedule = data.draw(st.sampled_from(BUILDERS))(*size)
    device = data.draw(st.integers(0, size[0] - 1))
    tick = data.draw(st.sampled_from([t for t, s in enumerate(schedule.grid[device]) if s]))
    dropped = schedule.grid[device][tick]
    with pytest.raises(ScheduleError, match="is missing") as error:
        validate(with_cell(schedule, device, tick, None))
    assert f"{dropped} is missing: put {dropped.token} in dev {device}'s row" in str(error.value)


@given(size=sizes, data=st.data())
def test_a_duplicated_step_is_marked_twice(size, data):
    schedule = data.draw(st.sampled_from(BUILDERS))(*size)
    device = data.draw(st.integers(0, size[0] - 1))
    step = data.draw(st.sampled_from(steps_of(schedule, device)))
    grid = [list(row) + [step if d == device else None] for d, row in enumerate(schedule.grid)]
    doubled = Schedule("doubled", schedule.n_stages, schedule.n_microbatches, tuple(grid))
    with pytest.raises(ScheduleError, match="appears twice") as error:
        validate(doubled)
    assert str(error.value).count(f"[{step.token}]!") == 2


@given(size=sizes.filter(lambda size: size[0] > 1), data=st.data())
def test_a_step_on_the_wrong_device_is_marked(size, data):
    schedule = data.draw(st.sampled_from(BUILDERS))(*size)
    step = data.draw(st.sampled_from(steps_of(schedule, 0)))
    tick = schedule.grid[0].index(step)
    grid = [list(row) + [None] for row in schedule.grid]
    grid[0][tick], grid[1][-1] = None, step
    moved = Schedule("moved", schedule.n_stages, schedule.n_microbatches, tuple(grid))
    with pytest.raises(ScheduleError, match="sits on dev 1, but stage 0 runs on dev 0") as error:
        validate(moved)
    assert f"[{step.token}]!" in str(error.value)


def test_rows_and_microbatches_must_fit_the_schedule():
    with pytest.raises(ScheduleError, match="2 rows for 3 stages"):
        validate(Schedule("short", 3, 1, gpipe(2, 1).grid))
    with pytest.raises(ScheduleError, match="microbatch 2 is outside 0..1"):
        validate(from_grid("extra", ["F0 F1 F2 B0 B1 B2"], n_microbatches=2))


# ---- interleaved 1F1B (virtual stages) ------------------------------------------------------

INTERLEAVED = [(p, v, m) for p in (2, 3, 4) for v in (1, 2, 3) for m in (p, 2 * p, 3 * p)]


@pytest.mark.parametrize("n_stages, n_chunks, n_mb", INTERLEAVED)
def test_interleaved_bubble_is_the_closed_form(n_stages, n_chunks, n_mb):
    """Valid, and its bubble costs (P-1)/(V M) of the compute time exactly, in unit ticks
    and with a backward twice a forward (each chunk step 1/V of a stage's work)."""
    schedule = interleaved_1f1b(n_stages, n_mb, n_chunks)
    validate(schedule)
    expected = Fraction(n_stages - 1, n_chunks * n_mb)
    assert Fraction(bubble_overhead(schedule)).limit_denominator(1000) == expected
    timed = timed_bubble_overhead(schedule, Fraction(1, n_chunks), Fraction(2, n_chunks))
    assert timed == expected
    idle = Fraction(n_stages - 1, n_chunks * n_mb + n_stages - 1)
    assert Fraction(bubble_fraction(schedule)).limit_denominator(1000) == idle


def test_interleaved_with_one_chunk_is_1f1b():
    for p, m in [(2, 4), (3, 6), (4, 8)]:
        assert interleaved_1f1b(p, m, 1).grid == one_f_one_b(p, m).grid


def test_interleaved_beats_1f1b_and_pays_in_activations():
    """The bubble shrinks V-fold; each device holds more microbatch-chunks at its peak."""
    plain, inter = one_f_one_b(4, 8), interleaved_1f1b(4, 8, 2)
    assert bubble_overhead(inter) == pytest.approx(bubble_overhead(plain) / 2)
    assert max(peak_activations(inter)) > max(peak_activations(plain))


def test_interleaved_steps_name_their_chunk_and_wrap_around():
    schedule = interleaved_1f1b(2, 2, 2)
    assert schedule.n_chunks == 2
    assert {step.chunk for step in steps_of(schedule, 0)} == {0, 1}
    # virtual stage 2 (chunk 1 on dev 0) takes its input from virtual stage 1 (dev 1)
    assert dependencies(Step(0, 0, "F", 1), 2, 2) == (Step(1, 0, "F", 0),)
    assert recv_from(Step(0, 0, "F", 1), 2, 2) == 1 and send_to(Step(1, 0, "F"), 2, 2) == 0
    assert recv_from(Step(1, 0, "B", 0), 2, 2) == 0 and send_to(Step(0, 0, "B", 1), 2, 2) == 1
    assert send_to(Step(1, 0, "F", 1), 2, 2) is None  # the loss
    text = render(schedule)
    assert "F0.0" in text and "B1.1" in text
    assert from_grid("redrawn", text).grid == schedule.grid


def test_interleaved_validation_names_the_chunk():
    schedule = interleaved_1f1b(2, 2, 2)
    row = list(schedule.grid[0])
    first_chunk1 = next(t for t, s in enumerate(row) if s is not None and s.chunk == 1)
    swapped = with_cell(schedule, 0, first_chunk1, Step(0, 0, "F", 2))
    with pytest.raises(ScheduleError, match="chunk 2 is outside 0..1"):
        validate(swapped)
    early = from_grid("early", ["F0.1 F0.0 . . ", ". F0.0"], n_microbatches=1)
    with pytest.raises(ScheduleError, match="runs before"):
        validate(early)


@pytest.mark.parametrize("args, message", [
    ((4, 6, 2), "not a multiple of 4"),
    ((2, 4, 0), "at least 1 chunk"),
    ((0, 4, 2), "at least 1 stage"),
])
def test_interleaved_refuses_bad_sizes(args, message):
    with pytest.raises(ValueError, match=message):
        interleaved_1f1b(*args)
