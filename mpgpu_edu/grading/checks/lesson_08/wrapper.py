"""Exercise 8.2, the sharded wrapper: the compute halves. They train the learner's wrapper on the
simulator (the package's own wrapper, all of ``mpgpu_edu.dp.fsdp``, is out of reach: the
grader blocks it for every exercise, ``grading.compute.ANSWERS``), record the collectives it
calls and the weights autograd keeps, and return plain facts."""

from __future__ import annotations

import contextlib
import copy
import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.grading.checks._support import compute_examples, launch_facts, rebound, run_spmd
from mpgpu_edu.grading.checks.lesson_08.setup import (ACCUMULATE, HIDDEN, LR, WIDTHS, Impl,
                                                      _batch, _example, _model,
                                                      _prefetch_cluster, _same)


@contextlib.contextmanager
def _recording(impl: Impl) -> Iterator[list]:
    """While inside, every call of the package's ``all_gather`` and ``reduce_scatter`` (also
    under the names the learner's module imported) is recorded as (rank, kind, numel, op,
    whether it ran on the rank's comm stream)."""
    import mpgpu_edu.collectives as collectives
    from mpgpu_edu.collectives import allgather

    calls: list = []
    originals = {"all_gather": allgather.all_gather, "reduce_scatter": allgather.reduce_scatter}

    def recorder(kind: str) -> Impl:
        def record(comm: Any, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            op = kwargs.get("op", args[0] if args else "sum")
            calls.append((comm.rank, kind, tensor.numel(), op if kind != "all_gather" else "",
                          _on_comm_stream(comm)))
            return originals[kind](comm, tensor, *args, **kwargs)
        record.recorded_kind = kind  # type: ignore[attr-defined]  # (_GathersAhead)
        return record

    owners = [collectives, allgather, getattr(impl, "__globals__", {})]
    with rebound(owners, [(fn, recorder(kind)) for kind, fn in originals.items()]):
        yield calls


def _on_comm_stream(comm: Any) -> bool:
    """Whether the simulated rank is running a job of its comm stream (``comm.run_async``)
    rather than its own program."""
    from mpgpu_edu.comm.ops import HOST

    actor = getattr(comm, "actor", None)
    return bool(callable(actor) and getattr(actor(), "lane", HOST) != HOST)


class _SavedWeights(torch.autograd.graph.saved_tensors_hooks):
    """While the first forward runs: the layers whose full parameters autograd was asked to
    keep for backward (a saved tensor equal to a layer's weight, bias or flat vector)."""

    def __init__(self, model: nn.Sequential) -> None:
        self.kept: set[int] = set()
        self.layers = [(i, [p.detach() for p in layer.parameters()])
                       for i, layer in enumerate(model) if any(True for _ in layer.parameters())]
        super().__init__(self._pack, lambda tensor: tensor)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for i, params in self.layers:
                flat = torch.cat([p.reshape(-1) for p in params])
                if any(_same(tensor, p) or _same(tensor, p.t())  # addmm saves W transposed
                       for p in params if p.dim() == 2) or (
                        tensor.dim() == 1 and tensor.numel() >= flat.numel()
                        and _same(tensor[: flat.numel()], flat)):
                    self.kept.add(i)
        return tensor


class _GatheredAlive:
    """Forward hooks on the model's layers that, while ``on``, keep weak references to the
    parameters each layer ran with (a gathered vector's views, and the vector they view), so
    that after forward ``alive()`` names the layers whose gathered parameters someone still
    holds (a dict of them, a list, an attribute): autograd's saved tensors are not the only
    way to keep them."""

    def __init__(self, model: nn.Sequential) -> None:
        self.on, self.refs = False, []
        self.own = {id(p) for p in model.parameters()}
        for i, layer in enumerate(model):
            names = [name for name, _ in layer.named_parameters()]
            if names:
                layer.register_forward_hook(self._hook(i, names))

    def _hook(self, i: int, names: list[str]) -> Callable[..., None]:
        def record(layer: nn.Module, _inputs: Any, _output: Any) -> None:
            if not self.on:
                return
            for name in names:
                tensor = getattr(layer, name)
                for t in (tensor, tensor._base):
                    if isinstance(t, torch.Tensor) and id(t) not in self.own:
                        self.refs.append((i, weakref.ref(t)))
        return record

    def alive(self) -> list[int]:
        gc.collect()
        return sorted({i for i, ref in self.refs if ref() is not None})


class _GathersAhead:
    """While ``on``: at each forward of a layer with parameters, how many all-gathers the
    rank had started (``comm.run_async`` of the recorded ``all_gather``) beyond the layers
    run so far, this one included: 1 is the next layer's prefetch, 0 none, more a gather
    of a layer after the next one already started."""

    def __init__(self, comm: Any, model: nn.Sequential) -> None:
        self.on, self.started, self.ahead = False, 0, []
        original = comm.run_async

        def run_async(fn: Callable[..., Any], *args: Any) -> Any:
            if getattr(fn, "recorded_kind", "") == "all_gather":
                self.started += 1
            return original(fn, *args)
        comm.run_async = run_async
        for layer in model:
            if any(True for _ in layer.parameters()):
                layer.register_forward_hook(self._hook)

    def _hook(self, _layer: nn.Module, _inputs: Any, _output: Any) -> None:
        if self.on:
            self.ahead.append(self.started - len(self.ahead) - 1)


def _shards(batches: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> list[list[Any]]:
    """Rank r's slice of every batch: one entry per rank, hidden from the other ranks where
    the ranks run apart."""
    return [[(torch.tensor_split(x, n)[r], torch.tensor_split(y, n)[r]) for x, y in batches]
            for r in range(n)]


def _program(impl: Impl, widths: tuple[int, ...], n_samples: int, steps: int,
             optimizer: str, prefetch: bool, shards_of: list[list[Any]]) -> Callable[..., Any]:
    base = _model(widths)

    def program(comm: Any) -> dict:
        module = copy.deepcopy(base)
        gathers = _GathersAhead(comm, module)
        replica = impl(comm, module, prefetch)
        shards = list(replica.parameters())
        start = [s.detach().clone() for s in shards]
        opt = (torch.optim.SGD(shards, lr=LR) if optimizer == "sgd"
               else torch.optim.Adam(shards, lr=LR))
        grads, alive = [], []
        saved, held = _SavedWeights(base), _GatheredAlive(module)
        for step, (xs, ys) in enumerate(shards_of[comm.rank]):
            share = len(xs) / n_samples
            held.on = gathers.on = step == 0
            with saved if step == 0 else contextlib.nullcontext():
                out = replica(xs)
            if step == 0:
                held.on, gathers.on, alive = False, False, held.alive()
            with comm.compute("compute", "loss"):
                loss = nn.functional.mse_loss(out, ys) * share * comm.world_size
            loss.backward()
            replica.finish()
            grads.append([None if s.grad is None else s.grad.detach().clone() for s in shards])
            opt.step()
            opt.zero_grad()
        untouched = all(torch.equal(a, b) for a, b in zip(module.state_dict().values(),
                                                          base.state_dict().values()))
        return {"start": start, "final": [s.detach().clone() for s in shards],
                "grads": grads, "untouched": untouched, "kept": sorted(saved.kept),
                "alive": alive, "ahead": gathers.ahead,
                "is_param": all(isinstance(s, nn.Parameter) for s in shards)}
    return program


def _run(impl: Impl, n: int, widths: tuple[int, ...], *, n_samples: int = 12, steps: int = 3,
         optimizer: str = "sgd", prefetch: bool = False, cluster: Cluster | None = None,
         with_trace: bool = False) -> dict:
    """compute: the learner's wrapper trains ``steps`` steps on ``n`` ranks; every rank's
    shards at the start and the end, their gradients after each ``finish``, and the
    collectives it called."""
    shards_of = _shards([_batch(n_samples, widths, seed=10 + s) for s in range(steps)], n)
    return _launch(impl, _program(impl, widths, n_samples, steps, optimizer, prefetch,
                                  shards_of), cluster or n, with_trace, hide=[shards_of])


def _launch(impl: Impl, program: Callable[..., Any], cluster: Cluster | int,
            with_trace: bool = False, hide: list | tuple = ()) -> dict:
    """Run ``program`` with the collectives' calls recorded; each rank hands back its own
    calls (made in its own process where the ranks run apart)."""
    n = cluster if isinstance(cluster, int) else cluster.world_size
    mine: list[Any] = [None] * n
    with _recording(impl) as calls:
        def recorded(comm: Any) -> Any:
            out = program(comm)
            mine[comm.rank] = [list(call) for call in calls if call[0] == comm.rank]
            return out

        result = run_spmd(recorded, cluster, hide=hide, collect=[mine])
    facts = launch_facts(result, with_trace=with_trace)
    facts["calls"] = [call for rank_calls in mine for call in (rank_calls or [])]
    return facts


def _accumulate_program(impl: Impl, widths: tuple[int, ...], n_samples: int,
                        shards_of: list[list[Any]]) -> Callable:
    base = _model(widths)

    def program(comm: Any) -> dict:
        replica = impl(comm, copy.deepcopy(base), False)
        shards = list(replica.parameters())
        grads = []
        for group in ACCUMULATE:
            for s in group:
                xs, ys = shards_of[comm.rank][s]
                share = len(xs) / n_samples
                loss = nn.functional.mse_loss(replica(xs), ys) * share * comm.world_size
                loss.backward()
            replica.finish()  # no zero_grad: .grad adds up, as torch's does
            grads.append([None if s.grad is None else s.grad.detach().clone() for s in shards])
        return {"grads": grads}
    return program


def _accumulation(impl: Impl) -> dict:
    shards_of = _shards([_batch(12, WIDTHS, seed=20 + s) for s in range(3)], 3)
    return _launch(impl, _accumulate_program(impl, WIDTHS, 12, shards_of), 3,
                   hide=[shards_of])


def _basic(impl: Impl) -> dict:
    return _run(impl, 3, WIDTHS)


def _adam_prefetch(impl: Impl) -> dict:
    return _run(impl, 4, WIDTHS, n_samples=14, optimizer="adam", prefetch=True)


def _prefetch_runs(impl: Impl) -> dict:
    """The notebook's step (``bigger_models.sharded_step``: the wrapping untimed, a barrier,
    then forward, backward, ``finish`` and the optimizer) with and without prefetch; each
    trace from the barrier on (``step_only``, applied by the judge), as the learner's
    timeline shows it."""
    from mpgpu_edu.lessons import bigger_models as bm
    from mpgpu_edu.replica.data import make_batches, make_mlp

    model = make_mlp(bm.SHARDED_SIZES, seed=0)
    batch = make_batches(1, bm.SHARDED_BATCH, bm.SHARDED_SIZES[0], bm.SHARDED_SIZES[-1],
                         seed=1)[0]
    runs = {}
    for prefetch in (False, True):
        def program(comm: Any, prefetch: bool = prefetch) -> float:
            return bm.sharded_step(comm, impl, copy.deepcopy(model), batch, prefetch)
        runs[str(prefetch)] = _launch(impl, program, _prefetch_cluster(), with_trace=True)
    inline = sorted({call[0] for run in runs.values() for call in run["calls"] if not call[4]})
    return {"plain": runs["False"], "prefetch": runs["True"], "inline": inline}


def _hidden(impl: Impl) -> list[dict]:
    def body(world_size: int, hidden: int, prefetch: int) -> dict:
        widths, n_samples, optimizer = _example(world_size, hidden, prefetch)
        return _run(impl, world_size, widths, n_samples=n_samples, steps=2,
                    optimizer=optimizer, prefetch=bool(prefetch))
    return compute_examples(body, HIDDEN)
