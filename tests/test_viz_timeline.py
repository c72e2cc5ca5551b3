"""Timeline figures, checked by what they contain (bars, labels, colours), not by pixels."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from mpgpu_edu.cluster.trace import CATEGORIES, KINDS, Event, Trace  # noqa: E402
from mpgpu_edu.viz import palette  # noqa: E402
from mpgpu_edu.viz.lanes import BAR_HEIGHT, MAX_LANES, assign_lanes, count_badge  # noqa: E402
from mpgpu_edu.viz.timeline import (  # noqa: E402
    idle_gaps, plot_timeline, plot_timelines_side_by_side,
)

MS = 1e-3


def two_devices() -> Trace:
    """dev 0 works 0-2 ms of 4 (idle 50%); dev 1 works 1-4 ms (idle 25%)."""
    return Trace(2, [
        Event(0, "compute", "forward", 0 * MS, 1 * MS, "F0"),
        Event(0, "compute", "forward", 1 * MS, 2 * MS, "F1"),
        Event(0, "comm", "send", 2 * MS, 2.5 * MS, "a0", 1024, peer=1),
        Event(1, "comm", "recv", 2 * MS, 2.5 * MS, "a0", 1024, peer=0),
        Event(1, "compute", "forward", 1 * MS, 2 * MS, "F0"),
        Event(1, "compute", "backward", 2 * MS, 4 * MS, "B0"),
    ])


def events_by_gid(ax, prefix: str) -> list:
    return [p for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


def texts(ax, gid: str) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_gid() == gid]


# ---- palette ---------------------------------------------------------------------------------
def test_palette_names_every_kind_and_category_with_distinct_colours() -> None:
    assert set(KINDS) <= set(palette.COLORS) and set(CATEGORIES) <= set(palette.COLORS)
    assert len({palette.KIND_COLORS[k] for k in KINDS}) == len(KINDS)
    assert len({palette.MEMORY_COLORS[c] for c in CATEGORIES}) == len(CATEGORIES)
    assert palette.KIND_COLORS["optimizer"] == palette.MEMORY_COLORS["optimizer"]
    assert set(palette.COLORS.values()) <= set(palette.OKABE_ITO.values()) | {palette.IDLE_COLOR}
    with pytest.raises(KeyError, match="known names"):
        palette.color("warp drive")


def test_a_log_axis_draws_its_mathematics_without_font_warnings(caplog) -> None:
    assert palette._register_bundled_fonts() == 0  # done when the palette was imported
    fig = palette.new_figure(4, 3)
    ax = fig.add_subplot()
    ax.plot([1, 2, 3], [0.02, 0.1, 0.05])
    ax.set_yscale("log")
    ax.set_title(r"$\alpha + S / \beta$")
    with caplog.at_level("WARNING", logger="matplotlib.font_manager"):
        FigureCanvasAgg(fig).draw()
    assert not [r for r in caplog.records if "findfont" in r.getMessage()]


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"), (2.5, "2.5 s"), (0.0123, "12.3 ms"), (4.5e-6, "4.5 µs"), (3e-9, "3 ns"),
    (0.25, "250 ms"), (1e-3, "1 ms"),
])
def test_format_seconds_picks_the_unit(seconds: float, text: str) -> None:
    assert palette.format_seconds(seconds) == text


# ---- one timeline ----------------------------------------------------------------------------
def test_rows_bars_and_colours() -> None:
    trace = two_devices()
    fig = plot_timeline(trace)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["dev 0 compute", "dev 0 comm", "dev 1 compute", "dev 1 comm"]
    bars = events_by_gid(ax, "event:")
    assert len(bars) == len(trace.events)
    for bar in bars:
        kind = bar.get_gid().split(":")[1]
        assert bar.get_facecolor() == to_rgba(palette.KIND_COLORS[kind])
    assert fig.get_size_inches()[1] == pytest.approx(0.6 * 4 + 1.5)


def test_idle_percentage_matches_the_trace() -> None:
    trace = two_devices()
    assert trace.idle_fraction(0) == pytest.approx(0.5)
    ax = plot_timeline(trace).axes[0]
    assert texts(ax, "idle-label") == ["idle 50%", "idle 25%"]


def test_idle_gaps_are_hatched_on_compute_rows_only() -> None:
    trace = two_devices()
    ax = plot_timeline(trace).axes[0]
    idle = events_by_gid(ax, "idle")
    spans = sorted((round(p.get_x() / MS, 6), round(p.get_width() / MS, 6)) for p in idle)
    assert spans == [(0.0, 1.0), (2.0, 2.0)]  # dev 1 waits 0-1 ms, dev 0 waits 2-4 ms
    assert all(p.get_hatch() == palette.IDLE_HATCH for p in idle)
    compute_rows = {0, 2}
    assert {round(p.get_y() + p.get_height() / 2) for p in idle} <= compute_rows
    assert not events_by_gid(plot_timeline(trace, show_idle=False).axes[0], "idle")
    assert idle_gaps([], 3.0) == [(0.0, 3.0)]


def test_overlapping_send_and_recv_split_into_half_lanes() -> None:
    trace = Trace(1, [Event(0, "comm", "send", 0, 2 * MS, "s"),
                      Event(0, "comm", "recv", 1 * MS, 3 * MS, "r")])
    ax = plot_timeline(trace).axes[0]
    send, = events_by_gid(ax, "event:send")
    recv, = events_by_gid(ax, "event:recv")
    assert send.get_height() == recv.get_height() == pytest.approx(BAR_HEIGHT / 2)
    assert send.get_y() < recv.get_y()  # the y axis points down: send is the upper lane
    alone = plot_timeline(two_devices()).axes[0]
    assert all(p.get_height() == pytest.approx(BAR_HEIGHT)
               for p in events_by_gid(alone, "event:"))


def server_row(workers: int = 7) -> Trace:
    """A server's comm row: gradients in one after the other, then the parameters out to
    every worker at once (they share the port and end together); each worker's row holds
    its own send and receive."""
    s = workers
    events = []
    for w in range(workers):
        events.append(Event(s, "comm", "recv", w * MS, (w + 0.8) * MS, f"from {w}", peer=w))
        events.append(Event(w, "comm", "send", w * MS, (w + 0.8) * MS, f"to {s}", peer=s))
        events.append(Event(s, "comm", "send", 8 * MS, 14 * MS, f"to {w}", peer=w))
        events.append(Event(w, "comm", "recv", 8 * MS, 14 * MS, f"from {s}", peer=s))
    return Trace(workers + 1, events)


def spans_y(patches) -> list[tuple[float, float]]:
    return sorted((p.get_y(), p.get_y() + p.get_height()) for p in patches)


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_concurrent_messages_of_one_kind_take_their_own_sub_lanes(workers: int) -> None:
    ax = plot_timeline(server_row(workers), streams=("comm",)).axes[0]
    server = workers
    out = [p for p in events_by_gid(ax, "event:send")
           if abs(p.get_y() + p.get_height() / 2 - server) < 0.5]
    assert len(out) == workers
    spans = spans_y(out)
    assert len({round(a, 9) for a, _ in spans}) == workers, "every send has its own y"
    assert all(b1 <= a2 + 1e-9 for (_, b1), (a2, _) in zip(spans, spans[1:])), "no overlap"
    assert spans[0][0] >= server - BAR_HEIGHT / 2 - 1e-9
    assert spans[-1][1] <= server + BAR_HEIGHT / 2 + 1e-9, "the row keeps its height"
    # the server's receives follow each other: each is one full-height bar
    ins = [p for p in events_by_gid(ax, "event:recv")
           if abs(p.get_y() + p.get_height() / 2 - server) < 0.5]
    assert [p.get_height() for p in ins] == [pytest.approx(BAR_HEIGHT)] * workers


def test_a_group_whose_labels_do_not_fit_is_counted_once() -> None:
    ax = plot_timeline(server_row(7), streams=("comm",)).axes[0]
    assert texts(ax, "lane-count") == ["\u00d77 to 0..6"]
    assert "to 3" not in texts(ax, "bar-label")


def test_labels_never_overlap() -> None:
    trace = server_row(7)
    trace.events.extend([  # a send and a receive at once, and two long sends at once
        Event(0, "comm", "send", 15 * MS, 40 * MS, "to 5", peer=5),
        Event(0, "comm", "recv", 15 * MS, 40 * MS, "from 6", peer=6),
        Event(1, "comm", "send", 15 * MS, 40 * MS, "to 2", peer=2),
        Event(1, "comm", "send", 16 * MS, 39 * MS, "to 3", peer=3),
    ])
    for fig in (plot_timeline(trace), plot_timeline(trace, streams=("comm",)),
                plot_timelines_side_by_side({"a": trace, "b": server_row(3)})):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        for ax in fig.axes:
            shown = [t for t in ax.texts if t.get_gid() in ("bar-label", "lane-count")]
            assert shown
            boxes = [t.get_window_extent(renderer) for t in shown]
            for i, a in enumerate(boxes):
                for j in range(i + 1, len(boxes)):
                    assert not a.overlaps(boxes[j]), (shown[i].get_text(), shown[j].get_text())


def test_greedy_lanes_and_badges() -> None:
    events = [Event(0, "comm", "send", a * MS, b * MS, f"to {k}")
              for k, (a, b) in enumerate([(0, 4), (1, 2), (2, 3), (3, 5), (1, 6)])]
    lanes, n = assign_lanes(events)
    assert n == 3  # at most three run at once
    assert lanes == [0, 1, 1, 1, 2]  # a lane is reused once its message has ended
    for k, a in enumerate(events):
        for b, lane in zip(events[k + 1:], lanes[k + 1:]):
            if a.start < b.end and b.start < a.end:
                assert lanes[k] != lane
    assert count_badge(events) == "\u00d75 to 0..4"
    assert count_badge([Event(0, "comm", "send", 0, 1, f"to {r}") for r in (0, 2, 3, 4, 7)]) \
        == "\u00d75 to 0,2..4,7"
    assert count_badge([Event(0, "comm", "send", 0, 1, "bucket")] * 2) == "\u00d72 bucket"
    assert count_badge([Event(0, "comm", "send", 0, 1, "a"), Event(0, "comm", "send", 0, 1)]) \
        == "\u00d72"


def test_very_many_at_once_stay_inside_the_row() -> None:
    n = MAX_LANES + 4
    trace = Trace(1, [Event(0, "comm", "send", 0, 1 * MS, f"to {k}") for k in range(n)])
    ax = plot_timeline(trace, streams=("comm",)).axes[0]
    spans = spans_y(events_by_gid(ax, "event:send"))
    assert len(spans) == n
    assert len({round(a, 9) for a, _ in spans}) == MAX_LANES
    assert min(a for a, _ in spans) >= -BAR_HEIGHT / 2 - 1e-9
    assert max(b for _, b in spans) <= BAR_HEIGHT / 2 + 1e-9
    assert texts(ax, "lane-count") == [f"\u00d7{n} to 0..{n - 1}"]


def test_legend_lists_the_kinds_present_in_palette_order() -> None:
    ax = plot_timeline(two_devices()).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "forward", "backward", "send", "recv", "idle"]


def test_time_axis_has_units() -> None:
    fig = plot_timeline(two_devices())
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (ms)"
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "0" in ticks and "4" in ticks
    fast = Trace(1, [Event(0, "compute", "compute", 0, 40e-6)])
    assert plot_timeline(fast).axes[0].get_xlabel() == "time (µs)"


def test_bar_labels_only_where_they_fit() -> None:
    trace = Trace(1, [Event(0, "compute", "forward", 0, 1.0, "F3"),
                      Event(0, "compute", "backward", 1.0, 1.0005, "B3")])
    ax = plot_timeline(trace).axes[0]
    assert texts(ax, "bar-label") == ["F3"]


def test_a_later_chunks_step_keeps_its_microbatch_where_its_full_label_does_not_fit() -> None:
    """Interleaved 1F1B's "B3.1" (microbatch 3 through chunk 1, its colour the odd chunk's)
    shows "B3" in a bar too narrow for four characters, so a microbatch can be followed round
    the devices; where it fits, the whole label."""
    narrow = Trace(1, [Event(0, "compute", "backward, odd chunk", 0, 1.0, "B3.1"),
                       Event(0, "compute", "backward", 1.0, 33.0, "B4.1")])
    ax = plot_timeline(narrow).axes[0]
    assert texts(ax, "bar-label") == ["B3", "B4.1"]


def test_picked_devices_streams_and_names() -> None:
    ax = plot_timeline(two_devices(), devices=[1], streams=("compute",),
                       device_names={1: "cuda:0 (GPU 3)"}).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["cuda:0 (GPU 3) compute"]
    assert texts(ax, "idle-label") == ["idle 25%"]


def test_draws_into_a_given_axes_and_survives_an_empty_trace() -> None:
    fig = Figure()
    ax = fig.add_subplot()
    assert plot_timeline(Trace(2), ax=ax, title="nothing yet") is fig
    assert ax.get_title(loc="left") == "nothing yet"
    assert texts(ax, "idle-label") == []


# ---- several timelines -----------------------------------------------------------------------
def test_side_by_side_shares_the_time_axis() -> None:
    short = Trace(1, [Event(0, "compute", "forward", 0, 1 * MS)])
    fig = plot_timelines_side_by_side({"1F1B": short, "GPipe": two_devices()})
    top, bottom = fig.axes
    assert top.get_shared_x_axes().joined(top, bottom)
    assert top.get_xlim() == bottom.get_xlim() == pytest.approx((0, 4 * MS))
    assert top.get_title(loc="left").startswith("1F1B: makespan 1 ms")
    assert bottom.get_title(loc="left").startswith("GPipe: makespan 4 ms")
    assert [line.get_xdata()[0] for line in top.get_lines()] == [pytest.approx(1 * MS)]
    assert texts(top, "idle-label") == ["idle 0%"]


def test_side_by_side_without_sharing() -> None:
    short = Trace(1, [Event(0, "compute", "forward", 0, 1 * MS)])
    top, bottom = plot_timelines_side_by_side({"a": short, "b": two_devices()},
                                              share_x=False).axes
    assert top.get_xlim() == pytest.approx((0, 1 * MS))
    assert bottom.get_xlim() == pytest.approx((0, 4 * MS))
    with pytest.raises(ValueError):
        plot_timelines_side_by_side({})
