"""Checks of exercise 6.1, choosing a strategy that fits: ``estimate_memory`` against
``Cluster.capacity_bytes``, the first strategy that fits in the order single (one device),
dp, zero1, zero2, zero3, with the example's optimizer, precision and activations (each
changes the answer somewhere: SGD keeps less state than Adam, fp32 more than mixed precision
once the optimizer state is sharded). Fitting is ``Estimate.fits``: at most the capacity, so
an estimate of exactly a device's capacity fits (``_exact_fit`` builds such examples, and one
byte over)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._plain import type_name
from mpgpu_edu.grading.checks._support import each, examples, expect
from mpgpu_edu.memory import estimate_memory

Impl = Callable[..., Any]
GPT2_SMALL, LLAMA_7B, LLAMA_13B = 124_439_808, 6_738_415_616, 13_015_864_320


def _reference_choice(n_params: int, cluster: Cluster, optimizer: str, precision: str,
                      activations_bytes: int) -> str:
    n = cluster.world_size
    for strategy in (["single"] if n == 1 else ["dp", "zero1", "zero2", "zero3"]):
        if estimate_memory(n_params, optimizer, precision, strategy, n,
                           activations_bytes).fits(cluster.capacity_bytes(0)):
            return strategy
    return "none"


def _choice_example(n_params: int, preset: str, visible: str | None = None,
                    optimizer: str = "adam", precision: str = "mixed",
                    activations_bytes: int = 0) -> dict[str, Any]:
    return {"n_params": n_params, "preset": preset, "visible": visible, "optimizer": optimizer,
            "precision": precision, "activations_bytes": activations_bytes}


def _choose(impl: Impl, n_params: int, preset: str, visible: str | None, optimizer: str,
            precision: str, activations_bytes: int) -> Any:
    cluster = Cluster.preset(preset, visible=visible)
    return impl(n_params, cluster, optimizer, precision, activations_bytes)


def _judge_choice(got: Any, n_params: int, preset: str, visible: str | None, optimizer: str,
                  precision: str, activations_bytes: int) -> None:
    cluster = Cluster.preset(preset, visible=visible)
    want = _reference_choice(n_params, cluster, optimizer, precision, activations_bytes)
    where = preset + (f" with CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "")
    expect(isinstance(got, str), f"choose_strategy should return a str, got {type_name(got)}")
    capacity = cluster.capacity_bytes(0)
    exact = want in ("single", "dp", "zero1", "zero2", "zero3") and estimate_memory(
        n_params, optimizer, precision, want, cluster.world_size,
        activations_bytes).per_device_total == capacity
    note = (f" ({want} needs exactly the device's {capacity} bytes, and a strategy that needs "
            "no more than the capacity fits)" if exact
            else _what_was_left_out(got, n_params, cluster, optimizer, precision,
                                    activations_bytes))
    expect(got == want, f"{n_params:.3g} parameters, {optimizer} {precision}, "
                        f"{activations_bytes} activation bytes, on {where}: you chose {got!r}, "
                        f"expected {want!r}" + note)


def _what_was_left_out(got: Any, n_params: int, cluster: Cluster, optimizer: str,
                       precision: str, activations_bytes: int) -> str:
    """A question when ``got`` is the answer with one argument left out (no activations,
    Adam for another optimizer, the other precision), else ''."""
    if got == _reference_choice(n_params, cluster, optimizer, precision, activations_bytes):
        return ""
    if activations_bytes and got == _reference_choice(n_params, cluster, optimizer, precision,
                                                      0):
        return (f": {got!r} would be right without the activations; does activations_bytes "
                "reach estimate_memory?")
    if optimizer != "adam" and got == _reference_choice(n_params, cluster, "adam", precision,
                                                        activations_bytes):
        return (f": {got!r} would be right for Adam, and {optimizer} keeps less optimizer "
                "state; does optimizer reach estimate_memory?")
    other = "mixed" if precision == "fp32" else "fp32"
    if got == _reference_choice(n_params, cluster, optimizer, other, activations_bytes):
        return (f": {got!r} would be right for {other} precision; does precision reach "
                "estimate_memory?")
    return ""


def _exact_fit(n_params: int, preset: str, visible: str | None, strategy: str,
               spare: int = 0) -> dict[str, Any]:
    """An example whose activations fill the devices so that ``strategy`` (mixed-precision
    Adam) needs exactly their capacity, less ``spare`` bytes (negative: that many over)."""
    cluster = Cluster.preset(preset, visible=visible)
    state = estimate_memory(n_params, "adam", "mixed", strategy, cluster.world_size, 0)
    activations = cluster.capacity_bytes(0) - state.per_device_total - spare
    return _choice_example(n_params, preset, visible, "adam", "mixed", activations)


def _choice_case(name: str, points: int, cases: list[dict[str, Any]],
                 hidden: bool = False) -> Case:
    return Case(name, points, *each(cases, _choose, _judge_choice), hidden=hidden)


def _random_choices() -> list[dict[str, Any]]:
    presets = ["4xRTX4090-pcie", "8xRTX4090-pcie", "8xA100-nvlink", "4xH100-nvswitch"]
    optimizers = ["adam", "sgd", "sgd-momentum"]
    drawn = examples(40, seed=6, exponent=(60, 110), preset=(0, 3), devices=(1, 4),
                     fp32=(0, 1), activations=(0, 8), optimizer=(0, 2))
    return [_choice_example(int(10 ** (e["exponent"] / 10)), presets[e["preset"]],
                            ",".join(str(i) for i in range(e["devices"])),
                            optimizer=optimizers[e["optimizer"]],
                            precision="fp32" if e["fp32"] else "mixed",
                            activations_bytes=e["activations"] * 2**30) for e in drawn]
