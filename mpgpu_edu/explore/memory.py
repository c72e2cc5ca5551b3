"""The memory calculator: does this model train on these devices, and where do the bytes go?

Numbers come from ``mpgpu_edu.memory.estimate`` (bytes per parameter times parameters, split
as the strategy splits them). The figure puts what one device would hold for the whole model
beside what each device holds under the strategy, against the device's capacity: data
parallel keeps the whole bar on every device (memory does not add up), ZeRO-3 and pipeline
split it.

    fig, info = memory_view("llama-7b", "adam", "mixed", "zero3", devices=8)
    info["fits"], info["verdict"]
"""

from __future__ import annotations

from matplotlib.figure import Figure

from mpgpu_edu.explore.live import Explorer, dropdown, slider
from mpgpu_edu.cluster.hardware import GPUS
from mpgpu_edu.memory.estimate import OPTIMIZERS, PRECISIONS, STRATEGIES, estimate_memory, explain
from mpgpu_edu.memory.models import PRESETS, spec_params
from mpgpu_edu.viz.devicebox import short_gpu_name
from mpgpu_edu.viz.memory import plot_memory_bars
from mpgpu_edu.viz.palette import format_bytes


def _n_params(model: str | int) -> tuple[int, str]:
    if isinstance(model, str):
        if model not in PRESETS:
            raise ValueError(f"unknown model {model!r}: choose one of {', '.join(PRESETS)}, "
                             "or give a number of parameters")
        return spec_params(model), model
    return int(model), f"{model:,} parameters"


def memory_view(model: str | int = "gpt2-small", optimizer: str = "adam",
                precision: str = "mixed", strategy: str = "dp", devices: int = 4,
                gpu: str = "RTX4090-24GB", activations_bytes: int = 0) -> tuple[Figure, dict]:
    """Bytes per device, by category, to train ``model`` (a preset of
    ``mpgpu_edu.memory.models`` or a parameter count) with ``optimizer`` in ``precision``,
    split by ``strategy`` over ``devices`` devices of kind ``gpu``; ``activations_bytes`` is
    added to every device. The strategy "single" always uses one device.

    Returns ``(figure, info)``; ``info`` holds ``per_device`` ({category: bytes}),
    ``per_device_total``, ``total_all_devices``, ``capacity_bytes``, ``fits``, ``verdict`` and
    ``explain`` (the formula behind each number)."""
    if gpu not in GPUS:
        raise ValueError(f"unknown gpu {gpu!r}: choose one of {', '.join(GPUS)}")
    n_params, name = _n_params(model)
    devices = 1 if strategy == "single" else devices
    split = estimate_memory(n_params, optimizer, precision, strategy, devices,
                            activations_bytes)
    whole = estimate_memory(n_params, optimizer, precision, "single", 1, activations_bytes)
    capacity = GPUS[gpu].memory_bytes
    fits = split.fits(capacity)
    held = format_bytes(split.per_device_total)
    verdict = (f"fits: {held} of {format_bytes(capacity)} per device" if fits else
               f"does not fit: {held} per device, the {short_gpu_name(gpu)} has "
               f"{format_bytes(capacity)}")
    bars = {"1 device,\nwhole model": whole.per_device}
    if strategy != "single":
        bars[f"each of {devices}\n({strategy})"] = split.per_device
    fig = plot_memory_bars(bars, capacity, capacity_label=short_gpu_name(gpu), title=(
        f"{name}, {precision} {optimizer}, {strategy} over {devices} device"
        f"{'s' if devices > 1 else ''}\n{verdict}"))
    info = {"model": name, "n_params": n_params, "optimizer": optimizer,
            "precision": precision, "strategy": strategy, "devices": devices, "gpu": gpu,
            "per_device": dict(split.per_device), "per_device_total": split.per_device_total,
            "total_all_devices": split.total_all_devices, "capacity_bytes": capacity,
            "fits": fits, "verdict": verdict, "explain": explain(split)}
    return fig, info


def describe(info: dict) -> str:
    colour = "black" if info["fits"] else "#C00000"
    formula = info["explain"].replace("\n", "<br>")
    return (f"<b style='color:{colour}'>{info['verdict']}</b><br>"
            f"<span style='font-family:monospace;font-size:90%'>{formula}</span>")


def memory_calculator(model: str = "gpt2-small", strategy: str = "dp",
                      devices: int = 4, gpu: str = "RTX4090-24GB") -> Explorer:
    """Menus for the model, optimizer, precision, strategy and GPU, a slider for the devices;
    the bars, the verdict and the formula behind each number follow every change."""
    controls = {
        "model": dropdown("model", list(PRESETS), model),
        "optimizer": dropdown("optimizer", OPTIMIZERS, "adam"),
        "precision": dropdown("precision", PRECISIONS, "mixed"),
        "strategy": dropdown("strategy", STRATEGIES, strategy),
        "devices": slider("devices", devices, 1, 64),
        "gpu": dropdown("gpu", [g for g in GPUS if not g.startswith("CPU")], gpu),
    }
    return Explorer(memory_view, controls, describe)
