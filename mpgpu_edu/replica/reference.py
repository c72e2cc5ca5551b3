"""The oracle: plain single-device training on the whole batch.

Every strategy in the course (parameter server, data parallel, pipeline, tensor parallel,
hybrid) must end with the same parameters and the same loss curve as ``train_single`` on the
same model, batches and optimizer. If a parallel version disagrees, it is the one that is
wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from mpgpu_edu.replica.data import Batch, loss_fn

OPTIMIZERS = ("sgd", "adam")


def make_optimizer(name: str, params: Iterable[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """``"sgd"`` (plain, no momentum: it keeps no state) or ``"adam"`` (torch defaults: two
    moments per parameter and a step count)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")


def batch_for_step(batches: Sequence[Batch], step: int) -> Batch:
    """The batch of training step ``step``: the list is cycled when there are more steps."""
    return batches[step % len(batches)]


def named_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of the model's parameters, by name: what training runs compare."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_single(model_fn: Callable[[], nn.Module], batches: Sequence[Batch],
                 optimizer: str = "sgd", lr: float = 0.05,
                 steps: int | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Train ``model_fn()`` for ``steps`` steps (default: one per batch) on one device.

    Returns ``(final parameters by name, loss of every step)``; the loss of step k is
    measured before step k's update, as the parallel strategies report it."""
    steps = len(batches) if steps is None else steps
    model = model_fn()
    opt = make_optimizer(optimizer, model.parameters(), lr)
    losses = []
    for step in range(steps):
        x, y = batch_for_step(batches, step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return named_params(model), losses


TOLERANCE = 1e-5  # largest parameter difference a strategy may show against the oracle


def compare_to_reference(strategy: str, backend: str, world_size: int, optimizer: str,
                         params: dict[str, torch.Tensor], losses: Sequence[float],
                         reference: tuple[dict[str, torch.Tensor], list[float]]) -> dict:
    """The report every ``run_demo`` returns: our loss curve and parameters against the
    single-device reference's, and whether they agree within ``TOLERANCE``."""
    ref_params, ref_losses = reference
    diff = max(((params[name].cpu() - ref).abs().max().item()
                for name, ref in ref_params.items()), default=0.0)
    losses = [float(v) for v in losses]
    return {"strategy": strategy, "backend": backend, "world_size": world_size,
            "steps": len(losses), "optimizer": optimizer, "losses": losses,
            "reference_losses": list(ref_losses),
            "final_loss": losses[-1] if losses else None,
            "reference_final_loss": ref_losses[-1] if ref_losses else None,
            "max_abs_param_diff": diff,
            "max_abs_loss_diff": max((abs(a - b) for a, b in zip(losses, ref_losses)),
                                     default=0.0),
            "tolerance": TOLERANCE, "matches": diff <= TOLERANCE}
