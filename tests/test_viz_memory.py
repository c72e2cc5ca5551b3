"""Memory figures, checked by what they contain (bars, totals, OOM marks), not by pixels."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from mpgpu_edu.cluster.trace import Event, MemoryEvent, Trace  # noqa: E402
from mpgpu_edu.viz import palette  # noqa: E402
from mpgpu_edu.viz.memory import (  # noqa: E402
    capacity_text, plot_memory_bars, plot_memory_compare, plot_memory_over_time,
)

GiB = 2**30
REPLICA = {"parameters": 4 * GiB, "gradients": 4 * GiB, "optimizer": 8 * GiB}


def texts(ax, gid: str) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_gid() == gid]


def memory_trace(activation_steps: list[int]) -> Trace:
    """Device 0 holds 1 GiB of parameters from t=0, then gains and frees activations each ms;
    device 1 holds 2 GiB of parameters. Runs to 10 ms."""
    mem, total = [], 0
    mem.append(MemoryEvent(0, 0.0, "parameters", GiB, "w", GiB))
    total = GiB
    for i, delta in enumerate(activation_steps):
        total += delta
        mem.append(MemoryEvent(0, (i + 1) * 1e-3, "activations", delta, f"F{i}", total))
    mem.append(MemoryEvent(1, 0.0, "parameters", 2 * GiB, "w", 2 * GiB))
    return Trace(2, [Event(0, "compute", "forward", 0, 10e-3)], mem)


# ---- units -----------------------------------------------------------------------------------
@pytest.mark.parametrize("nbytes, text", [
    (0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"), (24 * GiB, "24 GiB"), (3 * 2**20, "3 MiB"),
])
def test_format_bytes(nbytes: int, text: str) -> None:
    assert palette.format_bytes(nbytes) == text


def test_capacity_text_explains_spec_sheet_gigabytes() -> None:
    assert capacity_text(24 * 10**9) == "24 GB = 22.4 GiB"
    assert capacity_text(80 * GiB) == "80 GiB"


# ---- bars ------------------------------------------------------------------------------------
def test_stacked_bars_by_category_in_palette_colours() -> None:
    per_device = [REPLICA, {**REPLICA, "activations": 2 * GiB}]
    ax = plot_memory_bars(per_device, None).axes[0]
    bars = [p for p in ax.patches if (p.get_gid() or "").startswith("memory:")]
    assert len(bars) == 2 * 4  # two devices x four categories present
    for bar in bars:
        assert bar.get_facecolor() == to_rgba(palette.MEMORY_COLORS[bar.get_gid()[7:]])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dev 0", "dev 1"]
    assert texts(ax, "total") == ["16 GiB", "18 GiB"]
    assert ax.get_ylabel() == "memory (GiB)"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["activations", "optimizer", "gradients", "parameters"]  # as stacked


def test_oom_only_where_the_total_exceeds_capacity() -> None:
    per_device = {"dev 0": REPLICA, "dev 1": {"parameters": 4 * GiB}}
    ax = plot_memory_bars(per_device, 24 * 10**9, capacity_label="RTX 4090").axes[0]
    assert texts(ax, "oom") == []
    assert ax.get_legend().get_texts()[0].get_text() == "RTX 4090: 24 GB = 22.4 GiB"
    tight = plot_memory_bars(per_device, 15 * GiB).axes[0]
    oom = [t for t in tight.texts if t.get_gid() == "oom"]
    assert len(oom) == 1 and oom[0].get_text() == "OOM"
    assert oom[0].xy[0] == 0  # above dev 0's bar (16 GiB), not dev 1's (4 GiB)
    assert to_rgba(oom[0].get_color()) == to_rgba(palette.WARNING_COLOR)


def test_one_capacity_per_device() -> None:
    fig = plot_memory_bars({"A100": REPLICA, "RTX 4090": REPLICA}, [80 * 10**9, 15 * GiB])
    ax = fig.axes[0]
    assert len([t for t in ax.texts if t.get_gid() == "oom"]) == 1
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0].startswith("A100\ncapacity") and "15 GiB" in ticks[1]
    with pytest.raises(ValueError, match="capacities"):
        plot_memory_bars([REPLICA], [GiB, GiB])


def test_no_capacity_no_line() -> None:
    ax = plot_memory_bars([REPLICA], None).axes[0]
    assert not [a for a in (*ax.lines, *ax.collections) if a.get_gid() == "capacity"]
    assert texts(ax, "oom") == []


# ---- over time -------------------------------------------------------------------------------
def test_memory_over_time_stacks_one_device() -> None:
    trace = memory_trace([GiB, GiB, -2 * GiB])
    ax = plot_memory_over_time(trace, [0]).axes[0]
    areas = [c for c in ax.collections if (c.get_gid() or "").startswith("memory:")]
    assert [c.get_gid() for c in areas] == ["memory:parameters", "memory:activations"]
    for area in areas:
        assert tuple(area.get_facecolor()[0]) == to_rgba(palette.MEMORY_COLORS[area.get_gid()[7:]])
    assert texts(ax, "peak") == [f"peak {palette.format_bytes(trace.peak_memory(0))}"]
    assert ax.get_xlabel() == "time (ms)"
    assert ax.get_xlim() == pytest.approx((0, 10e-3))


def test_memory_over_time_lines_per_device() -> None:
    trace = memory_trace([GiB])
    ax = plot_memory_over_time(trace, capacity_bytes=4 * GiB).axes[0]
    steps = [line for line in ax.get_lines() if line.get_gid() != "capacity"]
    assert len(steps) == 2
    assert max(steps[0].get_ydata()) == trace.peak_memory(0) == 2 * GiB
    assert steps[0].get_xdata()[-1] == pytest.approx(trace.makespan)  # held to the end
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["capacity: 4 GiB", "dev 0 (peak 2 GiB)", "dev 1 (peak 2 GiB)"]
    assert [line.get_ydata()[0] for line in ax.get_lines() if line.get_gid() == "capacity"] \
        == [4 * GiB]
    with pytest.raises(ValueError):
        plot_memory_over_time(trace, stacked=True)


def test_memory_compare_shares_the_y_axis() -> None:
    gpipe, one_f_one_b = memory_trace([GiB, GiB, GiB, -3 * GiB]), memory_trace([GiB, -GiB])
    fig = plot_memory_compare({"GPipe": gpipe, "1F1B": one_f_one_b}, device=0)
    left, right = fig.axes
    assert left.get_shared_y_axes().joined(left, right)
    assert left.get_ylim() == right.get_ylim()
    assert left.get_title(loc="left") == "GPipe: dev 0, peak 4 GiB"
    assert right.get_title(loc="left") == "1F1B: dev 0, peak 2 GiB"
