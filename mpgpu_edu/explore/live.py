"""One way to make a figure live: controls above, numbers and the figure below, redrawn on
every change.

Every explorer is a *view* ``view(**values) -> (figure, info)``, a plain function that tests and
scripts call directly, plus the controls that feed it. ``Explorer`` wires the two: when a
control's value changes it calls the view again, shows the numbers from ``info`` and displays
the new figure in place of the old one. A ``ValueError`` from the view (a pipeline with more
stages than devices) is shown in red instead of a figure, and the last good figure stays.

The figure is shown as a PNG made here, not through matplotlib's notebook backend, so it
shows whether or not the notebook ran ``%matplotlib inline``. Figures come from
``palette.new_figure``, outside pyplot's registry: dropping the old figure is enough to free
it, nothing global keeps it alive.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets
from IPython import get_ipython
from IPython.display import Image
from matplotlib.figure import Figure

from mpgpu_edu.viz.palette import WARNING_COLOR

View = Callable[..., tuple[Figure, dict]]


class Explorer(widgets.VBox):
    """Controls, a line of numbers, and the figure of ``view(**control values)``.

    ``controls`` maps the view's keyword names to widgets; ``fixed`` are keyword arguments
    passed on every call; ``describe(info)`` returns the HTML line shown above the figure.
    After each change: ``figure`` and ``info`` hold the latest result, ``renders`` counts the
    redraws and ``error`` holds the message of a failed one (else None)."""

    def __init__(self, view: View, controls: Mapping[str, widgets.Widget],
                 describe: Callable[[dict], str], fixed: Mapping[str, Any] | None = None,
                 extra: list[widgets.Widget] | None = None) -> None:
        self.view, self.describe, self.fixed = view, describe, dict(fixed or {})
        self.controls = dict(controls)
        self.summary = widgets.HTML()
        self.output = widgets.Output()
        self.figure: Figure | None = None
        self.info: dict = {}
        self.renders = 0
        self.error: str | None = None
        rows = [widgets.HBox(list(self.controls.values())[i:i + 3])
                for i in range(0, len(self.controls), 3)]
        super().__init__([*rows, *(extra or []), self.summary, self.output])
        for control in self.controls.values():
            control.observe(self.update, names="value")
        self.update()

    def values(self) -> dict[str, Any]:
        """The view's keyword arguments as the controls now set them."""
        return {**self.fixed, **{name: c.value for name, c in self.controls.items()}}

    def update(self, _change: object = None) -> None:
        """Call the view with the controls' values and show the result."""
        try:
            figure, info = self.view(**self.values())
        except ValueError as exc:
            self.error = str(exc)
            self.summary.value = (f"<span style='color:{WARNING_COLOR}'><b>cannot draw this:"
                                  f"</b> {html.escape(str(exc))}</span>")
            return
        self.figure, self.info, self.error = figure, info, None
        self.renders += 1
        self.summary.value = self.describe(info)
        if get_ipython() is None:  # plain Python (a script, a test): nothing to show it on
            return
        # Set the output's contents directly rather than `with output: display(...)`, which
        # sometimes leaves a headless notebook runner waiting for ever (ipykernel 7/nbclient).
        self.output.outputs = ()
        self.output.append_display_data(Image(data=self.png(), format="png"))

    def png(self) -> bytes:
        """The current figure as PNG bytes (what the notebook shows)."""
        if self.figure is None:
            raise ValueError(f"nothing drawn yet: {self.error}")
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        return buffer.getvalue()


def slider(description: str, value: int, low: int, high: int, **kwargs: Any) -> widgets.IntSlider:
    """An integer slider that redraws when released, not at every pixel of a drag."""
    return widgets.IntSlider(value=value, min=low, max=high, description=description,
                             continuous_update=False, style={"description_width": "initial"},
                             **kwargs)


def dropdown(description: str, options: Any, value: Any) -> widgets.Dropdown:
    return widgets.Dropdown(options=options, value=value, description=description,
                            style={"description_width": "initial"})


def percent(x: float) -> str:
    """``0.273`` -> ``"27%"``; small shares keep a digit: ``0.0026`` -> ``"0.3%"``."""
    return f"{x:.0%}" if abs(x) >= 0.01 or x == 0 else f"{x:.1%}"
