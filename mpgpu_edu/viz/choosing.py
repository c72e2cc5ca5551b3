"""Lesson 06's comparison table of the four strategies (``mpgpu_edu.estimate.choosing``'s
rows) as HTML, as text and as a figure; the job it assumes in one paragraph; and which
model fits which GPU under which strategy (``memory_table``).
"""

from __future__ import annotations

import html

from matplotlib.figure import Figure

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.estimate.choosing import COLUMNS, QUALITIES, Row, Setting, step_compute_seconds
from mpgpu_edu.cluster.hardware import GPUS
from mpgpu_edu.memory import estimate_memory, spec_params
from mpgpu_edu.viz.devicebox import link_name
from mpgpu_edu.viz.memory import plot_memory_bars
from mpgpu_edu.viz.palette import (FONT_SIZE, WARNING_COLOR, format_bytes, format_seconds,
                                   new_figure, style)

SENT_COLOR = "#505050"  # bytes on the wire: no memory category uses this grey


def describe_setting(setting: Setting) -> str:
    """The job in one paragraph: what every row of the table assumes."""
    cluster = Cluster.preset(setting.cluster)
    n, dp = cluster.world_size, setting.hybrid_dp
    return (f"{setting.model} ({spec_params(setting.model) / 1e9:.2f} billion parameters), "
            f"mixed-precision Adam, {setting.batch} sequences of {setting.seq} tokens per step, "
            f"on {setting.cluster}: {n} x {cluster.gpu.display_name} "
            f"({format_bytes(cluster.capacity_bytes(0))} each), linked by "
            f"{link_name(cluster.topology.links()[0].spec_name)} "
            f"({cluster.route(0, 1).beta_Bps / 1e9:g} GB/s). Pipelines and tensor parallelism run "
            f"{setting.microbatches} microbatches of {setting.batch // setting.microbatches} "
            f"sequences; the hybrid is {dp} replicas x {n // dp} stages. The step's compute, "
            f"6 FLOPs per parameter per token split over {n} devices, takes "
            f"{format_seconds(step_compute_seconds(setting))} per device.")


def _memory_cell(row: Row) -> str:
    mark = "fits" if row.fits else "does NOT fit"
    return f"{format_bytes(row.memory)} ({mark} in {format_bytes(row.capacity)})"


def _comm_cell(row: Row) -> str:
    text = f"{format_bytes(row.comm_bytes)}, {format_seconds(row.comm_seconds)} on the wire"
    return text + (f"; bubble {row.bubble:.0%}" if row.bubble else "")


def comparison_html(rows: list[Row]) -> str:
    """The table as HTML: a row per strategy, the qualities, then memory per device and
    communication per device per step (a memory that does not fit in red)."""
    head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in
                   ("strategy", *COLUMNS, "memory per device", "communication per device, step"))
    body = []
    for row in rows:
        cells = [f"<b>{html.escape(row.name)}</b>"]
        cells += [html.escape(QUALITIES[row.name][c]) for c in COLUMNS]
        color = "black" if row.fits else WARNING_COLOR
        cells.append(f"<span style='color:{color}'>{html.escape(_memory_cell(row))}</span>")
        cells.append(html.escape(_comm_cell(row)))
        body.append("<tr>" + "".join(f"<td style='text-align:left;vertical-align:top'>{c}</td>"
                                     for c in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def comparison_text(rows: list[Row]) -> str:
    """The numbers of the table as plain text, a line per strategy."""
    return "\n".join(f"{row.name:18} memory {_memory_cell(row):32} sent {_comm_cell(row)}"
                     for row in rows)


def plot_comparison(rows: list[Row], title: str = "") -> Figure:
    """Left: memory per device by category against the capacity. Right: bytes each device
    sends per step (log scale, dark grey bars), with their time on the wire."""
    fig = new_figure(12, 4.2)
    left, right = fig.subplots(1, 2, width_ratios=[1.25, 1])
    labels = [row.name.replace(" parallel", "\nparallel").replace(" DP", "\nDP") for row in rows]
    plot_memory_bars({label: row.per_device for label, row in zip(labels, rows)},
                     rows[0].capacity, ax=left, title="memory per device")
    ys = range(len(rows))
    # one colour, one meaning: the left panel's colours are memory categories, so the bytes
    # sent are a single neutral colour (the strategy is the row's label)
    right.barh(ys, [row.comm_bytes for row in rows], color=SENT_COLOR)
    right.set_xscale("log", base=2)
    for y, row in zip(ys, rows):
        right.annotate(f" {format_bytes(row.comm_bytes)}, {format_seconds(row.comm_seconds)}",
                       (row.comm_bytes, y), va="center", ha="left", fontsize=FONT_SIZE - 1)
    right.set_yticks(list(ys), labels)
    right.invert_yaxis()
    low = min(r.comm_bytes for r in rows) / 4
    high = max(r.comm_bytes for r in rows) * 16
    right.set_xlim(low, high)
    ticks = [2.0 ** k for k in range(0, 64, 2) if low <= 2.0 ** k <= high]
    right.set_xticks(ticks, [format_bytes(t) for t in ticks])
    right.minorticks_off()
    right.set_xlabel("bytes each device sends per step (log scale)")
    right.set_title("communication per device per step,\nand its time on the wire", loc="left")
    style(right, grid="x")
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=FONT_SIZE + 1)
    return fig


def memory_table(models: list[str], devices: int, gpus: list[str],
                 strategies: tuple[str, ...] = ("single", "dp", "zero1", "zero2", "zero3")
                 ) -> str:
    """Per-device bytes of parameters, gradients and optimizer state (mixed-precision Adam,
    before activations) of each model under each strategy over ``devices`` devices (``single``
    on one), and whether that fits each GPU of ``gpus`` (keys of ``hardware.GPUS``)."""
    names = [GPUS[g].display_name.replace("NVIDIA ", "").replace("GeForce ", "") for g in gpus]
    lines = [f"{'model':12} {'strategy':9} {'per device':>11}   "
             + "   ".join(f"{name} ({format_bytes(GPUS[g].memory_bytes)})" for name, g in
                          zip(names, gpus))]
    for model in models:
        params = spec_params(model)
        for strategy in strategies:
            n = 1 if strategy == "single" else devices
            held = estimate_memory(params, "adam", "mixed", strategy, n).per_device_total
            fits = [("fits" if held <= GPUS[g].memory_bytes else "-").center(len(name) + 9)
                    for name, g in zip(names, gpus)]
            label = strategy if strategy == "single" else f"{strategy} x {n}"
            lines.append(f"{model:12} {label:9} {format_bytes(held):>11}   " + "   ".join(fits))
    return "\n".join(lines)
