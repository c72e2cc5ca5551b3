"""Schedules on the clock: the closed-form bubble, unequal stages, sends."""

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpgpu_edu.pipeline import ScheduleError, from_grid, gpipe, naive, one_f_one_b
from mpgpu_edu.pipeline.timing import schedule_timeline, timed_bubble_fraction, timeline_trace

BUILDERS = [gpipe, one_f_one_b]
ALL_SIZES = [(p, m) for p in range(1, 7) for m in range(1, 13)]


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("backward_per_forward", [1, 2])
def test_timed_bubble_is_exactly_p_minus_1_over_m_plus_p_minus_1(build, backward_per_forward):
    forward = Fraction(3, 7)
    for n_stages, n_mbs in ALL_SIZES:
        bubble = timed_bubble_fraction(build(n_stages, n_mbs), forward,
                                       backward_per_forward * forward, send_s=Fraction(0))
        assert bubble == Fraction(n_stages - 1, n_mbs + n_stages - 1), (n_stages, n_mbs)


@pytest.mark.parametrize("build", BUILDERS)
def test_timed_bubble_with_float_seconds(build):
    for n_stages, n_mbs in ALL_SIZES:
        bubble = timed_bubble_fraction(build(n_stages, n_mbs), 0.013, 0.026)
        assert bubble == pytest.approx((n_stages - 1) / (n_mbs + n_stages - 1), abs=1e-12)


@pytest.mark.parametrize("build", BUILDERS)
@given(size=st.tuples(st.integers(1, 6), st.integers(1, 10)))
def test_unit_times_reproduce_the_grid(build, size):
    schedule = build(*size)
    for timed in schedule_timeline(schedule, 1, 1):
        assert schedule.grid[timed.device][timed.start] == timed.step
        assert timed.end == timed.start + 1


def test_naive_timed_bubble():
    for n_stages in range(1, 7):
        bubble = timed_bubble_fraction(naive(n_stages), Fraction(1), Fraction(2), Fraction(0))
        assert bubble == Fraction(n_stages - 1, n_stages)


def test_unequal_stages_follow_the_slowest():
    # dev 0: F0 0-1, F1 1-2, B0 9-11, B1 13-15; dev 1: F0 1-3, F1 3-5, B0 5-9, B1 9-13
    timeline = schedule_timeline(gpipe(2, 2), forward_s=[1, 2], backward_s=[2, 4])
    spans = {(t.device, t.step.token): (t.start, t.end) for t in timeline}
    assert spans == {(0, "F0"): (0, 1), (0, "F1"): (1, 2), (0, "B0"): (9, 11),
                     (0, "B1"): (13, 15), (1, "F0"): (1, 3), (1, "F1"): (3, 5),
                     (1, "B0"): (5, 9), (1, "B1"): (9, 13)}
    assert [t.start for t in timeline] == sorted(t.start for t in timeline)


def test_sends_delay_only_cross_device_dependencies():
    timeline = schedule_timeline(gpipe(2, 1), 1.0, 1.0, send_s=0.5)
    spans = [(t.device, t.step.token, t.start, t.end) for t in timeline]
    assert spans == [(0, "F0", 0.0, 1.0), (1, "F0", 1.5, 2.5), (1, "B0", 2.5, 3.5),
                     (0, "B0", 4.0, 5.0)]


@given(size=st.tuples(st.integers(1, 6), st.integers(1, 10)),
       forward=st.integers(1, 9).map(Fraction), backward=st.integers(1, 9).map(Fraction))
def test_gpipe_and_one_f_one_b_take_m_plus_p_minus_1_rounds(size, forward, backward):
    n_stages, n_mbs = size
    end = {build: max(t.end for t in schedule_timeline(build(n_stages, n_mbs), forward,
                                                       backward))
           for build in BUILDERS}
    assert end[gpipe] == end[one_f_one_b] == (n_mbs + n_stages - 1) * (forward + backward)


def test_per_stage_times_must_match_the_stages():
    with pytest.raises(ValueError, match="forward_s has 2 values for 3 stages"):
        schedule_timeline(gpipe(3, 2), [1, 2], 1)


def test_an_invalid_schedule_is_not_timed():
    with pytest.raises(ScheduleError, match="is missing"):
        schedule_timeline(from_grid("half", ["F0"]), 1, 1)


def test_timeline_becomes_a_trace():
    timeline = schedule_timeline(one_f_one_b(3, 4), 1.0, 2.0)
    trace = timeline_trace(timeline, n_devices=3)
    assert trace.makespan == (4 + 3 - 1) * 3.0
    assert {e.kind for e in trace.events} == {"forward", "backward"}
    assert len(trace.events) == 3 * 4 * 2
    assert all(e.stream == "compute" for e in trace.events)
