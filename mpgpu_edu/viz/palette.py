"""One palette, one look, one way to write units, shared by every figure of the course.

Colours are the Okabe-Ito palette (Okabe and Ito, "Color Universal Design", 2008), which stays
distinguishable under the common kinds of colour blindness. A name keeps its colour in every
figure: ``COLORS["backward"]`` is the same orange on a timeline and in a legend, and memory
categories borrow the colour of the work that creates them (activations are made by the
forward pass, so they share its blue; gradients share the backward's orange).
"""

from __future__ import annotations

import math

import matplotlib
import matplotlib.pyplot  # noqa: F401  (in Jupyter: selects the inline backend)
from matplotlib.axes import Axes
from matplotlib.figure import Figure
import numpy as np
from matplotlib.ticker import FuncFormatter, MaxNLocator


def _register_bundled_fonts() -> int:
    """Add matplotlib's own fonts (DejaVu, STIX, Computer Modern) to its font list where that
    list lacks them; returns how many files were added.

    Mathematics in a figure (the "10^-2" ticks of a log axis) is set in DejaVu Sans with STIX
    and Computer Modern behind it, all shipped with matplotlib. Its font list is cached on
    disk, though, and a cache written by another matplotlib of the same version (one built
    against the system's fonts, which ships none of its own) holds none of them: every
    figure with a log axis then printed a screenful of "findfont: Font family ['STIXGeneral']
    not found" warnings and fell back to other glyphs."""
    from pathlib import Path

    from matplotlib import font_manager

    known = {Path(f.fname).name for f in font_manager.fontManager.ttflist}
    folder = Path(matplotlib.get_data_path(), "fonts", "ttf")
    missing = [p for p in sorted(folder.glob("*.ttf")) if p.name not in known]
    for path in missing:
        font_manager.fontManager.addfont(str(path))
    return len(missing)


_register_bundled_fonts()


OKABE_ITO = {
    "orange": "#E69F00", "sky_blue": "#56B4E9", "bluish_green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7", "black": "#000000", "grey": "#999999",
}
_C = OKABE_ITO

KIND_COLORS = {
    "forward": _C["blue"], "backward": _C["orange"], "optimizer": _C["bluish_green"],
    "compute": _C["sky_blue"], "data": _C["yellow"], "send": _C["vermillion"],
    "recv": _C["reddish_purple"],
    # interleaved 1F1B: the steps of odd model chunks, a lighter shade of the same kind
    "forward, odd chunk": _C["sky_blue"], "backward, odd chunk": _C["yellow"],
}
MEMORY_COLORS = {
    "parameters": _C["sky_blue"], "gradients": _C["orange"], "optimizer": _C["bluish_green"],
    "activations": _C["blue"], "comm_buffers": _C["vermillion"], "other": _C["grey"],
}
ALGORITHM_COLORS = {"naive": _C["vermillion"], "tree": _C["bluish_green"], "ring": _C["blue"]}
IDLE_COLOR = "#E6E6E6"
IDLE_EDGE = "#9A9A9A"
IDLE_HATCH = "///"
WARNING_COLOR = "#C00000"  # "OOM", "slower than 1 device": the one red that means "problem"

COLORS: dict[str, str] = {**KIND_COLORS, **MEMORY_COLORS, **ALGORITHM_COLORS, "idle": IDLE_COLOR}

# For series that have no name of their own (a scaling curve, a device's memory line).
SERIES_COLORS = (_C["blue"], _C["vermillion"], _C["bluish_green"], _C["orange"],
                 _C["reddish_purple"], _C["sky_blue"], _C["black"], _C["yellow"])
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

FONT_SIZE = 10


def color(name: str) -> str:
    """The colour of a trace kind, memory category, algorithm or ``"idle"``."""
    try:
        return COLORS[name]
    except KeyError:
        raise KeyError(f"no colour for {name!r}; known names: {', '.join(COLORS)}") from None


def series_color(i: int) -> str:
    return SERIES_COLORS[i % len(SERIES_COLORS)]


def text_color_on(background: str) -> str:
    """Black or white, whichever reads better on ``background`` (a ``#RRGGBB`` colour)."""
    r, g, b = (int(background[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def new_figure(width: float, height: float) -> Figure:
    """A figure outside pyplot's registry (so nothing global keeps it alive), laid out by
    matplotlib's constrained layout so labels and legends do not overlap."""
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def style(ax: Axes, *, grid: str = "both") -> Axes:
    """The course's look: readable tick labels, a light grid behind the data, no top/right
    frame. ``grid`` is ``"x"``, ``"y"``, ``"both"`` or ``"none"``."""
    ax.tick_params(labelsize=FONT_SIZE - 1)
    ax.xaxis.label.set_fontsize(FONT_SIZE)
    ax.yaxis.label.set_fontsize(FONT_SIZE)
    ax.title.set_fontsize(FONT_SIZE + 1)
    ax.set_axisbelow(True)
    if grid != "none":
        ax.grid(True, axis=grid, color="#D0D0D0", linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax


def _three_digits(x: float) -> str:
    """About 3 significant digits, no trailing zeros, never an exponent: 12.3, 1.5, 24, 512."""
    if abs(x) >= 99.95:
        text = f"{x:.0f}"
    elif abs(x) >= 9.995:
        text = f"{x:.1f}"
    else:
        text = f"{x:.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))
_BYTE_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
_BYTE_UNITS_WITH_TIB = (("TiB", 2**40), *_BYTE_UNITS)


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit (``"s"``, ``"ms"``, ``"µs"``, ``"ns"``) in which ``seconds`` reads as 1 to 999,
    and the size of that unit in seconds."""
    for name, size in _TIME_UNITS:
        if abs(seconds) >= size:
            return name, size
    return _TIME_UNITS[-1]


def byte_unit(nbytes: float) -> tuple[str, int]:
    """The binary unit (``"B"`` .. ``"TiB"``) in which ``nbytes`` reads as 1 to 1023."""
    for name, size in _BYTE_UNITS_WITH_TIB:
        if abs(nbytes) >= size:
            return name, size
    return "B", 1


def format_seconds(seconds: float) -> str:
    """``0.0123`` -> ``"12.3 ms"``; ``4.5e-6`` -> ``"4.5 µs"``; ``0`` -> ``"0 s"``."""
    if seconds == 0 or not math.isfinite(seconds):
        return f"{seconds:g} s"
    name, size = time_unit(seconds)
    return f"{_three_digits(seconds / size)} {name}"


def format_bytes(nbytes: float) -> str:
    """Binary units: ``1536`` -> ``"1.5 KiB"``; ``24 * 2**30`` -> ``"24 GiB"``; ``0`` -> ``"0 B"``.

    A spec sheet's "24 GB" is 24 * 10**9 bytes, which is 22.4 GiB."""
    name, size = byte_unit(nbytes)
    return f"{_three_digits(nbytes / size)} {name}"


class _ScaledLocator(MaxNLocator):
    """Ticks at round numbers of a unit (1, 2, 4 GiB), not at round numbers of bytes."""

    def __init__(self, size: float) -> None:
        super().__init__(nbins="auto", steps=[1, 2, 2.5, 5, 10])
        self.size = size

    def tick_values(self, vmin: float, vmax: float) -> np.ndarray:
        return super().tick_values(vmin / self.size, vmax / self.size) * self.size


def time_axis(ax: Axes, span: float) -> None:
    """Label the x axis in the unit that suits ``span`` seconds ("time (ms)") and show 0..span.
    The data stay in seconds; only the tick labels are scaled."""
    span = span if span > 0 else 1.0
    unit, size = time_unit(span)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x / size:g}"))
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, span)


def bytes_axis(ax: Axes, top: float, *, label: str = "memory") -> None:
    """Label the y axis in the binary unit that suits ``top`` bytes ("memory (GiB)").
    The data stay in bytes; only the tick labels are scaled."""
    unit, size = byte_unit(top if top > 0 else 1)
    ax.yaxis.set_major_locator(_ScaledLocator(size))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y / size:g}"))
    ax.set_ylabel(f"{label} ({unit})")


def _display_figures_as_png() -> None:
    """In IPython, show a returned ``Figure`` as a PNG even before ``%matplotlib inline`` ran.
    The figure functions return plain figures outside pyplot, so each shows exactly once."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import print_figure
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return
    png = shell.display_formatter.formatters["image/png"]
    png.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))


_display_figures_as_png()
