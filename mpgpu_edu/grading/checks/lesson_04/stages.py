"""Exercise 4.5's model, data and schedules, built the same way by *compute* and *judge*:
the stages of a small MLP split by parameters or at random, its microbatches, and the
schedules by name (GPipe, 1F1B, and three hand-made orders)."""

from __future__ import annotations

import random

import torch
from torch import nn

from mpgpu_edu.grading.checks import _support
from mpgpu_edu.pipeline import Schedule, Step, from_order, gpipe, one_f_one_b, partition_balanced


LR = 0.1
EARLIER_GRAD = 0.01  # what every .grad holds before the step: the executor accumulates into it

ABOUT = {  # what a hand-made schedule tests, said wherever one of its runs goes wrong
    "backwards-last-first": " (every stage runs its backwards last microbatch first)",
    "neighbours-differ": (" (even stages run their backwards in microbatch order, odd stages "
                          "last first: gradients arrive in another order than a stage "
                          "receives them, and only the tag, message_tag(step), tells which "
                          "microbatch a message carries)"),
    "forwards-differ": (" (odd stages run their forwards last microbatch first: stage 1 first "
                        "waits for the activation stage 0 sends last, so a send that blocks "
                        "until it is received never lets stage 0 get there; use comm.isend)"),
}

MODELS = {  # the widths of Linear layers with a Tanh between each two
    "mlp": (6, 10, 12, 8, 9, 3),  # 9 layers to split
    "hourglass": (4, 16, 3, 12, 5, 7, 2),  # 11 layers, widths up and down
}


def _layers(widths: tuple[int, ...], seed: int) -> list[nn.Module]:
    torch.manual_seed(_support.secret_seed(seed))
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    return layers


def _split(n_stages: int, partition: str, seed: int, model: str = "mlp"
           ) -> tuple[list[nn.Sequential], list[int]]:
    """The model's stages and the width entering each: "balanced" by parameters, or cuts
    drawn at random (any contiguous split, stage 0 always starts with a Linear)."""
    layers = _layers(MODELS[model], seed)
    if partition == "balanced":
        names = partition_balanced(nn.Sequential(*layers), n_stages).stages
        cuts = [int(stage.layers[0]) for stage in names[1:]]
    else:
        cuts = sorted(random.Random(seed).sample(range(1, len(layers)), n_stages - 1))
    edges = [0, *cuts, len(layers)]
    stages = [nn.Sequential(*layers[a:b]) for a, b in zip(edges, edges[1:])]
    widths_in, width = [], MODELS[model][0]
    for stage in stages:
        widths_in.append(width)
        width = next((l.out_features for l in reversed(stage) if isinstance(l, nn.Linear)),
                     width)
    return stages, widths_in


def _data(batch: int, n_mbs: int, seed: int, model: str = "mlp"
          ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g, widths = torch.Generator().manual_seed(_support.secret_seed(seed)), MODELS[model]
    x, y = torch.randn(batch, widths[0], generator=g), torch.randn(batch, widths[-1], generator=g)
    return list(torch.tensor_split(x, n_mbs)), list(torch.tensor_split(y, n_mbs))


def _named_schedule(name: str, p: int, m: int) -> Schedule:
    if name == "gpipe":
        return gpipe(p, m)
    if name == "1f1b":
        return one_f_one_b(p, m)
    if name == "backwards-last-first":  # all forwards, then the backwards last first
        orders = [[*(Step(s, i, "F") for i in range(m)),
                   *(Step(s, i, "B") for i in reversed(range(m)))] for s in range(p)]
    elif name == "neighbours-differ":
        # all forwards, then the backwards: in order on even stages, last first on odd ones,
        # so that every stage receives its gradients in another order than they were sent
        orders = [[*(Step(s, i, "F") for i in range(m)),
                   *(Step(s, i, "B") for i in (range(m) if s % 2 == 0 else reversed(range(m))))]
                  for s in range(p)]
    elif name == "forwards-differ":
        # odd stages run their forwards last first: stage 1 waits first for the activation
        # stage 0 sends last, so a send that blocks until it is received holds up the pipeline
        orders = [[*(Step(s, i, "F") for i in (range(m) if s % 2 == 0 else reversed(range(m)))),
                   *(Step(s, i, "B") for i in range(m))] for s in range(p)]
    else:
        raise ValueError(f"unknown schedule {name!r}")
    return from_order(name, orders, m)
