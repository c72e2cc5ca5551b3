"""The simulator with every rank in a process of its own, for code that must not reach the
other ranks (a class's submissions, graded).

On the plain simulator (``comm.sim``) the ranks are threads of one process, so a rank's code
can read every other rank's tensors, and the router's records with them. ``run_apart`` forks
one process per rank and keeps everything that decides in the launching process: an ordinary
simulated launch (``launch.run_sim``) whose rank threads each *serve* one rank process over a
pipe (``_Server``). The router, the op lists, the memory ledgers, the deadlock detection and
the replay are the simulator's own, in the launcher's memory. A rank process only runs its
program, with a communicator (``ApartCommunicator``) that forwards every message, wait,
memory record, log line and timed region, and gets back the data its receives deliver. Its
comm stream is a thread of its own, served by the launch's stream thread of that rank.

What crosses a pipe is data: a JSON header, a message's elements as raw bytes read back in
the dtype and shape the header names (checked against their length), and a rank's return
value as ``torch.save`` of plain data (``comm.plain``) loaded with ``weights_only=True``. A
rank that raises sends its exception's type names, message and traceback; the launcher
raises it as the first builtin exception of those names (``NotImplementedError``,
``AssertionError``...) or as ``RemoteError``, with the rank's traceback attached.

A rank process keeps no file descriptor of its parent's but its own two pipes (the others
point at ``/dev/null``: ``runtime.isolate.only_fds``). Before it runs its program, every
tensor of ``hide`` (sequences with one entry per rank)
that belongs to another rank is cleared in the rank's process, then ``prepare(rank)`` runs
(grading isolates the process there and imports the learner's file). What a rank prints
comes back with its result. The launcher kills every rank process when the launch ends,
however it ends. For the same program, the op lists, and so the trace, are the threaded
simulator's (tested): only where the program runs differs.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import itertools
import json
import math
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, Pipe
from typing import Any

import torch

from mpgpu_edu.comm import errors as comm_errors
from mpgpu_edu.comm import ops
from mpgpu_edu.comm.base import CommStats, MemoryRecorder, Work, nbytes_of
from mpgpu_edu.comm.errors import Aborted
from mpgpu_edu.comm.message import check_peer, check_sources
from mpgpu_edu.comm.plain import plain
from mpgpu_edu.comm.router import Actor
from mpgpu_edu.comm.sim import CountedCommunicator, SimCommunicator
from mpgpu_edu.runtime.forked import end_all, fork_each
from mpgpu_edu.runtime.isolate import only_fds

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
MAX_HEADER_BYTES = 1 << 20
MAX_RESULT_BYTES = 256 * 2**20
OUTPUT_CHARS = 20_000  # what a rank may print, kept to show with the check's output
_EXCEPTIONS = {name: getattr(builtins, name) for name in dir(builtins)
               if isinstance(getattr(builtins, name), type)
               and issubclass(getattr(builtins, name), Exception)}
_COMM_EXCEPTIONS = {name: getattr(comm_errors, name) for name in (
    "MessageMismatchError", "DeadlockError", "UnmatchedMessageError")}


class RemoteError(Exception):
    """A rank process raised an exception that is not a builtin one: ``type_name`` is its
    class's name, ``str()`` its message."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type_name = type_name

    def __str__(self) -> str:
        return f"{self.type_name}: {self.args[0]}" if self.args[0] else self.type_name


class BadRequest(ValueError):
    """A rank process sent something the launcher cannot read."""


# ---- what crosses a pipe ---------------------------------------------------------------------

def _spec(tensor: torch.Tensor) -> dict[str, Any]:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"a message is a torch.Tensor, not {type(tensor).__name__}")
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
            "meta": bool(tensor.is_meta)}


def _raw(tensor: torch.Tensor) -> bytes | None:
    if tensor.is_meta:
        return None
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _tensor(spec: Any, raw: bytes | None, empty: bool = False) -> torch.Tensor:
    """The tensor ``spec`` names, holding ``raw`` (refused unless it is exactly its bytes),
    or, ``empty``, uninitialised (a receive's buffer)."""
    if type(spec) is not dict or spec.get("dtype") not in DTYPES:
        raise BadRequest(f"not a tensor: {spec!r:.200}")
    shape, dtype = spec.get("shape"), DTYPES[spec["dtype"]]
    if (type(shape) is not list or len(shape) > 32
            or not all(type(d) is int and 0 <= d < 2**40 for d in shape)):
        raise BadRequest(f"not a shape: {shape!r:.200}")
    if spec.get("meta"):
        return torch.empty(shape, dtype=dtype, device="meta")
    if empty:
        return torch.empty(shape, dtype=dtype)
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if raw is None or len(raw) != nbytes:
        raise BadRequest(f"a tensor of {nbytes} bytes came with "
                         f"{'none' if raw is None else len(raw)}")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def _send(conn: Connection, header: dict[str, Any], payload: bytes | None = None) -> None:
    header = dict(header, payload=payload is not None)
    conn.send_bytes(json.dumps(header).encode())
    if payload is not None:
        conn.send_bytes(payload)


def _read(conn: Connection, limit: int = MAX_RESULT_BYTES) -> tuple[dict[str, Any], bytes | None]:
    header = json.loads(conn.recv_bytes(MAX_HEADER_BYTES))
    if type(header) is not dict or type(header.get("type", "")) is not str:
        raise BadRequest("a message that is not a dict")
    payload = conn.recv_bytes(limit) if header.get("payload") else None
    return header, payload


def _error_header(exc: BaseException) -> dict[str, Any]:
    frames = [[f.filename, f.lineno, f.name, f.line or ""]
              for f in traceback.extract_tb(exc.__traceback__)]
    return {"error": [c.__name__ for c in type(exc).__mro__], "message": str(exc)[:4000],
            "frames": frames[-40:],
            "traceback": "".join(traceback.format_exception(exc))[-8000:]}


def rebuilt_error(header: dict[str, Any]) -> BaseException:
    """The exception a rank process reported (``_error_header``): the first builtin (or
    communicator) exception class among its type's names, else ``RemoteError``; with the
    rank's ``remote_frames`` and ``remote_traceback`` attached."""
    names = [str(n) for n in header.get("error", [])] or ["Exception"]
    message = str(header.get("message", ""))
    cls = next((_COMM_EXCEPTIONS.get(n) or _EXCEPTIONS.get(n) for n in names
                if n in _COMM_EXCEPTIONS or n in _EXCEPTIONS and n != "Exception"), None)
    try:
        exc: BaseException = cls(message) if cls is not None else RemoteError(names[0], message)
    except Exception:  # noqa: BLE001 - a builtin that takes other arguments
        exc = RemoteError(names[0], message)
    frames = header.get("frames", [])
    exc.remote_frames = [traceback.FrameSummary(str(f[0]), int(f[1]), str(f[2]),
                                                lookup_line=False, line=str(f[3]))
                         for f in frames if isinstance(f, list) and len(f) == 4]
    exc.remote_traceback = str(header.get("traceback", ""))
    return exc


# ---- the launcher's side -------------------------------------------------------------------

class _Tamper:
    """Changes the first element of every message that carries data, as it is sent: ``x``
    becomes ``x + |x| + 1`` (never ``x`` itself, in any dtype). Every message, not one: a
    message may carry only padding that no result shows."""

    def __init__(self, change: bool = True) -> None:
        self.change = change  # False: only note whether a message carried data
        self.done = False

    def __call__(self, tensor: torch.Tensor) -> None:
        if tensor.is_meta or tensor.numel() == 0 or tensor.is_complex():
            return
        self.done = True
        if not self.change:
            return
        flat = tensor.view(-1)
        with torch.no_grad():
            if tensor.dtype == torch.bool:
                flat[0] = ~flat[0]
            else:
                flat[0] = flat[0] + flat[0].abs() + 1


class _Server:
    """Serves one lane (program or comm stream) of one rank process, in the launch's thread
    of that lane: each request runs on the launch's own ``SimCommunicator``."""

    def __init__(self, comm: SimCommunicator, conn: Connection, works: dict,
                 tamper: _Tamper | None = None, jobs_in_order: bool = False) -> None:
        self.comm, self.conn, self.works, self.tamper = comm, conn, works, tamper
        self.jobs_in_order = jobs_in_order
        self.handles = itertools.count()
        self.stream: _Server | None = None

    def serve(self) -> Any:
        """Until the program is done (its result) or the job is (None)."""
        while True:
            try:
                header, payload = _read(self.conn)
            except (EOFError, OSError):
                raise RemoteError("ProcessEnded", f"rank {self.comm.rank}'s process ended "
                                  "before its program returned (os._exit, a crash or a "
                                  "signal)") from None
            kind = header["type"]
            if kind in ("done", "error", "job_end", "job_error"):
                output = str(header.get("output", ""))[:OUTPUT_CHARS]
                if output:
                    print(output, end="" if output.endswith("\n") else "\n")
                if kind in ("error", "job_error"):
                    raise rebuilt_error(header)
                if kind == "job_end":
                    return None
                with self.comm.router.lock:  # the launcher's own work: not counted
                    return plain(torch.load(io.BytesIO(payload or b""), weights_only=True))
            self._handle(kind, header, payload)

    def _reply(self, header: dict[str, Any], tensor: torch.Tensor | None = None) -> None:
        with self.comm.router.lock:
            payload = _raw(tensor) if tensor is not None else None
        _send(self.conn, header, payload)

    def _handle(self, kind: str, header: dict[str, Any], payload: bytes | None) -> None:
        comm = self.comm
        try:
            if kind == "op":
                seconds, flops = float(header["seconds"]), float(header["flops"])
                if not (math.isfinite(seconds) and math.isfinite(flops)
                        and seconds >= 0 and flops >= 0):
                    raise BadRequest("a compute op's seconds and FLOPs are finite and >= 0")
                comm.record(comm.actor(), ops.Compute(seconds, str(header["kind"])[:200],
                                                      str(header["label"])[:200], flops))
                return
            if kind == "log":
                comm.log(str(header["text"])[:4000])
                return
            reply, tensor = self._run(kind, header, payload)
        except Aborted:
            raise
        except Exception as exc:  # noqa: BLE001 - raised in the rank, where it was asked
            if kind not in ("op", "log"):
                _send(self.conn, _error_header(exc))
            return
        self._reply(reply, tensor)

    def _run(self, kind: str, h: dict[str, Any], payload: bytes | None
             ) -> tuple[dict[str, Any], torch.Tensor | None]:
        comm = self.comm
        if kind == "post":
            with comm.router.lock:
                tensor = _tensor(h["tensor"], payload, empty=h["op"] != "send")
                if self.tamper is not None and h["op"] == "send":
                    self.tamper(tensor)
            peer, tag, op = int(h["peer"]), int(h["tag"]), h["op"]
            if op not in ("send", "recv"):
                raise BadRequest(f"no such op {op!r}")
            if h["blocking"]:
                (comm.send if op == "send" else comm.recv)(tensor, peer, tag)
                return {"ok": 1}, (tensor if op == "recv" else None)
            work = (comm.isend if op == "send" else comm.irecv)(tensor, peer, tag)
            return self._keep(work, tensor if op == "recv" else None), None
        if kind == "wait":
            work, tensor = self._work(h["handle"])
            work.wait()
            return {"ok": 1}, tensor
        if kind == "wait_any":
            found = [self._work(handle) for handle in h["handles"]]
            index = comm.wait_any([work for work, _ in found])
            return {"index": index}, found[index][1]
        if kind == "recv_any":
            with comm.router.lock:
                tensor = _tensor(h["tensor"], None, empty=True)
            src = comm.recv_any(tensor, [int(s) for s in h["sources"]], int(h["tag"]))
            return {"src": src}, tensor
        if kind == "alloc":
            return {"token": comm.memory.alloc(str(h["category"]), int(h["nbytes"]),
                                               str(h["label"]))}, None
        if kind == "free":
            comm.memory.free(int(h["token"]))
            return {"ok": 1}, None
        if kind == "submit":
            if self.stream is None:
                raise BadRequest("jobs are submitted from the rank's program")
            work = comm.run_async(self.stream.serve)
            if self.jobs_in_order:
                self._job_done(work)
            return self._keep(work, None), None
        raise BadRequest(f"no such request {kind!r}")

    def _job_done(self, work: Any) -> None:
        """Before the program hears that its job started, wait (in real time, with nothing
        recorded: the timeline is as without the wait) until the job has ended."""
        comm, job = self.comm, work.job
        comm.router.block(comm.actor(), lambda: job in comm.stream.results,
                          f"waiting for comm-stream job {job} to end: here each job runs to "
                          "its end before the program that started it goes on, so a job can "
                          "use only what exists when it starts (not something the program "
                          "makes afterwards, nor a threading.Event it sets)")

    def _keep(self, work: Work, tensor: torch.Tensor | None) -> dict[str, Any]:
        handle = f"{self.comm.actor().lane}.{next(self.handles)}"
        self.works[handle] = (work, tensor)
        return {"handle": handle}

    def _work(self, handle: Any) -> tuple[Work, torch.Tensor | None]:
        if handle not in self.works:
            raise BadRequest(f"no work {handle!r}")
        return self.works[handle]


def run_apart(fn: Callable[..., Any], cluster: Any, args: tuple = (),
              kwargs: dict | None = None, timeout: float = 60.0,
              hide: Sequence[Sequence[Any]] = (),
              prepare: Callable[[int], None] | None = None, tamper: bool = False,
              jobs_in_order: bool = False) -> Any:
    """``launch(fn, cluster, *args, **kwargs)`` on the simulator, with every rank in a forked
    process of its own (see the module's docstring); returns the ``LaunchResult``, whose
    results are plain data. ``hide``: sequences with one entry per rank (tensors, or lists
    and dicts of them), cleared in every rank's process but their owner's. ``prepare(rank)``
    runs in the rank's process before the program. ``tamper``: every message that carries
    data has its first element changed on the way (``_Tamper``); the result's ``tampered``
    says whether one was, its ``carried_data`` whether any message carried data (a run on
    meta tensors carries none). ``jobs_in_order``: a job submitted to a rank's comm stream
    runs to its end before the rank's program goes on (``run_async`` returns only then),
    in real time only: the op lists, and so the timeline, are as without it. A job then
    uses only what existed when it was submitted, as its place on the timeline says; one
    that waits for something the program does later (a ``threading.Event`` the simulator
    cannot see) never ends, and the launch times out."""
    from mpgpu_edu.comm.launch import run_sim
    from mpgpu_edu.comm.result import resolve_cluster

    cluster = resolve_cluster(cluster)
    n = cluster.world_size
    pipes = [(Pipe(), Pipe()) for _ in range(n)]  # per rank: (program, stream), both ends
    pids: list[int] = []
    try:
        pids = fork_each(n, lambda rank: _rank_main(rank, cluster, fn, args, kwargs or {},
                                                    pipes, hide, prepare))
        for (program, stream) in pipes:
            program[1].close()
            stream[1].close()

        changer = _Tamper(change=tamper)

        def serve(comm: SimCommunicator) -> Any:
            works: dict = {}
            host = _Server(comm, pipes[comm.rank][0][0], works, changer, jobs_in_order)
            host.stream = _Server(comm, pipes[comm.rank][1][0], works, changer)
            return host.serve()

        result = run_sim(serve, cluster, (), {}, timeout)
        result.tampered = bool(tamper and changer.done)
        result.carried_data = changer.done  # whether any message carried data (not meta)
        return result
    finally:
        end_all(pids)
        for (program, stream) in pipes:
            for conn in (*program, *stream):
                with contextlib.suppress(OSError):
                    conn.close()


# ---- the rank's side -----------------------------------------------------------------------

def _rank_main(rank: int, cluster: Any, fn: Callable[..., Any], args: tuple, kwargs: dict,
               pipes: list, hide: Sequence[Sequence[Any]],
               prepare: Callable[[int], None] | None) -> None:  # pragma: no cover - forked
    """The rank's process (``runtime.forked.fork_each`` ends it when this returns)."""
    for index, (program, stream) in enumerate(pipes):
        program[0].close()
        stream[0].close()
        if index != rank:
            program[1].close()
            stream[1].close()
    only_fds([pipes[rank][0][1].fileno(), pipes[rank][1][1].fileno()])
    # One thread for torch's kernels: a fork keeps only the forking thread, and OpenMP's pool,
    # if the parent had started one, is not there to run a parallel op (the op would hang).
    # Simulated times do not depend on it.
    torch.set_num_threads(1)
    output = _Output()
    sys.stdout = sys.stderr = output
    for per_rank in hide:
        for index, value in enumerate(per_rank):
            if index != rank:
                _clear(value)
    comm = ApartCommunicator(rank, cluster.world_size, cluster, pipes[rank][0][1],
                             pipes[rank][1][1], output)
    try:
        if prepare is not None:
            prepare(rank)
        comm.bind(comm.host)
        result = fn(comm, *args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher
        comm.failed(exc)
    else:
        comm.finished(result)


def _clear(value: Any, depth: int = 0) -> None:
    """Zero every tensor in ``value`` (a tensor, a module's parameters and buffers, or
    lists, tuples and dicts of them)."""
    if depth > 8:
        return
    if isinstance(value, torch.nn.Module):
        for tensor in [*value.parameters(), *value.buffers()]:
            _clear(tensor, depth + 1)
    elif isinstance(value, torch.Tensor):
        if not value.is_meta:
            with torch.no_grad():
                value.detach().zero_()
    elif isinstance(value, (list, tuple)):
        for item in value:
            _clear(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            _clear(item, depth + 1)


class _Output(io.TextIOBase):
    """What a rank prints: kept (up to ``OUTPUT_CHARS``) and sent with its result."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.kept = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        text = str(text)
        room = OUTPUT_CHARS - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))
        return len(text)

    def take(self) -> str:
        text, self.parts, self.kept = "".join(self.parts), [], 0
        return text


class _Lane:
    def __init__(self, conn: Connection) -> None:
        self.conn, self.lock = conn, threading.Lock()


class _ApartWork(Work):
    def __init__(self, comm: ApartCommunicator, handle: str,
                 tensor: torch.Tensor | None) -> None:
        self.comm, self.handle, self.tensor = comm, handle, tensor

    def wait(self) -> None:
        self.comm.flush_region(self.comm.actor())
        self.comm.request({"type": "wait", "handle": self.handle}, into=self.tensor)


class _ApartJobWork(Work):
    _UNSET = object()

    def __init__(self, comm: ApartCommunicator, handle: str, job: int) -> None:
        self.comm, self.handle, self.job = comm, handle, job
        self.result: Any = self._UNSET

    def wait(self) -> Any:
        if self.result is not self._UNSET:
            return self.result
        self.comm.flush_region(self.comm.actor())
        self.comm.request({"type": "wait", "handle": self.handle})
        self.result = self.comm.job_results.pop(self.job)
        return self.result


class _ApartMemory(MemoryRecorder):
    def __init__(self, comm: ApartCommunicator) -> None:
        self.comm = comm

    def alloc(self, category: str, nbytes: int, label: str = "") -> int:
        reply = self.comm.request({"type": "alloc", "category": str(category),
                                   "nbytes": int(nbytes), "label": str(label)})
        return int(reply["token"])

    def free(self, token: int) -> None:
        self.comm.request({"type": "free", "token": int(token)})


class ApartCommunicator(CountedCommunicator):
    """One rank's communicator in a rank process of ``run_apart``: the same methods as the
    simulator's, each forwarded to the launcher, which runs it on the launch's own
    communicator; compute regions are counted here, as on the simulator."""

    def __init__(self, rank: int, world_size: int, cluster: Any, program: Connection,
                 stream: Connection, output: _Output) -> None:
        self.rank, self.world_size, self.cluster = rank, world_size, cluster
        self.stats = CommStats()
        self.host = Actor(rank, ops.HOST)
        self.stream_actor = Actor(rank, ops.STREAM)
        self._local = threading.local()
        self._lanes = {ops.HOST: _Lane(program), ops.STREAM: _Lane(stream)}
        self._memory = _ApartMemory(self)
        self._output = output
        self._jobs: deque[tuple[int, Callable[..., Any], tuple]] = deque()
        self.job_results: dict[int, Any] = {}
        self._job_ids = itertools.count()
        self._ready = threading.Condition()
        self._program_done = False
        self._stream_thread: threading.Thread | None = None

    def counting_skipped(self) -> bool:
        return getattr(self._local, "quiet", False)

    def record(self, actor: Actor, op: ops.Op) -> None:
        assert isinstance(op, ops.Compute)
        self._tell(actor, {"type": "op", "seconds": op.seconds, "kind": op.kind,
                           "label": op.label, "flops": op.flops})

    def _tell(self, actor: Actor, header: dict[str, Any]) -> None:
        lane = self._lanes[actor.lane]
        with lane.lock:
            _send(lane.conn, header)

    def request(self, header: dict[str, Any], tensor: torch.Tensor | None = None,
                into: torch.Tensor | None = None) -> dict[str, Any]:
        """Send ``header`` (and ``tensor``'s elements) on this thread's lane and wait for the
        reply; copy the elements it brings into ``into``; raise the error it reports."""
        reply, data = self._exchange(header, tensor)
        self._fill(into, data)
        return reply

    def _exchange(self, header: dict[str, Any], tensor: torch.Tensor | None = None
                  ) -> tuple[dict[str, Any], bytes | None]:
        """``request``'s round trip: the reply and the elements it brings."""
        lane = self._lanes[self.actor().lane]
        self._local.quiet = True  # the communicator's own copies: not the program's work
        try:
            payload = _raw(tensor) if tensor is not None else None
            with lane.lock:
                _send(lane.conn, header, payload)
                reply, data = _read(lane.conn)
        finally:
            self._local.quiet = False
        if "error" in reply:
            raise rebuilt_error(reply)
        return reply, data

    def _fill(self, into: torch.Tensor | None, data: bytes | None) -> None:
        if into is None or data is None:
            return
        self._local.quiet = True
        try:
            with torch.no_grad():
                into.copy_(_tensor(_spec(into), data))
        finally:
            self._local.quiet = False

    # ---- point to point ---------------------------------------------------------------------
    def _post(self, op: str, tensor: torch.Tensor, peer: int, tag: int,
              blocking: bool) -> dict[str, Any]:
        check_peer(self.rank, self.world_size, op, tensor, peer)
        self.flush_region(self.actor())
        header = {"type": "post", "op": op, "peer": int(peer), "tag": int(tag),
                  "blocking": blocking, "tensor": _spec(tensor)}
        sent = tensor if op == "send" else None
        reply = self.request(header, sent, into=tensor if op == "recv" and blocking else None)
        if blocking:
            self._count(op, tensor, peer)
        return reply

    def _count(self, op: str, tensor: torch.Tensor, peer: int) -> None:
        if op == "send":
            self.stats.record_send(peer, nbytes_of(tensor))
        else:
            self.stats.record_recv(peer, nbytes_of(tensor))

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self._post("send", tensor, dst, tag, True)

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        self._post("recv", tensor, src, tag, True)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Work:
        reply = self._post("send", tensor, dst, tag, False)
        self._count("send", tensor, dst)
        return _ApartWork(self, reply["handle"], None)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Work:
        reply = self._post("recv", tensor, src, tag, False)
        self._count("recv", tensor, src)
        return _ApartWork(self, reply["handle"], tensor)

    def recv_any(self, tensor: torch.Tensor, sources: Sequence[int], tag: int = 0) -> int:
        sources = tuple(sources)
        check_sources(self.rank, sources)
        for src in sources:
            check_peer(self.rank, self.world_size, "recv", tensor, src)
        self.flush_region(self.actor())
        reply = self.request({"type": "recv_any", "sources": [int(s) for s in sources],
                              "tag": int(tag), "tensor": _spec(tensor)}, into=tensor)
        self._count("recv", tensor, int(reply["src"]))
        return int(reply["src"])

    def wait_any(self, works: Sequence[Work]) -> int:
        works = list(works)
        if not works or not all(isinstance(w, _ApartWork) for w in works):
            raise TypeError("wait_any needs a non-empty list of works from isend/irecv")
        self.flush_region(self.actor())
        reply, data = self._exchange({"type": "wait_any",
                                      "handles": [w.handle for w in works]})
        index = int(reply["index"])
        self._fill(works[index].tensor, data)
        return index

    # ---- the communication stream -------------------------------------------------------------
    def run_async(self, fn: Callable[..., Any], *args: Any) -> Work:
        self.submitting_actor()
        job = next(self._job_ids)
        with self._ready:  # queued before the launcher hears of it: it may wait for its end
            self._jobs.append((job, fn, args))
            if self._stream_thread is None:
                self._stream_thread = threading.Thread(target=self._stream_loop, daemon=True,
                                                       name=f"rank-{self.rank}-stream")
                self._stream_thread.start()
            self._ready.notify()
        reply = self.request({"type": "submit"})
        return _ApartJobWork(self, reply["handle"], job)

    def _stream_loop(self) -> None:
        actor = self.stream_actor
        self.bind(actor)
        while True:
            with self._ready:
                while not self._jobs and not self._program_done:
                    self._ready.wait()
                if not self._jobs:
                    return
                job, fn, args = self._jobs.popleft()
            try:
                result = fn(*args)
                self.flush_region(actor)
            except BaseException as exc:  # noqa: BLE001 - reported to the launcher
                self._tell(actor, dict(_error_header(exc), type="job_error"))
                return
            self.job_results[job] = result
            self._tell(actor, {"type": "job_end", "job": job})

    def log(self, text: str) -> None:
        self._tell(self.actor(), {"type": "log", "text": str(text)})

    # ---- the end ----------------------------------------------------------------------------
    def finished(self, result: Any) -> None:
        """The program returned ``result``: send it, then let the comm stream finish."""
        self.flush_region(self.host)
        buffer = io.BytesIO()
        self._local.quiet = True
        try:
            torch.save(plain(result), buffer)
        except Exception as exc:  # noqa: BLE001 - what plain data cannot hold
            self.failed(exc)
            return
        lane = self._lanes[ops.HOST]
        with lane.lock:
            _send(lane.conn, {"type": "done", "output": self._output.take()},
                  buffer.getvalue())
        self._end_stream()

    def failed(self, exc: BaseException) -> None:
        with contextlib.suppress(Exception):
            self._tell(self.host, dict(_error_header(exc), type="error",
                                       output=self._output.take()))
        self._end_stream()

    def _end_stream(self) -> None:
        with self._ready:
            self._program_done = True
            self._ready.notify()
        if self._stream_thread is not None:
            self._stream_thread.join()
