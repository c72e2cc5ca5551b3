"""Checks of exercise 3.4: Adam's memory, against ``mpgpu_edu.memory.bytes_per_param`` and
``estimate_memory``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.grading.checks._plain import type_name
from mpgpu_edu.grading.checks._support import expect
from mpgpu_edu.grading.checks.lesson_03.models import _model
from mpgpu_edu.memory import bytes_per_param, estimate_memory

Impl = Callable[..., Any]


def _memory_model(which: str) -> nn.Module:
    """The models of the memory cases, built the same way in compute and in judge."""
    if which == "mlp":
        return _model((10, 5, 2))
    if which == "frozen":
        model = _model((8, 4, 4, 2))
        model[0].requires_grad_(False)
        return model
    with torch.device("meta"):
        return nn.Sequential(nn.Embedding(50257, 768), nn.Linear(768, 3072))


def _expected_memory(model: nn.Module, precision: str) -> dict[str, int]:
    per = bytes_per_param("adam", precision)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"parameters": per["parameters"] * total, "gradients": per["gradients"] * trainable,
            "optimizer": per["optimizer"] * trainable}


def _memory_outputs(cases: list[tuple[str, str]]) -> Impl:
    return lambda impl: [impl(_memory_model(which), precision) for which, precision in cases]


def _memory_judge(cases: list[tuple[str, str]], what: dict[str, str]) -> Impl:
    def judge(outputs: list) -> None:
        for (which, precision), got in zip(cases, outputs):
            want = _expected_memory(_memory_model(which), precision)
            expect(type_name(got) == "dict",
                   f"adam_memory should return a dict, got {type_name(got)}")
            expect({k: got.get(k) for k in want} == want,
                   f"{what[which]}, {precision}: got {got}, expected {want}")
    return judge


MEMORY_MODELS = {"mlp": "a 2-layer MLP", "frozen": "an MLP whose first layer is frozen",
                 "meta": "a model on the meta device"}


def _judge_fp32(outputs: list) -> None:
    _memory_judge([("mlp", "fp32")], MEMORY_MODELS)(outputs)
    n = sum(p.numel() for p in _memory_model("mlp").parameters())
    total = sum(outputs[0].get(k, 0) for k in ("parameters", "gradients", "optimizer"))
    expect(total == 16 * n, f"fp32 Adam holds 16 bytes per parameter: {16 * n}, got {total}")


def _meta_and_bad(impl: Impl) -> dict:
    try:
        bad = f"returned {type(impl(_model((2, 2)), 'fp8')).__name__}"
    except ValueError:
        bad = "ValueError"
    return {"meta": impl(_memory_model("meta"), "mixed"), "bad": bad}


def _judge_meta_and_bad(data: dict) -> None:
    _memory_judge([("meta", "mixed")], MEMORY_MODELS)([data["meta"]])
    n = sum(p.numel() for p in _memory_model("meta").parameters())
    want = estimate_memory(n, "adam", "mixed", "single", 1).per_device
    got = data["meta"]
    expect(all(got.get(k) == want[k] for k in ("parameters", "gradients", "optimizer")),
           f"estimate_memory says {want}, you say {got}")
    expect(data["bad"] == "ValueError", f"adam_memory(model, 'fp8') {data['bad']}: a precision "
                                        "other than 'fp32' or 'mixed' must raise ValueError")
