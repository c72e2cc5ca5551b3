"""What a side-by-side run returns, and how its ranks take turns and time their steps.

``SideBySide`` holds, for each of three runs of the same training (``"one device"``,
``"ours"``, ``"torch"``), the loss of every step and the seconds of every step, with the
figure (loss curves overlaid, step-time bars) and a text table.

``take_turns`` is the SPMD loop every comparison runs on its gloo processes: per training
step, each run in turn (the order rotated every step, so that a burst of load from another
program hits every run alike), after a barrier so that the ranks start together, timed by the
wall clock. A step's time is its slowest rank's (a step is done when its last rank is); the
median leaves out the first step, which builds lazy state (torch's buckets and shapes,
everyone's warm caches).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from mpgpu_edu.viz.palette import FONT_SIZE, format_seconds, new_figure, style

RUNS = ("one device", "ours", "torch")  # the keys of every result's dictionaries
TOLERANCE = 1e-5  # largest loss difference the comparisons accept
COLORS = {"one device": "#999999", "ours": "#0072B2", "torch": "#D55E00"}
LOOKS = {"one device": ("-", 5.0), "ours": ("--", 2.2), "torch": (":", 2.2)}

StepFn = Callable[[int], "float | None"]  # step k -> this rank's loss (None: none here)


def take_turns(runs: Mapping[str, StepFn | None], steps: int) -> dict[str, dict[str, list]]:
    """SPMD, on a ``torch.distributed`` process group: ``steps`` training steps of every run,
    step k of each run before step k + 1 of any, in an order rotated by k. ``None`` stands
    for a run this rank takes no part in (the one device run on ranks > 0): it still joins
    the barrier. Returns this rank's ``{"losses": {name: [loss or None per step]},
    "seconds": {name: [seconds per step]}}``."""
    names = list(runs)
    out: dict[str, dict[str, list]] = {"losses": {n: [] for n in names},
                                       "seconds": {n: [] for n in names}}
    for k in range(steps):
        for name in names[k % len(names):] + names[:k % len(names)]:
            dist.barrier()
            start = time.perf_counter()
            loss = runs[name](k) if runs[name] is not None else None
            out["seconds"][name].append(time.perf_counter() - start)
            out["losses"][name].append(None if loss is None else float(loss))
    return out


def slowest_rank(per_rank: Sequence[Mapping[str, list]], name: str,
                 ranks: Sequence[int] | None = None) -> list[float]:
    """Per step, the most seconds any of ``ranks`` (default: all) spent on run ``name``."""
    chosen = [per_rank[r] for r in (ranks if ranks is not None else range(len(per_rank)))]
    return [max(times) for times in zip(*(r["seconds"][name] for r in chosen))]


def mean_over_ranks(per_rank: Sequence[Mapping[str, list]], name: str) -> list[float]:
    """Per step, the mean of the ranks' losses of run ``name`` (equal shards: the whole
    batch's mean loss)."""
    return [sum(losses) / len(losses) for losses in zip(*(r["losses"][name] for r in per_rank))]


@dataclass
class SideBySide:
    """The same training three ways: ``losses[name]`` and ``step_seconds[name]`` for
    ``name`` in ``"one device"``, ``"ours"``, ``"torch"``; ``labels[name]`` says what ran
    ("your DDP wrapper", "torch DistributedDataParallel"). ``convention`` states the loss
    that all three report and differentiate."""

    title: str
    setup: str
    convention: str
    labels: dict[str, str]
    losses: dict[str, list[float]]
    step_seconds: dict[str, list[float]]
    tolerance: float = TOLERANCE
    notes: list[str] = field(default_factory=list)

    @property
    def median_seconds(self) -> dict[str, float]:
        """Median seconds of a step of each run, the first step left out when there are
        three or more (it builds lazy state)."""
        return {name: statistics.median(s[1:] if len(s) >= 3 else s)
                for name, s in self.step_seconds.items()}

    @property
    def ratio(self) -> float:
        """Median step time, ours / torch's: above 1, ours is slower."""
        medians = self.median_seconds
        return medians["ours"] / medians["torch"]

    def max_loss_diff(self, a: str, b: str) -> float:
        """The largest difference between the losses of runs ``a`` and ``b``, over steps."""
        return max(abs(x - y) for x, y in zip(self.losses[a], self.losses[b]))

    @property
    def matches(self) -> bool:
        """Ours equals torch's, and both equal one device, within ``tolerance`` at every step."""
        pairs = (("ours", "torch"), ("ours", "one device"), ("torch", "one device"))
        return all(self.max_loss_diff(a, b) <= self.tolerance for a, b in pairs)

    def table(self) -> str:
        """The result as text: one row per run (final loss, largest difference from one
        device and from torch's, median step time), then the ratio and the convention."""
        medians = self.median_seconds
        head = ["run", "final loss", "max |loss diff| vs one device", "vs torch",
                "median step"]
        rows = [head]
        for name in RUNS:
            rows.append([self.labels[name], f"{self.losses[name][-1]:.6f}",
                         "-" if name == "one device"
                         else f"{self.max_loss_diff(name, 'one device'):.1e}",
                         "-" if name == "torch" else f"{self.max_loss_diff(name, 'torch'):.1e}",
                         format_seconds(medians[name])])
        widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
        lines = ["  ".join(cell.ljust(w) if c == 0 else cell.rjust(w)
                           for c, (cell, w) in enumerate(zip(row, widths))) for row in rows]
        verdict = "equal" if self.matches else "NOT equal"
        return "\n".join([f"{self.title}: {self.setup}", f"loss: {self.convention}", *lines,
                          f"losses {verdict} within {self.tolerance:.0e} at every step; "
                          f"step time, ours / torch: {self.ratio:.2f}x "
                          f"(median of steps 2..{len(self.losses['ours'])}, slowest rank)",
                          *self.notes])

    def __str__(self) -> str:
        return self.table()

    def plot(self) -> Figure:
        """Left: the loss of every step, the three runs overlaid (one device wide and grey,
        ours dashed, torch's dotted: where they agree, one line). Right: the median step
        time of each run, its whisker from the first to the third quartile."""
        fig = new_figure(10, 3.8)
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        for name in RUNS:
            dashes, width = LOOKS[name]
            losses = self.losses[name]
            left.plot(range(1, len(losses) + 1), losses, linestyle=dashes, linewidth=width,
                      color=COLORS[name], label=_brief(self.labels[name]))
        left.xaxis.set_major_locator(MaxNLocator(integer=True))
        left.set_xlabel("training step (a new batch every step)")
        left.set_ylabel("loss")
        gap = self.max_loss_diff("ours", "torch")
        left.set_title(f"loss of every step: ours and torch's differ by at most "
                       f"{gap:.1e}" if gap else "loss of every step: ours and torch's identical",
                       loc="left")
        left.legend(frameon=False, fontsize=FONT_SIZE - 1)
        _time_bars(right, self)
        for ax in (left, right):
            style(ax)
        fig.suptitle(self.title, x=0.01, ha="left", fontsize=FONT_SIZE + 1)
        return fig

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.table())


def from_ranks(per_rank: Sequence[Mapping[str, Any]], *, title: str, setup: str,
               convention: str, ours: str, torch_label: str,
               losses_of: Callable[[Sequence[Mapping[str, Any]], str], list[float]]
               = mean_over_ranks) -> SideBySide:
    """What every rank of a side-by-side run returned, as a ``SideBySide``: one device's
    losses from rank 0 (which trained it alone), ours and torch's by ``losses_of`` (default:
    the mean over the ranks' equal shards), each step's time the slowest rank's."""
    return SideBySide(
        title=title, setup=setup, convention=convention,
        labels={"one device": "one device", "ours": ours, "torch": torch_label},
        losses={"one device": per_rank[0]["losses"]["one device"],
                "ours": losses_of(per_rank, "ours"), "torch": losses_of(per_rank, "torch")},
        step_seconds={"one device": slowest_rank(per_rank, "one device", [0]),
                      "ours": slowest_rank(per_rank, "ours"),
                      "torch": slowest_rank(per_rank, "torch")})


def _time_bars(ax: Any, result: SideBySide) -> None:
    medians = result.median_seconds
    kept = {name: sorted(s[1:] if len(s) >= 3 else s) for name, s in result.step_seconds.items()}
    quartiles = {name: statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
                 for name, s in kept.items()}
    top = max(q[-1] for q in quartiles.values())
    unit, size = ("ms", 1e-3) if top < 1 else ("s", 1.0)
    for i, name in enumerate(RUNS):
        low, high = quartiles[name][0], quartiles[name][-1]
        ax.bar(i, medians[name] / size, color=COLORS[name], alpha=0.85, width=0.6)
        ax.errorbar(i, medians[name] / size, color="black", capsize=4, linewidth=1,
                    yerr=[[max(0.0, medians[name] - low) / size],
                          [max(0.0, high - medians[name]) / size]])
        ax.text(i, max(high, medians[name]) / size + 0.02 * top / size,
                format_seconds(medians[name]), ha="center", va="bottom", fontsize=FONT_SIZE - 1)
    ax.set_xticks(range(len(RUNS)), [_short(_brief(result.labels[n])) for n in RUNS],
                  fontsize=FONT_SIZE - 1)
    ax.set_ylabel(f"median step, quartiles ({unit})")
    ax.set_ylim(0, top / size * 1.15)
    ax.set_title(f"step time: ours / torch = {result.ratio:.2f}x", loc="left")
    style(ax, grid="y")


def _brief(label: str) -> str:
    """A run's label without its parenthesis ("reference DDP wrapper (yours: not found in
    ...)" is "reference DDP wrapper"): the figure names the run, the printed table and note
    say the rest."""
    return label.split(" (", 1)[0]


def _short(label: str) -> str:
    """A bar's tick label: at most two lines of about 18 characters."""
    words, lines = label.split(), [""]
    for word in words:
        if lines[-1] and len(lines[-1]) + 1 + len(word) > 18:
            lines.append(word)
        else:
            lines[-1] = f"{lines[-1]} {word}".strip()
    return "\n".join(lines[:3])
