"""Scaling figures, checked by what they contain (curves, ideal line, warnings), not by pixels."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from mpgpu_edu.viz import palette  # noqa: E402
from mpgpu_edu.viz.scaling import (  # noqa: E402
    SLOWER, plot_allreduce_vs_size, plot_scaling, speedups,
)

HEAVY = {1: 8.0, 2: 4.4, 4: 2.5, 8: 1.6}    # seconds per step: scales well
LIGHT = {1: 0.010, 2: 0.012, 4: 0.009, 8: 0.02}  # slower with 2 and 8 devices


def warnings(ax) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_gid() == "slower-label"]


def line(ax, label: str):
    return next(li for li in ax.get_lines() if li.get_label() == label)


def test_speedups_are_relative_to_one_device() -> None:
    assert speedups({4: 2.0, 1: 8.0, 2: 4.0}) == {1: 1.0, 2: 2.0, 4: 4.0}
    with pytest.raises(ValueError, match="1-device"):
        speedups({2: 1.0, 4: 0.5})


def test_speedup_curves_and_ideal_line() -> None:
    ax = plot_scaling({"heavy model, NVLink": HEAVY}).axes[0]
    heavy = line(ax, "heavy model, NVLink")
    assert list(heavy.get_xdata()) == [1, 2, 4, 8]
    assert list(heavy.get_ydata()) == pytest.approx([1, 8 / 4.4, 8 / 2.5, 8 / 1.6])
    assert list(line(ax, "ideal").get_ydata()) == [1, 2, 4, 8]
    assert warnings(ax) == []
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    assert "speedup" in ax.get_ylabel()


def test_slower_than_one_device_is_marked_only_when_it_happens() -> None:
    ax = plot_scaling({"heavy": HEAVY, "light model, PCIe": LIGHT}).axes[0]
    assert warnings(ax) == [SLOWER] == ["slower than 1 device"]
    circled, = [c for c in ax.collections if c.get_gid() == "slower"]
    assert sorted(x for x, _ in circled.get_offsets()) == [2, 8]
    assert to_rgba(circled.get_edgecolor()[0]) == to_rgba(palette.WARNING_COLOR)
    two_light = plot_scaling({"a": LIGHT, "b": LIGHT}).axes[0]
    assert warnings(two_light) == [SLOWER, SLOWER]  # one per series


def test_efficiency() -> None:
    ax = plot_scaling({"light": LIGHT}, metric="efficiency", title="DDP").axes[0]
    light = line(ax, "light")
    expected = [speedup / n for n, speedup in speedups(LIGHT).items()]
    assert list(light.get_ydata()) == pytest.approx(expected)
    assert list(line(ax, "ideal").get_ydata()) == [1, 1, 1, 1]
    assert warnings(ax) == [SLOWER]
    assert ax.get_title(loc="left") == "DDP"
    with pytest.raises(ValueError, match="metric"):
        plot_scaling({"light": LIGHT}, metric="throughput")


def test_allreduce_vs_size_is_log_log_in_palette_colours() -> None:
    sizes = [2**k for k in range(10, 31, 4)]
    results = {name: {s: 1e-5 + s / 1e9 * f for s in sizes}
               for name, f in (("naive", 3.0), ("tree", 2.0), ("ring all-reduce", 1.5))}
    fig = plot_allreduce_vs_size(results)
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert to_rgba(line(ax, "naive").get_color()) == to_rgba(palette.ALGORITHM_COLORS["naive"])
    assert to_rgba(line(ax, "tree").get_color()) == to_rgba(palette.ALGORITHM_COLORS["tree"])
    ring = line(ax, "ring all-reduce")
    assert to_rgba(ring.get_color()) == to_rgba(palette.ALGORITHM_COLORS["ring"])
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert {"1 KiB", "1 MiB", "1 GiB"} <= set(ticks) and len(ticks) <= 11
    ylabels = " ".join(t.get_text() for t in ax.get_yticklabels())
    assert "ms" in ylabels
