"""The grader's clock: what a judge knows of a simulated run, the grader times itself.

A check's *compute* half runs the learner's code on the simulator inside the submission's
process. What it hands back of the run (``record``) is the run's raw record, not its
conclusions: each rank's return value, each actor's op list (its messages as posted, its
waits, its compute regions; see ``comm.ops``) and the *recipe* of the cluster it ran on (the
name of a check's own cluster builder and its arguments). The grader then, in its own
process (``resolve``), checks the ops' types and sizes, rebuilds the cluster from the recipe
with its own copy of the builder, and replays the ops on it with its own copy of the replay
(``comm.replay``): the bytes and messages per rank (``stats``), each rank's sends with their
tags (``sends``), its unwaited works (``works``), the makespan and the timeline (``trace``)
that the judge reads are the grader's. A submission that patches the simulator's
clock, its ``Trace`` or its ``CommStats`` in its own process changes nothing the judge sees;
one that hands back made-up numbers under those names is refused (they are the grader's
names: ``RESERVED``).

What this does not close: the op lists are still written inside the submission's process
(where all its ranks run as threads), so code that edits them there, consistently on both
ends of every message, could still misreport its traffic; and a compute region's seconds
are fixed where the region ran. A record that does not add up (a message with no receiver,
sizes that differ, a wait with no message) fails the case.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from typing import Any

MARK = "__launch__"
RESERVED = ("stats", "makespan", "trace", "works", "sends", "carried_data", "jobs",
            "program_bytes", "order")
MAX_OPS = 2_000_000  # per run: a record larger than this is not replayed


class RecordError(AssertionError):
    """A run's record that the grader cannot time (a ``CheckFailure`` for the report)."""


def cluster_builder(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a check's function that builds a ``Cluster`` from plain arguments: the cluster it
    returns carries the recipe (``"module:name"``, args, kwargs) by which the grader rebuilds
    it, in its own process, to time the run."""
    @functools.wraps(fn)
    def build(*args: Any, **kwargs: Any) -> Any:
        cluster = fn(*args, **kwargs)
        cluster.recipe = [f"{fn.__module__}:{fn.__qualname__}", list(args), dict(kwargs)]
        return cluster

    build.cluster_builder = True  # type: ignore[attr-defined]
    return build


# ---- the submission's side ------------------------------------------------------------------

def record(result: Any, with_trace: bool = False) -> dict[str, Any]:
    """*compute*: a simulator run (``LaunchResult``) as the raw record the grader times:
    ``{"results": ..., MARK: {recipe, world size, ops}}``; ``with_trace``: the judge also
    gets the grader's timeline."""
    from mpgpu_edu.grading.checks._plain import plain

    recipe = getattr(result.cluster, "recipe", None)
    if recipe is None:
        raise TypeError("a check's cluster must come from a @cluster_builder function, so "
                        "that the grader can rebuild it")
    ops = [[rank, lane, [_encode(op) for op in op_list]]
           for (rank, lane), op_list in sorted(result.op_lists.items())]
    return {"results": plain(result.results),
            MARK: {"recipe": plain(recipe), "world_size": len(result.results),
                   "blind": bool(getattr(result, "blind", False)),
                   "carried_data": getattr(result, "carried_data", None),
                   "with_trace": bool(with_trace), "ops": ops}}


def _encode(op: Any) -> list[Any]:
    from mpgpu_edu.comm import ops

    if isinstance(op, ops.Compute):
        return ["compute", float(op.seconds), str(op.kind), str(op.label), float(op.flops)]
    if isinstance(op, ops.Post):
        return ["post", op.op, op.src, op.dst, op.tag, op.lane, op.seq, op.nbytes,
                bool(op.blocking), op.handle]
    if isinstance(op, ops.Memory):
        return ["memory", str(op.category), int(op.delta), str(op.label)]
    if isinstance(op, ops.Log):
        return ["log", str(op.text)]
    return [_NAMES[type(op).__name__], int(op.handle if hasattr(op, "handle") else op.job)]


_NAMES = {"Wait": "wait", "Submit": "submit", "JobStart": "job_start", "JobEnd": "job_end",
          "WaitJob": "wait_job"}


# ---- the grader's side ----------------------------------------------------------------------

def resolve(data: Any) -> Any:
    """*judge*'s input: ``data`` with every run record replaced by the grader's own facts
    (``results``, ``stats``, ``works``, ``sends``, ``makespan`` and, where asked, ``trace``),
    merged into
    the dict that held it. Raises ``RecordError`` for a record that does not add up, and for data
    that names a ``RESERVED`` fact itself."""
    if isinstance(data, list):
        return [resolve(item) for item in data]
    if not isinstance(data, dict):
        return data
    named = [key for key in RESERVED if key in data]
    if named:
        raise RecordError(f"the check's data names {named[0]!r} itself: only the grader's "
                          "replay of the run may give it")
    out = {key: resolve(value) for key, value in data.items() if key != MARK}
    if MARK in data:
        out.update(replayed(data[MARK]))
    return out


def replayed(payload: Any) -> dict[str, Any]:
    """The grader's facts of one run record (see ``resolve``)."""
    from mpgpu_edu.comm.replay import replay

    if not isinstance(payload, dict):
        raise RecordError("a run's record is not a record")
    n = payload.get("world_size")
    if type(n) is not int or not 1 <= n <= 4096:
        raise RecordError(f"a run's record has no valid world size ({n!r})")
    cluster = _rebuild(payload.get("recipe"), n)
    op_lists = _decode(payload.get("ops"), n)
    try:
        trace, _logs = replay(op_lists, cluster, n, {"cluster": getattr(cluster, "name", "")})
    except (RuntimeError, KeyError, AttributeError, TypeError, ValueError) as exc:
        raise RecordError(f"the run's record of its messages does not add up ({exc})") from None
    if payload.get("blind") is True:
        raise RecordError(
            "the ranks' results came out the same, bit for bit, when the grader changed a "
            "number in every message that carried data: they are not computed from what "
            "the messages carry. Every rank gets the other ranks' data through comm.send/recv "
            "(isend/irecv) and computes its result from what it received")
    carried = payload.get("carried_data")
    facts: dict[str, Any] = {"stats": stats_of(op_lists, n), "works": works_of(op_lists, n),
                             "sends": sends_of(op_lists, n), "jobs": jobs_of(op_lists, n),
                             "program_bytes": program_bytes_of(op_lists, n),
                             "order": order_of(op_lists, n),
                             "makespan": float(trace.makespan),
                             # where the ranks ran apart, the launcher saw whether any
                             # message carried data; None where it could not
                             "carried_data": carried if type(carried) is bool else None}
    if payload.get("with_trace"):
        facts["trace"] = trace.to_dict()
    return facts


def stats_of(op_lists: dict[tuple[int, int], list[Any]], n: int) -> list[dict[str, Any]]:
    """Bytes and messages each rank sent and received, counted from the posted ops (as
    ``CommStats.to_dict()``: peers as global ranks)."""
    from mpgpu_edu.comm import ops

    stats = [{"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0,
              "messages_received": 0, "sent_to": {}, "received_from": {}} for _ in range(n)]
    for (_rank, _lane), op_list in sorted(op_lists.items()):
        for op in op_list:
            if not isinstance(op, ops.Post):
                continue
            if op.op == "send":
                row, peer, kind, per = stats[op.src], op.dst, "sent", "sent_to"
            else:
                row, peer, kind, per = stats[op.dst], op.src, "received", "received_from"
            row[f"bytes_{kind}"] += op.nbytes
            row[f"messages_{kind}"] += 1
            row[per][peer] = row[per].get(peer, 0) + op.nbytes
    return stats


def sends_of(op_lists: dict[tuple[int, int], list[Any]], n: int) -> list[list[list[int]]]:
    """Each rank's messages sent, in the order it posted them: ``[peer, tag, bytes]``."""
    from mpgpu_edu.comm import ops

    sends: list[list[list[int]]] = [[] for _ in range(n)]
    for (_rank, _lane), op_list in sorted(op_lists.items()):
        for op in op_list:
            if isinstance(op, ops.Post) and op.op == "send":
                sends[op.src].append([op.dst, op.tag, op.nbytes])
    return sends


def jobs_of(op_lists: dict[tuple[int, int], list[Any]], n: int) -> list[list[list[float]]]:
    """Each rank's comm-stream jobs in the order its program submitted them: ``[FLOPs the
    program had reported before the submission, bytes the job sent]``."""
    from mpgpu_edu.comm import ops

    jobs: list[list[list[float]]] = [[] for _ in range(n)]
    for rank in range(n):
        sent: dict[int, int] = {}
        job = None
        for op in op_lists.get((rank, ops.STREAM), []):
            if isinstance(op, ops.JobStart):
                job = op.job
            elif isinstance(op, ops.JobEnd):
                job = None
            elif isinstance(op, ops.Post) and op.op == "send" and job is not None:
                sent[job] = sent.get(job, 0) + op.nbytes
        flops = 0.0
        for op in op_lists.get((rank, ops.HOST), []):
            if isinstance(op, ops.Compute):
                flops += op.flops
            elif isinstance(op, ops.Submit):
                jobs[rank].append([flops, sent.get(op.job, 0)])
    return jobs


def program_bytes_of(op_lists: dict[tuple[int, int], list[Any]], n: int) -> list[int]:
    """Bytes each rank sent from its program, not from a comm-stream job: the router saw each
    message come in on the rank's program lane or on its stream's, which serves only jobs the
    program submitted."""
    from mpgpu_edu.comm import ops

    sent = [0] * n
    for rank in range(n):
        for op in op_lists.get((rank, ops.HOST), []):
            if isinstance(op, ops.Post) and op.op == "send":
                sent[rank] += op.nbytes
    return sent


def order_of(op_lists: dict[tuple[int, int], list[Any]], n: int) -> list[list[list[Any]]]:
    """Each rank's program, as the router saw it, in the order it ran: ``["send", peer, tag]``
    where it posted a send, ``["recv", peer, tag]`` where a receive was complete for it (a
    blocking receive, or the wait on a posted one). A comm-stream job's messages count where
    the program stood: its sends at the job's submission (they cannot leave sooner), its
    receives once the program waited for the job (it cannot use them sooner). No compute:
    that order needs none of what the rank reports about itself."""
    from mpgpu_edu.comm import ops

    order: list[list[list[Any]]] = [[] for _ in range(n)]
    for rank in range(n):
        jobs = _job_messages(op_lists.get((rank, ops.STREAM), []))
        posted: dict[int, Any] = {}
        for op in op_lists.get((rank, ops.HOST), []):
            message = _message(op, posted)
            if message is not None:
                order[rank].append(message)
            elif isinstance(op, ops.Submit):
                order[rank] += jobs.get(op.job, ([], []))[0]
            elif isinstance(op, ops.WaitJob):
                order[rank] += jobs.pop(op.job, ([], []))[1]
    return order


def _message(op: Any, posted: dict[int, Any]) -> list[Any] | None:
    """``op`` as an entry of ``order_of``: a send posted, or a receive complete (blocking, or
    the wait on one posted earlier, which ``posted`` keeps by handle until then); None for
    anything else."""
    from mpgpu_edu.comm import ops

    if isinstance(op, ops.Post):
        if op.op == "send":
            return ["send", op.dst, op.tag]
        if op.blocking:
            return ["recv", op.src, op.tag]
        posted[op.handle] = op
    elif isinstance(op, ops.Wait) and op.handle in posted:
        got = posted.pop(op.handle)
        return ["recv", got.src, got.tag]
    return None


def _job_messages(stream: list[Any]) -> dict[int, tuple[list[list[Any]], list[list[Any]]]]:
    """Per comm-stream job: (its sends, its receives that completed inside it)."""
    from mpgpu_edu.comm import ops

    jobs: dict[int, tuple[list[list[Any]], list[list[Any]]]] = {}
    job, posted = None, {}
    for op in stream:
        if isinstance(op, ops.JobStart):
            job, posted = op.job, {}
            jobs[job] = ([], [])
        elif isinstance(op, ops.JobEnd):
            job = None
        elif job is not None:
            message = _message(op, posted)
            if message is not None:
                jobs[job][message[0] == "recv"].append(message)
    return jobs


def works_of(op_lists: dict[tuple[int, int], list[Any]], n: int) -> list[dict[str, int]]:
    """Each rank's ``isend``/``irecv`` works (messages posted without blocking) and how many of
    them it never waited on, counted from the posted ops and the waits."""
    from mpgpu_edu.comm import ops

    works = [{"isend": 0, "irecv": 0, "isend_unwaited": 0, "irecv_unwaited": 0}
             for _ in range(n)]
    waited = {op.handle for op_list in op_lists.values() for op in op_list
              if isinstance(op, ops.Wait)}
    for (rank, _lane), op_list in op_lists.items():
        for op in op_list:
            if isinstance(op, ops.Post) and not op.blocking:
                kind = "isend" if op.op == "send" else "irecv"
                works[rank][kind] += 1
                works[rank][f"{kind}_unwaited"] += op.handle not in waited
    return works


def _rebuild(recipe: Any, n: int) -> Any:
    if (not isinstance(recipe, list) or len(recipe) != 3 or type(recipe[0]) is not str
            or not isinstance(recipe[1], list) or not isinstance(recipe[2], dict)):
        raise RecordError("a run's record names no cluster the grader can rebuild")
    module_name, _, name = recipe[0].partition(":")
    if not module_name.startswith("mpgpu_edu.grading.checks"):
        raise RecordError(f"a run's cluster comes from {recipe[0]}, not from a check")
    try:
        builder = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        raise RecordError(f"no cluster builder {recipe[0]}") from None
    if not getattr(builder, "cluster_builder", False):
        raise RecordError(f"{recipe[0]} is not a check's cluster builder")
    for value in [*recipe[1], *recipe[2].values()]:
        if value is not None and type(value) not in (int, float, str, bool):
            raise RecordError("a cluster recipe's arguments are not plain numbers and names")
    cluster = builder(*recipe[1], **recipe[2])
    if len(cluster.visible) != n:
        raise RecordError(f"the run had {n} ranks on a cluster of {len(cluster.visible)}")
    return cluster


_FIELDS = {"compute": (float, str, str, float), "memory": (str, int, str), "log": (str,),
           "wait": (int,), "submit": (int,), "job_start": (int,), "job_end": (int,),
           "wait_job": (int,),
           "post": (str, int, int, int, int, int, int, bool, int)}


def _decode(rows: Any, n: int) -> dict[tuple[int, int], list[Any]]:
    """The op lists of a record, every field of its exact type and in range."""
    from mpgpu_edu.comm import ops

    if not isinstance(rows, list):
        raise RecordError("a run's record has no op lists")
    total = sum(len(row[2]) for row in rows if isinstance(row, list) and len(row) == 3
                and isinstance(row[2], list))
    if total > MAX_OPS:
        raise RecordError(f"a run's record holds {total} operations, more than the grader "
                          f"replays ({MAX_OPS})")
    out: dict[tuple[int, int], list[Any]] = {}
    handles: set[int] = set()
    for row in rows:
        if (not isinstance(row, list) or len(row) != 3 or type(row[0]) is not int
                or row[1] not in (ops.HOST, ops.STREAM) or not 0 <= row[0] < n
                or not isinstance(row[2], list) or (row[0], row[1]) in out):
            raise RecordError("a run's op list is not one rank's lane")
        out[(row[0], row[1])] = [_op(item, row[0], n, handles) for item in row[2]]
    if not any(lane == ops.HOST for _rank, lane in out):
        raise RecordError("a run's record has no rank's program")
    _matched(out)
    return out


def _matched(op_lists: dict[tuple[int, int], list[Any]]) -> None:
    """Every message was posted once by its sender and once by its receiver, same size."""
    from mpgpu_edu.comm import ops

    ends: dict[tuple, dict[str, Any]] = {}
    for op_list in op_lists.values():
        for op in op_list:
            if isinstance(op, ops.Post):
                side = ends.setdefault(op.channel, {})
                if op.op in side:
                    raise RecordError("the run's record of its messages does not add up: a "
                                      "message is posted twice")
                side[op.op] = op
    for (src, dst, tag, _lane, seq), side in ends.items():
        if len(side) != 2:
            missing = "receive" if "send" in side else "send"
            raise RecordError(f"the run's record of its messages does not add up: message "
                              f"{seq} from rank {src} to rank {dst} (tag {tag}) has no "
                              f"{missing}")
        if side["send"].nbytes != side["recv"].nbytes:
            raise RecordError(f"the run's record of its messages does not add up: message "
                              f"{seq} from rank {src} to rank {dst} (tag {tag}): sizes differ "
                              f"({side['send'].nbytes} and {side['recv'].nbytes} bytes)")


def _op(item: Any, rank: int, n: int, handles: set[int]) -> Any:
    from mpgpu_edu.comm import ops

    if not isinstance(item, list) or not item or item[0] not in _FIELDS:
        raise RecordError(f"a run's record holds an unknown operation ({str(item)[:60]})")
    kind, fields = item[0], item[1:]
    types = _FIELDS[kind]
    if len(fields) != len(types) or any(type(v) is not t and not (t is float and type(v) is int)
                                        for v, t in zip(fields, types)):
        raise RecordError(f"a run's {kind} operation has fields of the wrong types")
    if kind == "compute":
        seconds, op_kind, label, flops = fields
        if not (math.isfinite(seconds) and seconds >= 0 and math.isfinite(flops) and flops >= 0):
            raise RecordError("a run's compute region has a negative or endless time")
        return ops.Compute(float(seconds), op_kind, label, float(flops))
    if kind == "post":
        op, src, dst, tag, lane, seq, nbytes, blocking, handle = fields
        mine = src if op == "send" else dst
        if (op not in ("send", "recv") or mine != rank or not 0 <= src < n
                or not 0 <= dst < n or nbytes < 0 or seq < 0 or handle in handles):
            raise RecordError("a run's message record is not one this rank could post")
        handles.add(handle)
        return ops.Post(op, src, dst, tag, lane, seq, nbytes, blocking, handle)
    if kind == "memory":
        return ops.Memory(*fields)
    if kind == "log":
        return ops.Log(fields[0])
    cls = {"wait": ops.Wait, "submit": ops.Submit, "job_start": ops.JobStart,
           "job_end": ops.JobEnd, "wait_job": ops.WaitJob}[kind]
    return cls(fields[0])


# ---- what the contract's calls would send, timed by nobody ---------------------------------

def contract_sends(n: int, program: Callable[[Any], None]) -> list[list[tuple[int, int]]]:
    """*judge*: each rank's messages, as sorted ``(peer, bytes)``, when ``program(comm)`` runs
    on the grader's own simulator (``n`` ranks of a uniform cluster): the package's
    collectives called as an exercise's contract says, on meta tensors. A judge holds a
    run's ``sends`` to it (``same_sends``): which collectives a rank called, on tensors of
    which sizes, read from the messages the grader saw rather than counted inside the
    rank's process."""
    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.comm.launch import run_sim

    result = run_sim(program, Cluster.uniform(n, alpha_s=1e-5, beta_Bps=1e9), (), {})
    return sorted_sends(result.op_lists, n)


def sorted_sends(op_lists: dict[tuple[int, int], list[Any]], n: int
                 ) -> list[list[tuple[int, int]]]:
    """Each rank's messages sent, as sorted ``(peer, bytes)``: what ``same_sends`` compares
    a run's ``sends`` with."""
    return [sorted((peer, nbytes) for peer, _tag, nbytes in rank)
            for rank in sends_of(op_lists, n)]


def same_sends(sends: list[list[list[int]]], want: list[list[tuple[int, int]]]) -> int | None:
    """The first rank whose messages (``peer, bytes``, in any order) differ from ``want``'s,
    or None."""
    for rank, (got, expected) in enumerate(zip(sends, want)):
        if sorted((peer, nbytes) for peer, _tag, nbytes in got) != expected:
            return rank
    return None


def describe_sends(sends: list[list[int]] | list[tuple[int, int]], limit: int = 8) -> str:
    """``sizes in bytes per peer`` of a rank's messages, shortened."""
    per: dict[int, list[int]] = {}
    for item in sends:
        peer, nbytes = item[0], item[-1]
        per.setdefault(peer, []).append(nbytes)
    parts = []
    for peer, sizes in sorted(per.items()):
        shown = sorted(sizes)
        text = ", ".join(map(str, shown[:limit])) + (" ..." if len(shown) > limit else "")
        parts.append(f"to {peer}: {len(sizes)} of [{text}] bytes")
    return "; ".join(parts) or "nothing"
