"""Figures of the course: functions of plain data (a Trace, bytes per category, step times)
that return a matplotlib ``Figure``. They never run training.

- ``plot_timeline``, ``plot_timelines_side_by_side``: who computed, who sent, who waited.
- ``plot_memory_bars``, ``plot_memory_over_time``, ``plot_memory_compare``: where memory goes.
- ``plot_scaling``, ``plot_allreduce_vs_size``: does adding devices pay; which collective wins.
- ``ring_steps``, ``ring_state``, ``plot_ring_step``, ``ring_frames``: ring all-reduce, step
  by step.

Every figure takes its colours from ``palette`` (Okabe-Ito, colour-blind safe): a kind of work
or memory has the same colour everywhere. Functions that draw one panel accept ``ax=`` to draw
into a figure of your own.
"""

from mpgpu_edu.viz.memory import plot_memory_bars, plot_memory_compare, plot_memory_over_time
from mpgpu_edu.viz.palette import COLORS, format_bytes, format_seconds, style
from mpgpu_edu.viz.ring import (
    RingStep, plot_ring_step, ring_frames, ring_state, ring_steps, save_ring_frames,
)
from mpgpu_edu.viz.scaling import plot_allreduce_vs_size, plot_scaling
from mpgpu_edu.viz.timeline import plot_timeline, plot_timelines_side_by_side

__all__ = [
    "COLORS", "RingStep", "format_bytes", "format_seconds", "plot_allreduce_vs_size",
    "plot_memory_bars", "plot_memory_compare", "plot_memory_over_time", "plot_ring_step",
    "plot_scaling", "plot_timeline", "plot_timelines_side_by_side", "ring_frames",
    "ring_state", "ring_steps", "save_ring_frames", "style",
]

# Device maps: where each piece lives, what wires the devices, what CUDA_VISIBLE_DEVICES shows.
from mpgpu_edu.viz.devicemap import plot_device_map, plot_visible_devices  # noqa: E402
from mpgpu_edu.viz.mesh import plot_mesh  # noqa: E402

__all__ += ["plot_device_map", "plot_mesh", "plot_visible_devices"]

# Several nodes: hosts, NIC rails, GPUs, and each rank's node, local and global rank.
from mpgpu_edu.viz.nodes import plot_node_map  # noqa: E402

__all__ += ["plot_node_map"]
