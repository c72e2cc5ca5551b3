"""Checks of lesson 03: gradient averaging, buckets, overlap with backward, Adam's memory, and
the capstone, a DDP wrapper.

Every case has two halves: *compute* runs the learner's function on the simulator and returns
plain data (gradients, parameters, byte counts, the trace as a dict, the sizes of the tensors
it all-reduced); *judge* rebuilds the reference from the grader's own code and compares.

References: single-device training (averaging, DDP), ``mpgpu_edu.dp.make_buckets`` (buckets),
``mpgpu_edu.memory.bytes_per_param`` and ``estimate_memory`` (memory). The oracle for
averaging is single-device training: the mean of the ranks' gradients on equal slices of a
batch is the gradient of the whole batch. Overlap is read off the simulator's timeline:
communication must run while backward is still computing.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.dp import make_buckets
from mpgpu_edu.grading.checks import Case, CheckFailure, Evidence
from mpgpu_edu.grading.checks._support import (bytes_of, compute_examples, evidence, examples,
                                               expect, expect_close, judge_examples,
                                               launch_facts, run_spmd, showing, uniform)
from mpgpu_edu.memory import bytes_per_param, estimate_memory

Impl = Callable[..., Any]


# ---- models and data: built the same way by compute and by judge -----------------------------

def _model(widths: tuple[int, ...], seed: int = 0, norm: bool = False) -> nn.Sequential:
    """An MLP; ``norm`` puts a LayerNorm (two more parameters) after the first layer."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b, bias=not (norm and i == 1)))
        if i == 0 and norm:
            layers.append(nn.LayerNorm(b))
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def _batch(n_samples: int, widths: tuple[int, ...], seed: int = 1) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n_samples, widths[0], generator=generator),
            torch.randn(n_samples, widths[-1], generator=generator))


def _local_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def _names(widths: tuple[int, ...], norm: bool = False) -> list[str]:
    return [name for name, _ in _model(widths, norm=norm).named_parameters()]


# ---- 3.1 averaging ---------------------------------------------------------------------------

WIDTHS = (6, 5, 3)


def _averaging_program(impl: Impl, widths: tuple[int, ...], x: torch.Tensor, y: torch.Tensor,
                       overlap: bool = False) -> Callable[..., Any]:
    base = _model(widths)  # built here: rank threads must not share the global RNG

    def program(comm: Any) -> list[torch.Tensor]:
        model = copy.deepcopy(base)
        xs, ys = (torch.tensor_split(t, comm.world_size)[comm.rank] for t in (x, y))
        loss = nn.functional.mse_loss(model(xs), ys)
        if overlap:
            with comm.compute("backward", "backward"):
                impl(comm, model, loss)
        else:
            loss.backward()
            impl(comm, model)
        return [p.grad.clone() for p in model.parameters()]
    return program


def _averaged(impl: Impl, n: int, widths: tuple[int, ...], n_samples: int,
              overlap: bool = False, cluster: Cluster | None = None) -> dict:
    """compute: every rank's gradients after the learner averaged them, and the traffic."""
    x, y = _batch(n_samples, widths)
    result = run_spmd(_averaging_program(impl, widths, x, y, overlap), cluster or uniform(n))
    return {"grads": result.results, "stats": launch_facts(result)["stats"]}


def _expect_mean_close(got: Any, want: torch.Tensor, n: int, what: str) -> None:
    """``expect_close``, saying so when ``got`` is ``n`` times ``want`` (a sum over the ranks
    where their mean was due)."""
    if (n > 1 and isinstance(got, torch.Tensor) and got.shape == want.shape
            and want.abs().max() > 1e-6
            and torch.allclose(got.double(), n * want.double(), rtol=1e-5, atol=1e-6)):
        raise CheckFailure(f"{what}: every value is {n} times the expected one (N = {n} "
                           "ranks)")
    expect_close(got, want, what)


def _judge_mean(data: dict, n: int, widths: tuple[int, ...], n_samples: int) -> None:
    x, y = _batch(n_samples, widths)
    model = _model(widths)
    per_rank = [_local_grads(model, torch.tensor_split(x, n)[r], torch.tensor_split(y, n)[r])
                for r in range(n)]
    want = [torch.stack(grads).mean(0) for grads in zip(*per_rank)]
    expect(len(data["grads"]) == n, f"expected results from {n} ranks")
    for rank, grads in enumerate(data["grads"]):
        for name, got, expected in zip(_names(widths), grads, want):
            _expect_mean_close(got, expected, n, f"N={n}: rank {rank}'s gradient of {name}")


def _judge_single_device(data: dict) -> None:
    x, y = _batch(12, WIDTHS)
    full = _local_grads(_model(WIDTHS), x, y)
    for rank, grads in enumerate(data["grads"]):
        for name, got, want in zip(_names(WIDTHS), grads, full):
            _expect_mean_close(got, want, len(data["grads"]),
                               f"rank {rank}'s gradient of {name} against one device "
                               "training on the whole batch")


def _judge_traffic(data: dict) -> None:
    n = 4
    _judge_mean(data, n, WIDTHS, 12)
    sizes = [p.numel() for p in _model(WIDTHS).parameters()]
    most = sum(2 * (n - 1) * bytes_of(-(-numel // n)) for numel in sizes)
    busiest = max(s["bytes_sent"] for s in data["stats"])
    expect(busiest <= most, f"the busiest rank sent {busiest} bytes; a ring all-reduce of "
                            f"every gradient sends at most {most} per rank (is one rank doing "
                            "all the work, as in a naive all-reduce?)")


AVERAGING_EXAMPLES = examples(8, seed=3, world_size=(1, 5), hidden=(1, 6))


def _averaging_hidden(impl: Impl) -> list[dict]:
    return compute_examples(
        lambda world_size, hidden: _averaged(impl, world_size, (4, hidden, 2),
                                             2 * world_size + 1),
        AVERAGING_EXAMPLES)


def _judge_averaging_hidden(records: list[dict]) -> None:
    judge_examples(records, lambda out, world_size, hidden: _judge_mean(
        out, world_size, (4, hidden, 2), 2 * world_size + 1))


# ---- 3.2 buckets ------------------------------------------------------------------------------

def _reference_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """The package's ``make_buckets``, on byte-sized meta tensors, as parameter indices."""
    params = [torch.empty(size, dtype=torch.uint8, device="meta") for size in sizes]
    index = {id(p): i for i, p in enumerate(params)}
    return [[index[id(p)] for p in bucket] for bucket in make_buckets(params, bucket_bytes)]


def _bucket_outputs(impl: Impl, cases: list[tuple[list[int], int]]) -> list[dict]:
    out = []
    for sizes, bucket_bytes in cases:
        given = list(sizes)
        out.append({"sizes": list(sizes), "bucket_bytes": bucket_bytes,
                    "got": impl(given, bucket_bytes), "after": given})
    return out


def _judge_one_bucketing(out: dict, sizes: list[int], bucket_bytes: int) -> None:
    got = out["got"] if isinstance(out, dict) and "got" in out else out
    if isinstance(out, dict) and "after" in out:
        expect(out["after"] == sizes, f"make_buckets changed its input: {sizes} became "
                                      f"{out['after']}")
    want = _reference_buckets(sizes, bucket_bytes)
    if got != want:
        flat = ([i for bucket in got for i in bucket]
                if isinstance(got, list) and all(isinstance(b, list) for b in got) else None)
        why = ("every parameter must be in exactly one bucket"
               if flat is None or sorted(flat) != list(range(len(sizes)))
               else "the buckets do not follow the order and the limit the docstring states")
        raise CheckFailure(f"make_buckets({sizes}, {bucket_bytes}) returned {got}, expected "
                           f"{want}: {why}")


def _bucket_case(cases: list[tuple[list[int], int]]) -> tuple[Impl, Impl]:
    def judge(outputs: list[dict]) -> None:
        for out in outputs:
            _judge_one_bucketing(out, out["sizes"], out["bucket_bytes"])
    return (lambda impl: _bucket_outputs(impl, cases)), judge


def _bucket_examples(count: int = 60, seed: int = 5) -> list[dict]:
    """Random size lists, shortest first (so the first failure reported is a short one)."""
    rng = random.Random(seed)
    drawn = [{"sizes": [rng.randint(1, 64) for _ in range(rng.randint(0, 12))],
              "bucket_bytes": rng.randint(1, 100)} for _ in range(count)]
    return sorted(drawn, key=lambda d: (len(d["sizes"]), sum(d["sizes"]), d["bucket_bytes"]))


BUCKET_EXAMPLES = _bucket_examples()


def _buckets_hidden(impl: Impl) -> list[dict]:
    def body(sizes: list[int], bucket_bytes: int) -> dict:
        given = list(sizes)
        return {"got": impl(given, bucket_bytes), "after": given}
    return compute_examples(body, BUCKET_EXAMPLES)


def _judge_buckets_hidden(records: list[dict]) -> None:
    judge_examples(records, _judge_one_bucketing)


# ---- 3.3 overlap ------------------------------------------------------------------------------

OVERLAP_WIDTHS = (256, 256, 256, 256, 256)
OVERLAP_SAMPLES = 64


def _overlap_cluster(n: int) -> Cluster:
    # A slow device on a fast network: backward and the all-reduces take similar time.
    return Cluster.uniform(n, alpha_s=1e-6, beta_Bps=5e10, gpu="CPU-16GB")


def _after_backward(comm: Any, model: nn.Module, loss: torch.Tensor) -> None:
    """The grader's no-overlap baseline: all-reduce every gradient after backward."""
    loss.backward()
    for param in model.parameters():
        all_reduce(comm, param.grad, op="mean")


def _intervals_overlap(trace: Any, device: int, after: float = 0.0) -> float:
    """Seconds during which ``device`` computed backward and communicated at once."""
    compute = [(e.start, e.end) for e in trace.on(device, "compute") if e.kind == "backward"]
    comm = [(e.start, e.end) for e in trace.on(device, "comm") if e.start >= after]
    return sum(max(0.0, min(a1, b1) - max(a0, b0)) for a0, a1 in compute for b0, b1 in comm)


def _overlap_traces(impl: Impl) -> dict:
    x, y = _batch(OVERLAP_SAMPLES, OVERLAP_WIDTHS)
    cluster = _overlap_cluster(2)
    yours = run_spmd(_averaging_program(impl, OVERLAP_WIDTHS, x, y, True), cluster)
    plain = run_spmd(_averaging_program(_after_backward, OVERLAP_WIDTHS, x, y, True), cluster)
    return {"yours": launch_facts(yours, with_trace=True)["trace"],
            "plain": launch_facts(plain, with_trace=True)["trace"]}


def _judge_overlap_timeline(data: dict) -> Evidence:
    shown = evidence({"yours": data["yours"],
                      "no overlap (all-reduce after backward)": data["plain"]})
    yours, plain = shown.traces["yours"], shown.traces["no overlap (all-reduce after backward)"]
    with showing(shown):
        backward_end = max(e.end for e in yours.on(0, "compute") if e.kind == "backward")
        first_comm = min((e.start for e in yours.on(0, "comm")), default=float("inf"))
        expect(first_comm < backward_end,
               f"communication starts at {first_comm * 1e6:.1f} us, after backward ends at "
               f"{backward_end * 1e6:.1f} us")
        expect(_intervals_overlap(yours, 0) > 0,
               "communication and backward never run at the same time: every all-reduce "
               "holds backward up until it is done")
        expect(yours.makespan < plain.makespan,
               f"the step takes {yours.makespan * 1e6:.1f} us, no faster than all-reducing "
               f"after backward ({plain.makespan * 1e6:.1f} us)")
    return shown


def _hooks_after(impl: Impl) -> list:
    x, y = _batch(8, WIDTHS)
    base = _model(WIDTHS)

    def program(comm: Any) -> tuple[int, int]:
        model = copy.deepcopy(base)
        impl(comm, model, nn.functional.mse_loss(model(x), y))
        before = comm.stats.messages_sent
        nn.functional.mse_loss(model(x), y).backward()
        comm.run_async(lambda: None).wait()  # the comm stream is FIFO: earlier jobs are done
        return before, comm.stats.messages_sent

    return run_spmd(program, uniform(2)).results


def _judge_hooks_removed(results: list) -> None:
    for rank, (before, after) in enumerate(results):
        expect(after == before, f"rank {rank} sent {after - before} messages during a later "
                                "backward, after backward_with_overlap had returned")


# ---- 3.4 Adam's memory -----------------------------------------------------------------------

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
            expect(isinstance(got, dict),
                   f"adam_memory should return a dict, got {type(got).__name__}")
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
        bad = impl(_model((2, 2)), "fp8")
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
    expect(data["bad"] == "ValueError", f"adam_memory(model, 'fp8') returned {data['bad']}: "
                                        "the docstring says what a precision other than "
                                        "'fp32' or 'mixed' does")


# ---- 3.5 the DDP wrapper -----------------------------------------------------------------------

@contextlib.contextmanager
def _recording(impl: Impl) -> Iterator[dict[str, list]]:
    """While inside, every call of the package's ``all_reduce`` and ``broadcast`` (also under
    the names the learner's module imported) is recorded: ``{"all_reduce": [(rank, numel,
    phase)], "broadcast": [...]}``, where phase is what ``phase[0]`` held at the call."""
    import mpgpu_edu.collectives as collectives
    from mpgpu_edu.collectives import allreduce, basic

    calls: dict[str, list] = {"all_reduce": [], "broadcast": [], "phase": ["construct"]}
    originals = {"all_reduce": allreduce.all_reduce, "broadcast": basic.broadcast}

    def recorder(kind: str) -> Impl:
        def record(comm: Any, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            calls[kind].append((comm.rank, tensor.numel(), calls["phase"][0]))
            return originals[kind](comm, tensor, *args, **kwargs)
        return record

    owners = [collectives, allreduce, basic, getattr(impl, "__globals__", {})]
    patched = []
    for owner in owners:
        for name, original in list((vars(owner) if not isinstance(owner, dict)
                                    else owner).items()):
            for kind, fn in originals.items():
                if original is fn:
                    patched.append((owner, name, original))
                    _set(owner, name, recorder(kind))
    try:
        yield calls
    finally:
        for owner, name, original in reversed(patched):
            _set(owner, name, original)


def _set(owner: Any, name: str, value: Any) -> None:
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)


DDP_LR = 0.1


def _ddp_program(impl: Impl, widths: tuple[int, ...], norm: bool, n_samples: int, steps: int,
                 cap: int, calls: dict) -> Callable[..., Any]:
    replicas = [_model(widths, seed=0, norm=norm)] + [
        _model(widths, seed=100 + r, norm=norm) for r in range(1, 6)]  # rank 0's is the start
    batches = [_batch(n_samples, widths, seed=10 + s) for s in range(steps)]

    def program(comm: Any) -> dict:
        model = copy.deepcopy(replicas[comm.rank])
        wrapper = impl(comm, model, cap)
        start = [p.detach().clone() for p in model.parameters()]
        comm.barrier()  # every rank has finished constructing: now the steps
        calls["phase"][0] = "steps"
        optimizer = torch.optim.SGD(model.parameters(), lr=DDP_LR)
        for x, y in batches:
            xs, ys = (torch.tensor_split(t, comm.world_size)[comm.rank] for t in (x, y))
            share = len(xs) / len(x)
            with comm.compute("forward", "forward"):
                out = wrapper(xs)
            loss = nn.functional.mse_loss(out, ys) * share * comm.world_size
            with comm.compute("backward", "backward"):
                loss.backward()
            wrapper.finish()
            optimizer.step()
            optimizer.zero_grad()
        return {"start": start, "params": [p.detach().clone() for p in model.parameters()]}
    return program


def _ddp_run(impl: Impl, n: int, widths: tuple[int, ...], cap: int, *, norm: bool = False,
             n_samples: int = 12, steps: int = 3, cluster: Cluster | None = None,
             with_trace: bool = False) -> dict:
    """compute: the learner's DDP trains ``steps`` SGD steps on ``n`` ranks; what each rank
    holds after construction and at the end, what it all-reduced and broadcast, and when."""
    with _recording(impl) as calls:
        result = run_spmd(_ddp_program(impl, widths, norm, n_samples, steps, cap, calls),
                          cluster or uniform(n))
    facts = launch_facts(result, with_trace=with_trace)
    facts["all_reduce"] = [list(c) for c in calls["all_reduce"]]
    facts["broadcast"] = [list(c) for c in calls["broadcast"]]
    return facts


def _reference_training(widths: tuple[int, ...], norm: bool, n_samples: int,
                        steps: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    model = _model(widths, seed=0, norm=norm)
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=DDP_LR)
    for s in range(steps):
        x, y = _batch(n_samples, widths, seed=10 + s)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return start, [p.detach().clone() for p in model.parameters()]


def _bucket_numels(widths: tuple[int, ...], norm: bool, cap: int) -> list[int]:
    sizes = [p.numel() for p in _model(widths, norm=norm).parameters()]
    return [sum(sizes[i] for i in bucket)
            for bucket in _reference_buckets([4 * s for s in sizes], cap)]


def _judge_ddp_values(data: dict, n: int, widths: tuple[int, ...], cap: int, norm: bool = False,
                      n_samples: int = 12, steps: int = 3) -> None:
    start, final = _reference_training(widths, norm, n_samples, steps)
    names = _names(widths, norm)
    expect(len(data["results"]) == n, f"expected results from {n} ranks")
    for rank, held in enumerate(data["results"]):
        for name, got, want in zip(names, held["start"], start):
            expect_close(got, want, f"when wrap_ddp returned, rank {rank}'s {name} was not "
                                    "rank 0's")
    for rank, held in enumerate(data["results"]):
        for name, got, want in zip(names, held["params"], final):
            expect_close(got, want, f"after {steps} SGD steps on {n} ranks, rank {rank}'s {name} "
                                    "differs from one device's training on the whole batches",
                         rtol=1e-4, atol=1e-6)


def _judge_ddp_structure(data: dict, n: int, widths: tuple[int, ...], cap: int,
                         norm: bool = False, steps: int = 3) -> None:
    want = _bucket_numels(widths, norm, cap)
    total = sum(p.numel() for p in _model(widths, norm=norm).parameters())
    for rank in range(n):
        sent = [numel for r, numel, phase in data["all_reduce"] if r == rank and phase == "steps"]
        per_step = len(sent) // steps if sent else 0
        expect(len(sent) == steps * len(want) and sent == want * steps,
               f"rank {rank} all-reduced tensors of {sent[:per_step] if per_step else sent} "
               f"elements in a step (bucket cap {cap} bytes over {len(want)} buckets); the "
               f"contract's buckets hold {want} elements, in that order")
        during = [c for c in data["broadcast"] if c[0] == rank and c[2] == "steps"]
        expect(not during, f"rank {rank} broadcast {len(during)} times during training: the "
                           "parameters are broadcast once, when the wrapper is built")
        built = [c for c in data["all_reduce"] if c[0] == rank and c[2] == "construct"]
        expect(not built, f"rank {rank} all-reduced while the wrapper was being built")
        sent = [numel for r, numel, phase in data["broadcast"]
                if r == rank and phase == "construct"]
        expect(sent == [total],
               f"rank {rank} broadcast {len(sent)} tensor(s) while the wrapper was being built "
               f"(of {sent[:8]}{' ...' if len(sent) > 8 else ''} elements); the contract "
               f"says one broadcast, at construction, of all {total} parameter elements")


DDP_WIDTHS = (6, 8, 5, 3)  # parameters of 48, 8, 40, 5, 15, 3 elements
DDP_CAP = 180  # bytes: reverse order buckets of 23, 40, 8, 48 elements; forward: 18, 45, 8, 48


def _ddp_basic(impl: Impl) -> dict:
    return _ddp_run(impl, 3, DDP_WIDTHS, DDP_CAP)


def _judge_ddp_basic(data: dict) -> None:
    _judge_ddp_values(data, 3, DDP_WIDTHS, DDP_CAP)


def _judge_ddp_buckets(data: dict) -> None:
    _judge_ddp_values(data, 3, DDP_WIDTHS, DDP_CAP)
    _judge_ddp_structure(data, 3, DDP_WIDTHS, DDP_CAP)


def _ddp_uneven(impl: Impl) -> dict:
    return _ddp_run(impl, 4, DDP_WIDTHS, DDP_CAP, n_samples=14)


def _judge_ddp_uneven(data: dict) -> None:
    _judge_ddp_values(data, 4, DDP_WIDTHS, DDP_CAP, n_samples=14)


DDP_TIMELINE_CAP = 300_000  # about one 256 x 256 layer per bucket


def _ddp_timeline(impl: Impl) -> dict:
    return _ddp_run(impl, 2, OVERLAP_WIDTHS, DDP_TIMELINE_CAP, n_samples=OVERLAP_SAMPLES,
                    steps=1, cluster=_overlap_cluster(2), with_trace=True)


def _judge_ddp_timeline(data: dict) -> Evidence:
    shown = evidence({"yours": data["trace"]})
    trace = shown.traces["yours"]
    with showing(shown):
        for device in range(2):
            forward = min(e.start for e in trace.on(device, "compute") if e.kind == "forward")
            backward_end = max(e.end for e in trace.on(device, "compute")
                               if e.kind == "backward")
            comm = [e.start for e in trace.on(device, "comm") if e.start >= forward]
            expect(bool(comm), f"device {device} did not communicate during the step")
            expect(min(comm) < backward_end,
                   f"device {device}: the step's first message starts at "
                   f"{min(comm) * 1e6:.1f} us, after backward ends at "
                   f"{backward_end * 1e6:.1f} us: no all-reduce was launched during backward")
            expect(_intervals_overlap(trace, device, after=forward) > 0,
                   f"device {device}: communication and backward never run at the same time: "
                   "each all-reduce holds backward up until it is done")
    return shown


DDP_EXAMPLES = examples(6, seed=7, world_size=(2, 5), hidden=(3, 9), cap=(13, 140))


def _ddp_example(world_size: int, hidden: int, cap: int) -> tuple[tuple[int, ...], bool, int]:
    widths = (5, hidden, hidden + 2, 2)
    return widths, hidden % 2 == 0, 6 * world_size - 1  # even widths: with a LayerNorm


def _ddp_hidden(impl: Impl) -> list[dict]:
    def body(world_size: int, hidden: int, cap: int) -> dict:
        widths, norm, n_samples = _ddp_example(world_size, hidden, cap)
        return _ddp_run(impl, world_size, widths, cap, norm=norm, n_samples=n_samples,
                        steps=2)
    return compute_examples(body, DDP_EXAMPLES)


def _judge_ddp_hidden(records: list[dict]) -> None:
    def one(out: dict, world_size: int, hidden: int, cap: int) -> None:
        widths, norm, n_samples = _ddp_example(world_size, hidden, cap)
        _judge_ddp_values(out, world_size, widths, cap, norm, n_samples, steps=2)
        _judge_ddp_structure(out, world_size, widths, cap, norm, steps=2)
    judge_examples(records, one)


CASES: dict[str, list[Case]] = {
    "3.1": [
        Case("every replica holds the mean gradient", 1,
             lambda impl: _averaged(impl, 3, WIDTHS, 12),
             lambda data: _judge_mean(data, 3, WIDTHS, 12)),
        Case("same gradients as one device on the whole batch", 1,
             lambda impl: _averaged(impl, 4, WIDTHS, 12), _judge_single_device),
        Case("traffic: no rank sends more than a ring all-reduce", 1,
             lambda impl: _averaged(impl, 4, WIDTHS, 12), _judge_traffic),
        Case("hidden: other world sizes and widths", 1, _averaging_hidden,
             _judge_averaging_hidden, hidden=True),
    ],
    "3.2": [
        Case("the docstring's example", 1, *_bucket_case([([4, 4, 4, 8], 8)])),
        Case("reverse order, full buckets", 1,
             *_bucket_case([([1, 2, 3, 4, 5, 6], 7), ([5, 5, 5, 5], 10), ([], 4)])),
        Case("a parameter larger than a bucket gets its own", 1,
             *_bucket_case([([2, 40, 2, 2], 8), ([9], 8)])),
        Case("hidden: random sizes", 2, _buckets_hidden, _judge_buckets_hidden, hidden=True),
    ],
    "3.3": [
        Case("gradients are averaged", 1,
             lambda impl: _averaged(impl, 3, OVERLAP_WIDTHS[:3], 12, overlap=True,
                                    cluster=_overlap_cluster(3)),
             lambda data: _judge_mean(data, 3, OVERLAP_WIDTHS[:3], 12)),
        Case("timeline: communication overlaps backward", 3, _overlap_traces,
             _judge_overlap_timeline, timeout_s=40.0),
        Case("hooks are removed afterwards", 1, _hooks_after, _judge_hooks_removed),
    ],
    "3.4": [
        Case("fp32: 16 bytes per parameter", 1, _memory_outputs([("mlp", "fp32")]),
             _judge_fp32),
        Case("mixed precision: 2 + 2 + 12 bytes", 1, _memory_outputs([("mlp", "mixed")]),
             _memory_judge([("mlp", "mixed")], MEMORY_MODELS)),
        Case("frozen parameters: weights only", 1,
             _memory_outputs([("frozen", "fp32"), ("frozen", "mixed")]),
             _memory_judge([("frozen", "fp32"), ("frozen", "mixed")], MEMORY_MODELS)),
        Case("meta device and bad precision", 1, _meta_and_bad, _judge_meta_and_bad),
    ],
    "3.5": [
        Case("3 ranks from different starts: rank 0's start, then one device's training", 4,
             _ddp_basic, _judge_ddp_basic),
        Case("buckets: reverse order, one all-reduce each; one broadcast, at construction", 4,
             _ddp_basic, _judge_ddp_buckets),
        Case("4 ranks, uneven shards of the batch", 2, _ddp_uneven, _judge_ddp_uneven),
        Case("timeline: all-reduces launched during backward, overlapping it", 4,
             _ddp_timeline, _judge_ddp_timeline, timeout_s=40.0),
        Case("hidden: 2-5 ranks, other layers, bucket caps that split unevenly", 6,
             _ddp_hidden, _judge_ddp_hidden, hidden=True, timeout_s=60.0),
    ],
}
