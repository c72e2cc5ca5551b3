"""What every lesson's checks share: running SPMD code, refusing built-in collectives,
swapping a function for a stand-in wherever it is named, hidden cases on reproducible
examples, plain facts of a run, and comparing tensors."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._dynamo  # noqa: F401 - the simulator's FLOP counter imports it on first use,
# which can take seconds: import it here, not inside a launch whose timeout is running
from torch.utils._pytree import tree_leaves

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import (DeadlockError, LaunchResult, LaunchTimeoutError,
                            MessageMismatchError, RankError, UnmatchedMessageError, launch)
from mpgpu_edu.grading.checks import CheckFailure, Evidence
from mpgpu_edu.grading.checks._clock import cluster_builder
from mpgpu_edu.grading.checks._clock import record as run_record

LAUNCH_TIMEOUT_S = 15.0
ALPHA, BETA = 1e-5, 1e9

# The key of every seed of the ranks' inputs (``secret_seed``), in class grading: 32 random
# bytes drawn once by the grader process (``grading_secret``), which never leave it, so that
# a submission cannot make again the inputs of ranks it does not hold. A class-grading child
# gets each seed it needs from the grader (``SEED_SOURCE``, ``compute._SeedSource``); a
# learner's own check has neither, and its seeds are as written.
SECRET = bytearray()
SEED_SOURCE: Callable[[int], int] | None = None
# In a class-grading child whose exercise runs its ranks apart (``compute.InRanks``): the
# learner's function, and ``run_spmd`` runs every rank in a process of its own.
APART: Any = None


def grading_secret() -> None:
    """Draw the grader process's secret key, once (class grading)."""
    global SECRET
    if not SECRET:
        SECRET = bytearray(os.urandom(32))


def secret_seed(seed: int) -> int:
    """``seed`` itself without a key; else a seed made from it with the key (BLAKE2b), from
    which the key cannot be had back: asked of the grader in a class-grading child."""
    if SEED_SOURCE is not None:
        return SEED_SOURCE(seed)
    if not SECRET:
        return seed
    digest = hashlib.blake2b(str(seed).encode(), key=SECRET, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class LearnerError(Exception):
    """The learner's code raised: ``original`` is its exception (traceback included)."""

    def __init__(self, message: str, original: BaseException) -> None:
        super().__init__(message)
        self.original = original


@cluster_builder
def uniform(n: int) -> Cluster:
    """The textbook cluster: every device its own port, alpha 10 us, beta 1 GB/s."""
    return Cluster.uniform(n, alpha_s=ALPHA, beta_Bps=BETA)


def run_spmd(fn: Callable[..., Any], cluster: Cluster | int, *args: Any,
             timeout: float = LAUNCH_TIMEOUT_S, hide: tuple | list = (),
             collect: tuple | list = ()) -> LaunchResult:
    """``launch`` on the simulator, with a rank's failure turned into what the grader
    reports: NotImplementedError and assertion failures as themselves, a deadlock or
    mismatched messages as a failure, other exceptions as the learner's error.

    Where the exercise's ranks run apart (``APART``), every rank is a process of its own
    (``comm.apart``) that imports the learner's file itself, and each sequence of ``hide``
    (one entry per rank: the ranks' inputs) keeps only the rank's own entry there. Each list
    of ``collect`` has a slot per rank that rank r's program fills (slot r: what a case
    learns inside the program, besides its return value); apart, each rank's slot comes back
    with its result, as plain data."""
    if isinstance(cluster, int):
        cluster = uniform(cluster)
    try:
        if APART is not None:
            return _run_apart(fn, cluster, args, timeout, hide, collect)
        return launch(fn, cluster, *args, timeout=timeout)
    except RankError as exc:
        original = exc.original
        if isinstance(original, NotImplementedError):
            raise original from None
        if isinstance(original, AssertionError):
            raise CheckFailure(f"rank {exc.rank}: {original}") from None
        if original is None:
            raise CheckFailure(str(exc).split("\n")[0]) from None
        raise LearnerError(f"rank {exc.rank} raised {type(original).__name__}: {original}",
                           original) from None
    except (DeadlockError, MessageMismatchError, UnmatchedMessageError) as exc:
        raise CheckFailure(f"{type(exc).__name__}: {exc}") from None
    except LaunchTimeoutError:
        raise


def _run_apart(fn: Callable[..., Any], cluster: Cluster, args: tuple, timeout: float,
               hide: tuple | list, collect: tuple | list) -> LaunchResult:
    """``run_spmd`` with the ranks apart: each rank's result comes back with the calls it
    counted (``counting_calls``), which join the counts of the case, and its slot of every
    list of ``collect``."""
    from mpgpu_edu.comm.apart import run_apart

    apart = APART

    def program(comm: Any, *args: Any) -> list[Any]:
        out = fn(comm, *args)
        rank = comm.rank
        return [out, apart.calls_here(), [slots[rank] for slots in collect]]

    result = run_apart(program, cluster, args, {}, timeout, hide=hide, prepare=apart.prepare,
                       jobs_in_order=apart.jobs_in_order)
    for rank, row in enumerate(result.results):
        apart.add_calls(rank, row[1])
        for slots, value in zip(collect, row[2]):
            slots[rank] = value
    result.results = [row[0] for row in result.results]
    result.blind = _blind(program, cluster, args, timeout, hide, result.results)
    return result


def _blind(program: Callable[..., Any], cluster: Cluster, args: tuple, timeout: float,
           hide: tuple | list, results: list[Any]) -> bool:
    """Whether the ranks' results stay the same, bit for bit, when the grader changes the
    first element of every message that carries data (``comm.apart``'s ``tamper``): a
    program that computes from what its messages carry gives other results; one that learnt
    the other ranks' inputs some other way, and sends messages for show, does not. False
    where no message carried data, where the results hold no tensor, or where the changed
    run failed (a program may well fail on data it did not expect)."""
    from mpgpu_edu.comm.apart import run_apart

    if not any(isinstance(t, torch.Tensor) and t.numel() and not t.is_meta
               for t in tree_leaves(results)):
        return False
    try:
        changed = run_apart(program, cluster, args, {}, timeout, hide=hide,
                            prepare=APART.prepare, tamper=True,
                            jobs_in_order=APART.jobs_in_order)
    except Exception:  # noqa: BLE001 - a failure shows the data mattered
        return False
    return bool(changed.tampered) and _same([row[0] for row in changed.results], results)


def _same(a: Any, b: Any, depth: int = 0) -> bool:
    """Plain data equal bit for bit (tensors of the same dtype, shape and values)."""
    if depth > 16:
        return False
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and a.is_meta == b.is_meta
                and (a.is_meta or torch.equal(a, b)))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    return type(a) is type(b) and a == b


# ---- from scratch means from send and recv -------------------------------------------------

_DIST_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                     "reduce_scatter_tensor", "broadcast", "reduce", "gather", "scatter",
                     "all_to_all", "all_to_all_single", "all_gather_object",
                     "broadcast_object_list")
_PACKAGE_MODULES = ("mpgpu_edu.collectives", "mpgpu_edu.collectives.allreduce",
                    "mpgpu_edu.collectives.allgather", "mpgpu_edu.collectives.basic",
                    "mpgpu_edu.collectives.hierarchical", "mpgpu_edu.collectives.ring_fast",
                    "mpgpu_edu.collectives.multichannel", "mpgpu_edu.collectives.nccl_ring")
_ALLOWED = ("check_op", "finish_op", "flat_view")  # argument checks and views, not collectives


def forbidden_collectives() -> list[tuple[Any, str]]:
    """(object, display name) of every collective an exercise must not call: torch's, and
    every function and class of the package's collectives (its closed forms aside)."""
    import importlib

    import torch.distributed as dist

    targets = [(getattr(dist, name), f"torch.distributed.{name}") for name in _DIST_COLLECTIVES
               if callable(getattr(dist, name, None))]
    for module_name in _PACKAGE_MODULES:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if ((inspect.isfunction(value) or inspect.isclass(value))
                    and getattr(value, "__module__", "").startswith("mpgpu_edu.collectives")
                    and value.__module__ != "mpgpu_edu.collectives.cost"
                    and name not in _ALLOWED):
                targets.append((value, f"{value.__module__}.{value.__qualname__}"))
    return targets


@contextlib.contextmanager
def from_scratch(impl: Callable[..., Any], exercise_id: str) -> Iterator[None]:
    """While inside, every built-in collective (``torch.distributed``'s and
    ``mpgpu_edu.collectives``', the engineered rings included) raises, however the learner's
    code reached it (its code is swapped: ``_blocking.code_blocked``)."""
    from mpgpu_edu.grading.checks._blocking import code_blocked

    targets = [(value, f"exercise {exercise_id} is built from comm.send/recv/isend/irecv "
                       f"only, but it called {display}")
               for value, display in forbidden_collectives()]
    with code_blocked(targets, CheckFailure):
        yield


@contextlib.contextmanager
def rebound(owners: list[Any], swaps: list[tuple[Any, Any]]) -> Iterator[None]:
    """While inside, every name of ``owners`` (modules, or namespaces such as the learner's
    function's ``__globals__``) bound to the first of a pair in ``swaps`` is bound to the
    second; on leaving, each name gets its original back (the last rebound first)."""
    patched: list[tuple[dict, str, Any]] = []
    for owner in owners:
        namespace = owner if isinstance(owner, dict) else vars(owner)
        for name, value in list(namespace.items()):
            for original, replacement in swaps:
                if value is original:
                    patched.append((namespace, name, value))
                    namespace[name] = replacement
    try:
        yield
    finally:
        for namespace, name, value in reversed(patched):
            namespace[name] = value


# ---- messages naming an example ----------------------------------------------------------------

def _example(example: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in example.items()) or "an example"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text if text else type(exc).__name__


@contextlib.contextmanager
def showing(evidence: Evidence) -> Iterator[Evidence]:
    """Attach ``evidence`` to a failure raised inside, so the report can draw it."""
    try:
        yield evidence
    except CheckFailure as exc:
        exc.evidence = evidence  # type: ignore[attr-defined]
        raise


# ---- comparisons -------------------------------------------------------------------------------

def refusal(call: Callable[[], Any]) -> str:
    """What ``call()`` did with input it should refuse: "ValueError", another exception's type
    name (ZeroDivisionError: it divided before checking), or "returned". A stub's
    NotImplementedError passes through: not implemented, not a wrong answer."""
    try:
        call()
    except ValueError:
        return "ValueError"
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported as what it is, with its input
        return type(exc).__name__
    return "returned"


def expect(condition: bool, message: str) -> None:
    """Fail the case with ``message`` unless ``condition``."""
    if not condition:
        raise CheckFailure(message)


def left_unchanged(got: Any, before: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether an in-place collective left the caller's tensor ``got`` holding its input
    ``before`` (compared flat), where the answer ``want`` differs from it."""
    return (isinstance(got, torch.Tensor) and got.numel() == before.numel()
            and torch.equal(got.reshape(-1), before.reshape(-1))
            and not torch.equal(want.reshape(-1), before.reshape(-1)))


def expect_close(got: Any, want: torch.Tensor, what: str, rtol: float = 1e-5,
                 atol: float = 1e-6) -> None:
    """``got`` is a tensor with ``want``'s shape and values (within tolerance)."""
    if not isinstance(got, torch.Tensor):
        from mpgpu_edu.grading.checks._plain import type_name
        raise CheckFailure(f"{what}: expected a torch.Tensor, got {type_name(got)}")
    if got.shape != want.shape:
        raise CheckFailure(f"{what}: expected shape {list(want.shape)}, got {list(got.shape)}")
    if not torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol):
        worst = (got.double() - want.double()).abs().argmax().item()
        flat_got, flat_want = got.reshape(-1), want.reshape(-1)
        shown, expected = _digits(flat_got[worst].item(), flat_want[worst].item())
        raise CheckFailure(f"{what}: wrong values, e.g. element {worst} is {shown}, expected "
                           f"{expected}" + _scaled(got.double(), want.double(), rtol, atol))


def _digits(got: float, want: float) -> tuple[str, str]:
    """Both numbers with 6 significant digits, or with as many as it takes to tell them
    apart (a value rounded through float32 differs in the 8th)."""
    for digits in (6, 9, 12, 17):
        shown, expected = f"{got:.{digits}g}", f"{want:.{digits}g}"
        if shown != expected:
            break
    return shown, expected


def _scaled(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> str:
    """A note when every value is a simple multiple of the expected one (a gradient added
    twice, a mean divided twice, a sign flipped), else ''."""
    if not bool(want.ne(0).any()) or want.unique().numel() < 2:
        return ""  # one value (one element): every wrong answer is a multiple of it
    for factor, note in ((2.0, "exactly twice the expected values: added twice, or divided "
                               "by half as many?"),
                         (0.5, "exactly half the expected values: divided twice, or by "
                               "twice as many?"),
                         (-1.0, "the expected values with the sign flipped")):
        if torch.allclose(got, factor * want, rtol=rtol, atol=atol):
            return f" ({note})"
    index = int(want.ne(0).reshape(-1).nonzero()[0])
    ratio = float(got.reshape(-1)[index] / want.reshape(-1)[index])
    for k in range(3, 65):  # a sum where the mean was asked, or the wrong count divided by
        for factor, words in ((float(k), f"exactly {k} times the expected values: a sum "
                                          "where the mean was asked, or divided by too few?"),
                              (1 / k, f"exactly 1/{k} of the expected values: a mean "
                                      "where the sum was asked, divided by too many, or "
                                      "twice?")):
            if abs(ratio - factor) <= 1e-6 * factor and torch.allclose(
                    got, factor * want, rtol=rtol, atol=atol):
                return f" ({words})"
    return ""


def expect_waited(works: dict, where: str) -> None:
    """Every isend and irecv work of one rank waited on (one rank's entry of the grader's
    ``works``); ``where`` names the rank in the message."""
    for kind in ("isend", "irecv"):
        started, left = works[kind], works[f"{kind}_unwaited"]
        expect(left == 0,
               f"{where} started {started} {kind}{'' if started == 1 else 's'} and returned "
               f"without waiting on {left} of them; until its work is waited on, an {kind}'s "
               "tensor may still be in flight (on gloo or NCCL it can be read or overwritten "
               "too early)")


@contextlib.contextmanager
def counting_calls(impl: Callable[..., Any], names: tuple[str, ...] | list[str]
                   ) -> Iterator[dict[str, list[int]]]:
    """While inside, the functions ``names`` of ``impl``'s module (the learner's own file)
    record the rank that calls them, from the simulator's rank thread (``rank-N``; -1
    elsewhere): ``{name: [rank of each call]}``. A name the module does not have is never
    called (an empty list)."""
    calls: dict[str, list[int]] = {name: [] for name in names}
    if hasattr(impl, "counting"):  # the ranks run apart: each counts in its own process
        with impl.counting(names, calls):
            yield calls
        return
    where = getattr(impl, "__globals__", {})
    saved = {name: where[name] for name in names if callable(where.get(name))}

    def rank_now() -> int:
        parts = threading.current_thread().name.split("-")
        return int(parts[1]) if parts[0] == "rank" and parts[1:2] and parts[1].isdigit() else -1

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name].append(rank_now())
            return fn(*args, **kwargs)
        return call

    for name, fn in saved.items():
        where[name] = counted(name, fn)
    try:
        yield calls
    finally:
        where.update(saved)


def step_rows(got: Any) -> Any:
    """A learner's step orders as plain data: per device, rows of ``[stage, microbatch, op,
    chunk]`` (a ``pipeline.Step``) or the repr of anything else; the type name of what is not
    a list of lists. A returned ``Schedule`` is read device by device."""
    from mpgpu_edu.pipeline import Schedule, Step, steps_of

    if isinstance(got, Schedule):
        got = [steps_of(got, d) for d in range(got.n_stages)]
    if not isinstance(got, (list, tuple)):
        return type(got).__name__
    rows = []
    for row in got:
        if not isinstance(row, (list, tuple)):
            return type(row).__name__
        rows.append([[int(s.stage), int(s.microbatch), str(s.op), int(s.chunk)]
                     if isinstance(s, Step) else repr(s) for s in row])
    return rows


def rank_inputs(world_size: int, numel: int, seed: int = 0) -> list[torch.Tensor]:
    """One small-integer float tensor per rank (sums are exact in float32); ``SECRET``
    mixed into the seed."""
    generator = torch.Generator().manual_seed(secret_seed(seed))
    return [torch.randint(-8, 9, (numel,), generator=generator).float()
            for _ in range(world_size)]


def bytes_of(numel: int, dtype: torch.dtype = torch.float32) -> int:
    return numel * torch.empty(0, dtype=dtype).element_size()


# ---- compute + judge: plain facts and examples -----------------------------------------------

def launch_facts(result: LaunchResult, with_trace: bool = False) -> dict[str, Any]:
    """*compute*: what a judge may know of a simulator run, as the run's raw record
    (``_clock.record``); the grader replays it and the judge reads each rank's return value
    (``results``), its messages and bytes (``stats``: one dict per rank, peers as int keys),
    the makespan and, with ``with_trace``, the timeline (``Trace.to_dict()``): all timed by
    the grader, not by the submission's process."""
    return run_record(result, with_trace)


def evidence(traces: dict[str, dict], text: str = "") -> Evidence:
    """``Evidence`` from traces given as ``Trace.to_dict()`` data (what a judge receives)."""
    from mpgpu_edu.cluster.trace import Trace

    return Evidence(traces={name: Trace.from_dict(t) for name, t in traces.items()}, text=text)


def examples(count: int, seed: int = 0, **ranges: tuple[int, int]) -> list[dict[str, int]]:
    """``count`` reproducible examples for a hidden case, smallest first: the first is every
    range's low end, the rest drawn at random (seeded) and sorted by size, so the first
    failing example a judge reports is a small one."""
    import random

    rng = random.Random(seed)
    drawn = [{name: low for name, (low, _high) in ranges.items()}]
    while len(drawn) < count:
        drawn.append({name: rng.randint(low, high) for name, (low, high) in ranges.items()})
    unique = list({tuple(sorted(d.items())): d for d in drawn}.values())
    return sorted(unique, key=lambda d: (sum(d.values()), tuple(d.values())))


def compute_examples(body: Callable[..., Any], cases: list[dict[str, Any]]) -> list[dict]:
    """*compute* for a hidden case: ``[{"example": ..., "out": body(**example)}, ...]``.
    A stub's NotImplementedError passes through; the learner's first other error is
    reported with its example."""
    from mpgpu_edu.grading.checks._plain import plain

    records = []
    for example in cases:
        try:
            out = body(**example)
        except (NotImplementedError, LaunchTimeoutError, CheckFailure):
            raise
        except LearnerError as exc:
            raise LearnerError(f"for {_example(example)}: {exc}", exc.original) from None
        except Exception as exc:  # noqa: BLE001 - the learner's code raised
            raise LearnerError(f"for {_example(example)}: {type(exc).__name__}: {exc}",
                               exc) from None
        records.append({"example": dict(example), "out": plain(out)})
    return records


def judge_examples(records: list[dict], judge_one: Callable[..., None]) -> None:
    """*judge* for a hidden case: ``judge_one(out, **example)`` for every record; the first
    failure is reported with its example."""
    for record in records:
        try:
            judge_one(record["out"], **record["example"])
        except AssertionError as exc:
            raise CheckFailure(f"fails for {_example(record['example'])}: "
                               f"{_first_line(exc)}") from None


def each(configs: list[dict[str, Any]], compute_one: Callable[..., Any],
         judge_one: Callable[..., None]) -> tuple[Callable[[Any], list[dict]],
                                                  Callable[[list[dict]], None]]:
    """*compute* and *judge* over listed examples (``Case(name, points, *each(...))``):
    ``compute_one(impl, **example)`` for each, then ``judge_one(out, **example)``; the first
    failure is reported with its example."""
    return (lambda impl: compute_examples(lambda **e: compute_one(impl, **e), configs),
            lambda records: judge_examples(records, judge_one))


# ---- compute the grader counts itself -------------------------------------------------------

def model_flops(model: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """*judge*: the FLOPs of one forward and of its backward of ``model`` on ``x`` with the
    MSE loss against ``y``, counted in the grader's process on meta copies (``comm.flops``:
    matmuls and the like; elementwise work counts no FLOPs). What a rank's compute regions
    must add up to when it trains a check's model on that data: the regions are counted
    inside the rank's process, so the judge holds their sum to this (``judge_flops``)."""
    import copy

    from torch import nn

    from mpgpu_edu.comm.flops import FlopCount

    meta = copy.deepcopy(model).to("meta")
    with FlopCount() as forward:
        loss = nn.functional.mse_loss(meta(x.to("meta")), y.to("meta"))
    with FlopCount() as backward:
        loss.backward()
    return forward.total, backward.total


def forward_flops(module: Any, x: torch.Tensor) -> float:
    """*judge*: the FLOPs of ``module``'s forward on ``x``, counted in the grader's process on
    meta copies (as ``model_flops``)."""
    import copy

    from mpgpu_edu.comm.flops import FlopCount

    meta = copy.deepcopy(module).to("meta")
    with FlopCount() as counter, torch.no_grad():
        meta(x.to("meta"))
    return counter.total


def judge_jobs_after_compute(jobs: list[list[list[float]]],
                             reference: list[list[list[float]]], where: str) -> None:
    """No comm-stream job sends data before the compute that data needs was reported.

    ``jobs`` and ``reference`` are the grader's ``jobs`` facts (per rank, each job's FLOPs
    reported by the program before its submission, and the bytes the job sent) of the
    learner's run and of the grader's own run of the same step, whose jobs start as early as
    their data exists (a gradient's all-reduce as soon as backward made it). Where a rank
    reports its compute (its counter) is its own doing: one that held back its backward's
    FLOPs and reported them after submitting the all-reduces would show them overlapping.
    The data a job sends cannot exist before the compute that makes it, so the learner's
    job that sends bytes B + 1 onward (B: what its earlier jobs sent) must come after at
    least the FLOPs the reference had reported before its own job that sends byte B + 1 (the
    reference sends the gradients in the order they appear, so no set of them that many
    bytes large needs less). Bytes the learner's jobs send beyond the reference's (a
    broadcast run as a job) are taken to come first."""
    for rank, (mine, theirs) in enumerate(zip(jobs, reference)):
        ends, total = [], 0  # the reference's cumulative bytes at each data job's end
        for flops, nbytes in theirs:
            if nbytes > 0:
                total += nbytes
                ends.append((total, flops))
        before = -max(0, sum(b for _f, b in mine if b > 0) - total)
        number = 0
        for flops, nbytes in mine:
            if nbytes <= 0:
                continue
            number += 1
            if before + nbytes > 0:
                need = next((f for end, f in ends if end > max(before, 0)), 0.0)
                expect(flops >= need * (1 - 1e-6) - 1.0,
                       f"{where}: rank {rank}'s comm-stream job number {number} that sends "
                       f"data was started when its program had reported {flops:.4g} FLOPs "
                       f"of compute, but what it sends does not exist before {need:.4g} "
                       "FLOPs (forward and the backward that makes those gradients, as the "
                       "grader's own run reports them before starting its all-reduce of "
                       "them): the rank's compute was reported after the messages that "
                       "needed it. Start each all-reduce from a hook, once its gradient is "
                       "ready, and leave the package's counting as it is")
            before += nbytes


def judge_flops(trace: dict, want: list[tuple[float, float]], where: str,
                cluster: Any) -> None:
    """Every device's compute regions on the grader's timeline add up to between
    ``want[device]`` = (least, most) FLOPs (from ``model_flops``, counted by the grader), and
    none is shorter than its FLOPs take in fp32 on ``cluster`` (the check's model is fp32):
    a rank's process counts and times its own regions, and a timeline that shows less or
    more compute than the model's, or the model's compute at another precision's speed, is
    not the model's."""
    for event in trace["events"]:
        if event["stream"] == "comm" or not event.get("flops"):
            continue
        least_s = cluster.flop_seconds(event["flops"], "fp32")
        expect(event["end"] - event["start"] >= least_s * (1 - 1e-6),
               f"{where}: a compute region of device {event['device']} lasts "
               f"{(event['end'] - event['start']) * 1e6:.2f} us for {event['flops']:.4g} "
               f"FLOPs, which take at least {least_s * 1e6:.2f} us in fp32 on this cluster: "
               "the model is fp32, and so is its compute")
    for device, (least, most) in enumerate(want):
        got = sum(e.get("flops", 0.0) for e in trace["events"] if e["device"] == device
                  and e["stream"] != "comm")
        slack = 1e-6 * max(most, 1.0)
        between = (f"{least:.4g}" if least == most else f"between {least:.4g} and {most:.4g}")
        expect(least - slack <= got <= most + slack,
               f"{where}: device {device}'s compute regions add up to {got:.4g} FLOPs, but the "
               f"model's forward and backward on its data is {between} FLOPs (counted by the "
               "grader): the timeline is not the model's own compute")
