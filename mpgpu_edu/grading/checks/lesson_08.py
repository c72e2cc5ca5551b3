"""Checks of lesson 08: a rank's flat shard, and the capstone, a sharded (ZeRO-3 / FSDP) layer
wrapper.

Every case has two halves: *compute* runs the learner's function (on the simulator for the
wrapper) and returns plain data (shards, gradients, the collectives it called and their
sizes, makespans, the trace as a dict); *judge* rebuilds the reference from the grader's own
code and compares. The oracle for the wrapper is single-device training on the same batches;
its shards are ``mpgpu_edu.dp.fsdp.flat_shard`` of the single-device parameters.

The package's own wrapper (``mpgpu_edu.dp.fsdp``) is out of the capstone's reach: while the
learner's code runs, every public name of that module raises (``without_reference``), also
under the names the learner's module imported.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.grading.checks import Case, CheckFailure, Evidence
from mpgpu_edu.grading.checks._support import (compute_examples, evidence, examples, expect,
                                               expect_close, judge_examples, launch_facts,
                                               run_spmd, showing)

Impl = Callable[..., Any]
REFERENCE_MODULE = "mpgpu_edu.dp.fsdp"


@contextlib.contextmanager
def without_reference(impl: Impl, exercise_id: str) -> Iterator[None]:
    """While inside, every public function and class of ``mpgpu_edu.dp.fsdp`` raises when
    called, also under the names the learner's module imported (as ``from_scratch`` does
    for the collectives)."""
    import importlib

    module = importlib.import_module(REFERENCE_MODULE)
    targets = {name: value for name, value in vars(module).items()
               if not name.startswith("_") and (inspect.isfunction(value)
                                                or inspect.isclass(value))
               and getattr(value, "__module__", "") == REFERENCE_MODULE}
    patched: list[tuple[Any, str, Any]] = [(module, name, value)
                                           for name, value in targets.items()]
    learner = getattr(impl, "__globals__", {})
    ids = {id(value): name for name, value in targets.items()}
    patched += [(learner, name, value) for name, value in list(learner.items())
                if id(value) in ids]
    try:
        for owner, name, value in patched:
            _set(owner, name, _blocker(exercise_id, f"{REFERENCE_MODULE}.{ids[id(value)]}"))
        yield
    finally:
        for owner, name, value in reversed(patched):
            _set(owner, name, value)


def _blocker(exercise_id: str, display: str) -> Impl:
    def blocked(*args: Any, **kwargs: Any) -> Any:
        raise CheckFailure(f"exercise {exercise_id} is yours to write, but it called "
                           f"{display}, the package's own")
    return blocked


def _set(owner: Any, name: str, value: Any) -> None:
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)


def _reference_shard(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    from mpgpu_edu.dp.fsdp import flat_shard

    return flat_shard([flat], rank, world_size)


# ---- 8.1 a rank's shard ---------------------------------------------------------------------

def _shards(cases: list[tuple[int, int]], dtype: torch.dtype = torch.float32) -> Impl:
    def compute(impl: Impl) -> list[dict]:
        out = []
        for numel, n in cases:
            flat = torch.arange(1, numel + 1, dtype=dtype)
            before = flat.clone()
            got = [impl(flat, r, n) for r in range(n)]
            out.append({"numel": numel, "n": n, "shards": got,
                        "views": [g.untyped_storage().data_ptr()
                                  == flat.untyped_storage().data_ptr() for g in got],
                        "storage": [g.untyped_storage().nbytes() for g in got],
                        "untouched": bool(torch.equal(flat, before))})
        return out
    return compute


def _judge_one_shards(out: dict, numel: int, n: int) -> None:
    flat = torch.arange(1, numel + 1, dtype=out["shards"][0].dtype if out["shards"] else
                        torch.float32)
    expect(out["untouched"], f"E={numel}, N={n}: shard_of changed its input")
    for rank, got in enumerate(out["shards"]):
        want = _reference_shard(flat, rank, n)
        expect(isinstance(got, torch.Tensor) and got.dim() == 1,
               f"E={numel}, N={n}, rank {rank}: expected a 1-D tensor")
        expect(got.numel() == want.numel(),
               f"E={numel}, N={n}, rank {rank}: a shard of {got.numel()} elements; every "
               f"shard has ceil(E/N) = {want.numel()} (all-gather needs equal pieces)")
        expect_close(got, want, f"E={numel}, N={n}, rank {rank}'s shard")
        expect(got.dtype == flat.dtype, f"E={numel}, N={n}: the shard's dtype is "
                                        f"{got.dtype}, the vector's {flat.dtype}")


def _judge_shards(records: list[dict]) -> None:
    for out in records:
        _judge_one_shards(out, out["numel"], out["n"])


def _judge_own_memory(records: list[dict]) -> None:
    """Each shard owns its memory: no view of the vector, nor of a padded copy (whose whole
    storage a view keeps alive)."""
    _judge_shards(records)
    for out in records:
        numel, n = out["numel"], out["n"]
        for rank, (got, view, storage) in enumerate(zip(out["shards"], out["views"],
                                                        out["storage"])):
            own = got.numel() * got.element_size()
            expect(not view or own == 0,
                   f"E={numel}, N={n}, rank {rank}: the shard is a view of the vector, so the "
                   "whole vector stays in memory")
            expect(storage == own,
                   f"E={numel}, N={n}, rank {rank}: the shard's storage holds {storage} bytes "
                   f"for its {own}: it is a view of a larger tensor (the padded copy?), which "
                   "stays in memory as long as the shard does")


SHARD_EXAMPLES = examples(10, seed=81, numel=(1, 400), n=(2, 9))


def _shards_hidden(impl: Impl) -> list[dict]:
    return compute_examples(lambda numel, n: _shards([(numel, n)], torch.float64)(impl)[0],
                            SHARD_EXAMPLES)


def _judge_shards_hidden(records: list[dict]) -> None:
    def one(out: dict, numel: int, n: int) -> None:
        try:
            _judge_one_shards(out, numel, n)
        except CheckFailure as exc:
            raise AssertionError(str(exc)) from None
    judge_examples(records, one)


# ---- 8.2 the sharded wrapper --------------------------------------------------------------

LR = 0.05
WIDTHS = (6, 9, 7, 3)  # layers of 63, 70 and 24 elements: none divides by 3 or 4


def _model(widths: tuple[int, ...], seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _batch(n_samples: int, widths: tuple[int, ...], seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n_samples, widths[0], generator=generator),
            torch.randn(n_samples, widths[-1], generator=generator))


def _layer_flats(model: nn.Sequential) -> list[torch.Tensor]:
    return [torch.cat([p.detach().reshape(-1) for p in layer.parameters()])
            for layer in model if any(True for _ in layer.parameters())]


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
        return record

    owners = [collectives, allgather, getattr(impl, "__globals__", {})]
    patched = []
    for owner in owners:
        items = owner.items() if isinstance(owner, dict) else vars(owner).items()
        for name, value in list(items):
            for kind, fn in originals.items():
                if value is fn:
                    patched.append((owner, name, value))
                    _set(owner, name, recorder(kind))
    try:
        yield calls
    finally:
        for owner, name, value in reversed(patched):
            _set(owner, name, value)


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


def _same(tensor: torch.Tensor, want: torch.Tensor) -> bool:
    return (tensor.shape == want.shape and not tensor.is_meta
            and torch.equal(tensor.detach().cpu(), want))


def _program(impl: Impl, widths: tuple[int, ...], n_samples: int, steps: int,
             optimizer: str, prefetch: bool) -> Callable[..., Any]:
    base = _model(widths)
    batches = [_batch(n_samples, widths, seed=10 + s) for s in range(steps)]

    def program(comm: Any) -> dict:
        module = copy.deepcopy(base)
        replica = impl(comm, module, prefetch)
        shards = list(replica.parameters())
        start = [s.detach().clone() for s in shards]
        opt = (torch.optim.SGD(shards, lr=LR) if optimizer == "sgd"
               else torch.optim.Adam(shards, lr=LR))
        grads = []
        saved = _SavedWeights(base)
        for step, (x, y) in enumerate(batches):
            xs, ys = (torch.tensor_split(t, comm.world_size)[comm.rank] for t in (x, y))
            share = len(xs) / len(x)
            with saved if step == 0 else contextlib.nullcontext():
                out = replica(xs)
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
                "is_param": all(isinstance(s, nn.Parameter) for s in shards)}
    return program


def _run(impl: Impl, n: int, widths: tuple[int, ...], *, n_samples: int = 12, steps: int = 3,
         optimizer: str = "sgd", prefetch: bool = False, cluster: Cluster | None = None,
         with_trace: bool = False) -> dict:
    """compute: the learner's wrapper trains ``steps`` steps on ``n`` ranks; every rank's
    shards at the start and the end, their gradients after each ``finish``, and the
    collectives it called."""
    return _launch(impl, _program(impl, widths, n_samples, steps, optimizer, prefetch),
                   cluster or n, with_trace)


def _launch(impl: Impl, program: Callable[..., Any], cluster: Cluster | int,
            with_trace: bool = False) -> dict:
    with without_reference(impl, "8.2"), _recording(impl) as calls:
        result = run_spmd(program, cluster)
    facts = launch_facts(result, with_trace=with_trace)
    facts["calls"] = [list(call) for call in calls]
    return facts


ACCUMULATE = ((0, 1), (2,))  # batches per finish(): two backward passes, then one more


def _accumulate_program(impl: Impl, widths: tuple[int, ...], n_samples: int) -> Callable:
    base = _model(widths)
    batches = [_batch(n_samples, widths, seed=20 + s) for s in range(3)]

    def program(comm: Any) -> dict:
        replica = impl(comm, copy.deepcopy(base), False)
        shards = list(replica.parameters())
        grads = []
        for group in ACCUMULATE:
            for s in group:
                xs, ys = (torch.tensor_split(t, comm.world_size)[comm.rank] for t in batches[s])
                share = len(xs) / n_samples
                loss = nn.functional.mse_loss(replica(xs), ys) * share * comm.world_size
                loss.backward()
            replica.finish()  # no zero_grad: .grad adds up, as torch's does
            grads.append([None if s.grad is None else s.grad.detach().clone() for s in shards])
        return {"grads": grads}
    return program


def _accumulation(impl: Impl) -> dict:
    return _launch(impl, _accumulate_program(impl, WIDTHS, 12), 3)


def _judge_accumulation(data: dict, n: int = 3, widths: tuple[int, ...] = WIDTHS,
                        n_samples: int = 12) -> None:
    model = _model(widths)
    per_batch = []  # one device's gradient of each batch, per layer
    for s in range(3):
        x, y = _batch(n_samples, widths, seed=20 + s)
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        per_batch.append([torch.cat([p.grad.reshape(-1) for p in layer.parameters()])
                          for layer in model if any(True for _ in layer.parameters())])
    done: list[int] = []
    for rank, held in enumerate(data["results"]):
        done = []
        for finish, group in enumerate(ACCUMULATE):
            done += group
            passes = " and ".join(f"batch {s}" for s in group)
            for layer, got in enumerate(held["grads"][finish]):
                want = _reference_shard(sum(per_batch[s][layer] for s in done), rank, n)
                expect(got is not None, f"rank {rank}: layer {layer}'s shard has no .grad "
                                        f"after finish() number {finish + 1}")
                last = _reference_shard(per_batch[group[-1]][layer], rank, n)
                expect(not (torch.allclose(got, last, rtol=1e-4, atol=1e-6)
                            and not torch.allclose(want, last, rtol=1e-4, atol=1e-6)),
                       f"rank {rank}, layer {layer}: backward of {passes}, then finish() "
                       f"(number {finish + 1}, no zero_grad since the start): .grad holds "
                       f"only batch {group[-1]}'s gradient; it should hold the sum of every "
                       f"backward since .grad was last cleared (batches {done})")
                expect_close(got, want,
                             f"rank {rank}, layer {layer}: .grad after backward of {passes} "
                             f"and finish() number {finish + 1}, without zero_grad (the sum "
                             f"of batches {done}' mean gradients)", rtol=1e-4, atol=1e-6)


def _reference(widths: tuple[int, ...], n_samples: int, steps: int,
               optimizer: str) -> tuple[list, list, list]:
    """Single-device training: each layer's flat parameters at the start and the end, and
    each step's flat gradients."""
    model = _model(widths)
    start = _layer_flats(model)
    opt = (torch.optim.SGD(model.parameters(), lr=LR) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=LR))
    grads = []
    for s in range(steps):
        x, y = _batch(n_samples, widths, seed=10 + s)
        nn.functional.mse_loss(model(x), y).backward()
        grads.append([torch.cat([p.grad.reshape(-1) for p in layer.parameters()])
                      for layer in model if any(True for _ in layer.parameters())])
        opt.step()
        opt.zero_grad()
    return start, _layer_flats(model), grads


def _judge_values(data: dict, n: int, widths: tuple[int, ...], n_samples: int = 12,
                  steps: int = 3, optimizer: str = "sgd", grads: bool = True) -> None:
    start, final, ref_grads = _reference(widths, n_samples, steps, optimizer)
    expect(len(data["results"]) == n, f"expected results from {n} ranks")
    for rank, held in enumerate(data["results"]):
        expect(held["is_param"], f"rank {rank}: replica.parameters() must yield nn.Parameters")
        expect(len(held["start"]) == len(start),
               f"rank {rank}: replica.parameters() gave {len(held['start'])} shards; the "
               f"model has {len(start)} layers with parameters, one shard each")
        expect(held["untouched"], f"rank {rank}: wrap_fsdp changed the module it was given")
        for layer, (got, flat) in enumerate(zip(held["start"], start)):
            expect_close(got, _reference_shard(flat, rank, n),
                         f"rank {rank}'s shard of layer {layer} when wrap_fsdp returned "
                         f"(shard_of of the layer's flattened parameters)")
        if grads:
            for step, per_layer in enumerate(held["grads"]):
                for layer, (got, flat) in enumerate(zip(per_layer, ref_grads[step])):
                    expect(got is not None, f"rank {rank}, step {step}: layer {layer}'s shard "
                                            "has no .grad after finish()")
                    expect_close(got, _reference_shard(flat, rank, n),
                                 f"rank {rank}, step {step}: the .grad of layer {layer}'s "
                                 "shard (the mean over ranks of the gradient's shard)",
                                 rtol=1e-4, atol=1e-6)
        for layer, (got, flat) in enumerate(zip(held["final"], final)):
            expect_close(got, _reference_shard(flat, rank, n),
                         f"after {steps} {optimizer} steps on {n} ranks, rank {rank}'s shard of "
                         f"layer {layer} differs from one device's training", rtol=1e-4,
                         atol=1e-5)


def _judge_calls(data: dict, n: int, widths: tuple[int, ...], steps: int = 3) -> None:
    flats = [f.numel() for f in _layer_flats(_model(widths))]
    shard = [-(-e // n) for e in flats]
    gathers = (shard + shard[::-1]) * steps
    reduces = [s * n for s in shard[::-1]] * steps
    for rank in range(n):
        mine = [c for c in data["calls"] if c[0] == rank]
        got_g = [numel for _, kind, numel, *_ in mine if kind == "all_gather"]
        got_r = [numel for _, kind, numel, *_ in mine if kind == "reduce_scatter"]
        expect(got_g == gathers,
               f"rank {rank} all-gathered {len(got_g)} times in {steps} steps, first tensors "
               f"of {got_g[:2 * len(shard)]} elements; per step the contract gathers each "
               f"layer's shard in forward order, then again in backward order: "
               f"{shard + shard[::-1]} elements")
        expect(got_r == reduces,
               f"rank {rank} reduce-scattered tensors of {got_r[:len(shard)]} elements in its "
               f"first step; per step, one per layer in backward order, of the padded "
               f"gradient ({[s * n for s in shard[::-1]]} elements)")
        ops = {op for _, kind, _, op, *_ in mine if kind == "reduce_scatter"}
        expect(ops == {"mean"}, f"rank {rank} reduce-scattered with op {sorted(ops)}: the "
                                "gradient is the mean over ranks")


def _judge_freed(data: dict) -> None:
    for rank, held in enumerate(data["results"]):
        expect(not held["kept"],
               f"rank {rank}: in forward, autograd kept the full parameters of layer(s) "
               f"{held['kept']} (of the model's Sequential) for backward, so every gathered "
               "layer stays in memory until backward reaches it: the contract frees them "
               "after the layer's forward and gathers them again for its backward")


def _basic(impl: Impl) -> dict:
    return _run(impl, 3, WIDTHS)


def _judge_basic(data: dict) -> None:
    _judge_values(data, 3, WIDTHS)


def _judge_basic_calls(data: dict) -> None:
    _judge_calls(data, 3, WIDTHS)


def _adam_prefetch(impl: Impl) -> dict:
    return _run(impl, 4, WIDTHS, n_samples=14, optimizer="adam", prefetch=True)


def _judge_adam_prefetch(data: dict) -> None:
    _judge_values(data, 4, WIDTHS, n_samples=14, optimizer="adam", grads=False)
    _judge_calls(data, 4, WIDTHS)


PREFETCH_WIDTHS = (256, 512, 512, 512, 256)


def _prefetch_cluster() -> Cluster:
    return Cluster.preset("8xA100-nvlink", visible="0,1,2,3")


def _prefetch_runs(impl: Impl) -> dict:
    runs = {}
    for prefetch in (False, True):
        runs[str(prefetch)] = _run(impl, 4, PREFETCH_WIDTHS, n_samples=256, steps=1,
                                   prefetch=prefetch, cluster=_prefetch_cluster(),
                                   with_trace=True)
    inline = sorted({call[0] for run in runs.values() for call in run["calls"] if not call[4]})
    return {"plain": runs["False"]["trace"], "prefetch": runs["True"]["trace"],
            "makespans": [runs["False"]["makespan"], runs["True"]["makespan"]],
            "inline": inline}


def _judge_prefetch(data: dict) -> Evidence:
    shown = evidence({"yours, prefetch=False": data["plain"],
                      "yours, prefetch=True": data["prefetch"]})
    plain, ahead = data["makespans"]
    with showing(shown):
        expect(not data["inline"],
               f"rank(s) {data['inline']} called all_gather or reduce_scatter in the rank's "
               "own program, not on its comm stream: the program waits for each collective, "
               "so no gather can run while a layer computes; the contract runs every "
               "collective on the comm stream (comm.run_async)")
        expect(ahead < 0.97 * plain,
               f"with prefetch the step takes {ahead * 1e6:.0f} us, without {plain * 1e6:.0f} "
               "us: the next layer's gather does not run while this layer computes")
    return shown


HIDDEN = examples(5, seed=83, world_size=(2, 5), hidden=(3, 11), prefetch=(0, 1))


def _example(world_size: int, hidden: int, prefetch: int) -> tuple[tuple[int, ...], int, str]:
    return (5, hidden, hidden + 3, 2), 4 * world_size + 1, "adam" if prefetch else "sgd"


def _hidden(impl: Impl) -> list[dict]:
    def body(world_size: int, hidden: int, prefetch: int) -> dict:
        widths, n_samples, optimizer = _example(world_size, hidden, prefetch)
        return _run(impl, world_size, widths, n_samples=n_samples, steps=2,
                    optimizer=optimizer, prefetch=bool(prefetch))
    return compute_examples(body, HIDDEN)


def _judge_hidden(records: list[dict]) -> None:
    def one(out: dict, world_size: int, hidden: int, prefetch: int) -> None:
        widths, n_samples, optimizer = _example(world_size, hidden, prefetch)
        try:
            _judge_values(out, world_size, widths, n_samples, 2, optimizer,
                          grads=optimizer == "sgd")
            _judge_calls(out, world_size, widths, steps=2)
        except CheckFailure as exc:
            raise AssertionError(str(exc)) from None
    judge_examples(records, one)


CASES: dict[str, list[Case]] = {
    "8.1": [
        Case("the docstring's example", 1, _shards([(5, 2)]), _judge_shards),
        Case("equal shards, zero padding at the end, each a tensor of its own", 1,
             _shards([(10, 3), (12, 4), (2, 5), (0, 3)]), _judge_own_memory),
        Case("hidden: other sizes and world sizes", 1, _shards_hidden, _judge_shards_hidden,
             hidden=True),
    ],
    "8.2": [
        Case("3 ranks: the shards, the mean gradients, then one device's training", 4,
             _basic, _judge_basic),
        Case("collectives: two all-gathers and one reduce-scatter (mean) per layer", 3,
             _basic, _judge_basic_calls),
        Case("memory: forward leaves no layer's full parameters for backward", 2,
             _basic, _judge_freed),
        Case("gradients accumulate: two backward passes before finish(), then one more", 2,
             _accumulation, _judge_accumulation),
        Case("4 ranks, Adam, uneven batch shards, prefetch on", 3, _adam_prefetch,
             _judge_adam_prefetch),
        Case("timeline: prefetch hides the gathers", 3, _prefetch_runs, _judge_prefetch,
             timeout_s=60.0),
        Case("hidden: 2-5 ranks, other widths, SGD and Adam", 3, _hidden, _judge_hidden,
             hidden=True, timeout_s=60.0),
    ],
}
