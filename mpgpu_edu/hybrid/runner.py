"""``mpgpu-edu run hybrid``: DP x PP training of a small model, checked against one device."""

from __future__ import annotations

import functools
from typing import Any

from mpgpu_edu.comm import launch
from mpgpu_edu.comm.launch import DEFAULT_TIMEOUT_S
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.hybrid.mesh import Mesh
from mpgpu_edu.hybrid.train import train_hybrid
from mpgpu_edu.pipeline.runner import DEMO_SIZES, make_schedule, max_abs_diff, optimizer_factory
from mpgpu_edu.replica.reference import train_single


def mesh_for(world_size: int, dp: int | None = None, pp: int | None = None) -> Mesh:
    """The mesh of ``world_size`` ranks with the given ``dp`` and/or ``pp``; with neither,
    pp=2 when ``world_size`` is even (else the whole world is one pipeline)."""
    if dp is None and pp is None:
        pp = 2 if world_size % 2 == 0 else world_size
    if dp is None:
        dp = world_size // pp if pp >= 1 else 0
    if pp is None:
        pp = world_size // dp if dp >= 1 else 0
    mesh = Mesh(dp, pp)  # a dp or pp below 1 is refused here
    mesh.check(world_size)
    return mesh


def run_demo(backend: str, world_size: int, steps: int, optimizer: str,
             **options: Any) -> dict[str, Any]:
    """Train ``make_mlp(sizes)`` on a ``dp x pp`` mesh for ``steps`` steps and compare with
    single-device training.

    Options: ``dp`` and ``pp`` (see ``mesh_for``), ``schedule`` ("gpipe"), ``microbatches``
    (2; 1 for naive), ``batch_size`` (16), ``sizes`` (``DEMO_SIZES``), ``lr`` (0.05),
    ``seed`` (0), ``timeout`` (seconds the ranks get; default launch's).
    """
    if world_size < 1 or steps < 1:
        raise ValueError(f"world_size and steps must be at least 1, got {world_size} and "
                         f"{steps}")
    mesh = mesh_for(world_size, options.get("dp"), options.get("pp"))
    name = options.get("schedule", "gpipe")
    n_mb = options.get("microbatches", 1 if name == "naive" else 2)
    schedule = make_schedule(name, mesh.pp, n_mb)
    sizes, seed = tuple(options.get("sizes", DEMO_SIZES)), options.get("seed", 0)
    batch_size, lr = options.get("batch_size", 16), options.get("lr", 0.05)
    if mesh.pp > 2 * len(sizes) - 3:
        raise ValueError(f"cannot split a {2 * len(sizes) - 3}-layer model into "
                         f"pp={mesh.pp} stages")
    if batch_size < mesh.dp * n_mb:
        raise ValueError(f"batch_size {batch_size} cannot feed dp={mesh.dp} replicas x "
                         f"{n_mb} microbatches")
    model_fn = functools.partial(make_mlp, sizes, seed)
    batches = make_batches(steps, batch_size, sizes[0], sizes[-1], seed)
    result = launch(train_hybrid, world_size, mesh, model_fn(), batches, schedule, None,
                    optimizer_factory(optimizer, lr), backend=backend,
                    timeout=options.get("timeout") or DEFAULT_TIMEOUT_S)
    ref_params, ref_losses = train_single(model_fn, batches, optimizer, lr)
    diff = max(max_abs_diff({k: v for r in result.results if r["dp_index"] == d
                             for k, v in r["state"].items()}, ref_params)
               for d in range(mesh.dp))
    losses = result.results[mesh.rank_of(0, mesh.pp - 1)]["losses"]
    return {"strategy": "hybrid", "backend": backend, "world_size": world_size,
            "steps": steps, "optimizer": optimizer, "dp": mesh.dp, "pp": mesh.pp,
            "schedule": name, "microbatches": n_mb, "mesh": mesh.to_dict(), "losses": losses,
            "reference_losses": ref_losses, "final_loss": losses[-1],
            "reference_final_loss": ref_losses[-1], "max_abs_param_diff": diff,
            "makespan_s": result.trace.makespan}
