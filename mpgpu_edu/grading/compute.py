"""The child side of a check: limit itself, import the learner's file, run the *compute*
half of each case, and send back plain data. Nothing here decides a verdict: the grader's
process judges (``runner``), so a child that lies, patches the checks or writes to its pipe
can only send data the judge then compares with the reference.

A child is forked by the runtime's fork server; it imports the exercise's checks only after
the fork (the server preloads none), works in a scratch folder, sends ``sys.stdout`` and
``sys.stderr`` to a capped buffer kept per case, limits its memory, file sizes and (where
the grader asked) its processes, and runs every case under a soft timeout (``SIGALRM``; the
grader kills the child when a case overruns by its grace).

Messages child -> grader (``wire``): ``import``, ``import_error``, ``start`` (case i, its
timeout), ``computed`` (case i's data), ``ended`` (case i did not compute: its status and
message), ``done``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mpgpu_edu.grading._outcome import CaseTimeout, classify, learner_frames
from mpgpu_edu.grading.wire import encode
from mpgpu_edu.runtime.isolate import cut_off, hide_files, not_dumpable

GRADING_CHILD_ENV = "MPGPU_EDU_GRADING_CHILD"
FILE_BYTES = 64 * 2**20  # the largest file a check's child may write


class CappedOutput(io.TextIOBase):
    """A text stream that keeps the first ``limit`` characters and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit, self.parts, self.kept, self.dropped = limit, [], 0, 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        text = str(text)
        room = self.limit - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def take(self) -> str:
        text = "".join(self.parts)
        if self.dropped:
            text += f"\n[... {self.dropped} more characters of output not kept]"
        self.parts, self.kept, self.dropped = [], 0, 0
        return text


def main(conn: Any, request: dict) -> None:
    """Entry point of a child (``runtime`` calls it): cases ``request["start"]..``."""
    os.environ[GRADING_CHILD_ENV] = "1"  # this process runs checks (the demo-call log skips it)
    try:
        _isolate(request)
        if not request["judge"]:  # class grading: the grader makes the ranks' seeds
            from mpgpu_edu.grading.checks import _support

            _support.SEED_SOURCE = _SeedSource(conn)
        output = CappedOutput(request["output_chars"])
        sys.stdout = sys.stderr = output
        _run(lambda message: conn.send_bytes(encode(message)), request, output)
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        os._exit(0)  # do not wait for threads the learner's code left running


class _SeedSource:
    """In class grading, the seeds of the ranks' inputs come from the grader
    (``checks._support.secret_seed``): a ``seed`` message on the pipe, answered with the
    seed made from it with the grader's secret key, which never leaves the grader."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.ids, self.made = conn, 0, {}

    def __call__(self, seed: int) -> int:
        if seed not in self.made:
            self.ids += 1
            self.conn.send_bytes(encode({"type": "seed", "id": self.ids, "seed": int(seed)}))
            while True:  # an answer to a request a timed-out case left behind is skipped
                reply = json.loads(self.conn.recv_bytes(4096))
                if reply.get("id") == self.ids:
                    break
            self.made[seed] = int(reply["seed"])
        return self.made[seed]


# Whether this process is a grading child (``main``, via ``_isolate``): only a child forgets
# the package's blocked code and hides its files (``_sealed``), never a process that runs
# ``_run`` itself (a test) and goes on to use the package.
IN_CHILD = False


def _isolate(request: dict) -> None:
    global IN_CHILD
    IN_CHILD = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.chdir(request["workdir"])  # a scratch folder: whatever the code writes lands there
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(Path(request["file"]).parent))  # the file's own neighbours
    os.environ["MPLBACKEND"] = "Agg"
    torch.set_num_threads(1)
    _limit(request["memory_bytes"], request.get("max_processes"))
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, _on_alarm)


def _limit(extra_bytes: int, max_processes: int | None) -> None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return
    size = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                size = int(line.split()[1]) * 1024
    limits = [(resource.RLIMIT_AS, size + extra_bytes), (resource.RLIMIT_CORE, 0),
              (resource.RLIMIT_FSIZE, FILE_BYTES)]
    if max_processes:
        limits.append((resource.RLIMIT_NPROC, max_processes))  # ignored for root: see sandbox
    for which, value in limits:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(which, (value, value))
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit raises instead


def _on_alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout()


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """A soft timeout (SIGALRM); where there is none, the grader's hard timeout remains."""
    if not hasattr(signal, "setitimer"):
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _run(send: Any, request: dict, output: CappedOutput) -> None:
    from mpgpu_edu.grading.checks import cases_for
    from mpgpu_edu.grading.checks._plain import plain

    from mpgpu_edu.grading.checks import _support

    started = time.monotonic()
    apart = not request["judge"] and request["exercise"] in ranks_apart(request["exercise"])
    cases = cases_for(request["exercise"])
    if request["judge"]:
        send({"type": "cases", "cases": [{"name": c.name, "points": c.points,
                                          "hidden": c.hidden} for c in cases]})
    send({"type": "import"})
    from mpgpu_edu.grading.checks._blocking import package_bindings

    # Class grading (the grader judges): the references stay blocked from before the
    # learner's file is imported until the child ends, so no code of the file (at import, in
    # a thread it started, between two cases) ever runs them. A learner's own check judges
    # here, with the references, so it blocks them per case, and while the file is imported.
    whole_run = contextlib.ExitStack()
    with whole_run:
        if not request["judge"]:
            whole_run.enter_context(references_blocked(request["exercise"]))
            # Where the ranks run apart, this child never runs the file, and each rank seals
            # itself (``InRanks.prepare``): a user namespace made here would keep the ranks
            # from making their own.
            problems = [] if apart or not IN_CHILD else _sealed()
            if problems:
                send({"type": "import_error", "status": "error",
                      "message": "the grader could not put the package's own code out of "
                                 "reach (" + "; ".join(problems[:3]) + "): ask the instructor "
                                 "to grade where user namespaces are allowed"})
                return
        baseline = package_bindings()  # before the learner's file runs a line
        try:
            if apart:  # this child never runs the file: each rank process does (InRanks)
                not_dumpable()
                impl = _support.APART = InRanks(request)
            else:
                with _alarm(min(30.0, request["budget_s"])), (
                        references_blocked(request["exercise"]) if request["judge"]
                        else contextlib.nullcontext()), \
                        collectives_blocked_at_import(request["exercise"]):
                    impl = _load(request["file"], request["function"])
        except BaseException as exc:  # noqa: BLE001 - anything the file does on import
            status = "timeout" if isinstance(exc, CaseTimeout) else "error"
            send({"type": "import_error", "status": status,
                  "message": _import_message(exc, request)})
            return
        figure_sent = False
        for index in range(request["start"], len(cases)):
            case = cases[index]
            left = request["budget_s"] - (time.monotonic() - started)
            if left <= 0:
                break
            soft = min(case.timeout_s, request["case_timeout_s"] or case.timeout_s, left)
            send({"type": "start", "index": index, "timeout_s": soft})
            case_start = time.monotonic()
            message: dict[str, Any] = {"type": "computed", "index": index}
            try:
                with _alarm(soft), (references_blocked(request["exercise"])
                                    if request["judge"] else contextlib.nullcontext()):
                    message["data"] = plain(case.compute(impl))
                package_left_as_it_was(baseline, request["file"])
            except BaseException as exc:  # noqa: BLE001 - classified for the report
                timed_out = isinstance(exc, CaseTimeout)
                status, text = (("timeout", f"still running after {soft:.1f} s (an endless "
                                 "loop? a rank waiting for a message nobody sends?)")
                                if timed_out else
                                classify(exc, soft, request["memory_bytes"], request["file"],
                                         request["display_file"]))
                message = {"type": "ended", "index": index, "status": status, "message": text}
            if request["judge"] and message["type"] == "computed":
                message = _judged(case, message, request, figure_sent)
                figure_sent = figure_sent or bool(message.get("figure"))
            message.update(output=output.take(),
                           seconds=round(time.monotonic() - case_start, 3))
            send(message)
            if message.get("status") == "timeout":
                break  # threads may still be running: continue in a fresh process
    send({"type": "done"})


def _sealed() -> list[str]:
    """Class grading, before any code of the submission runs in this process (or in a rank
    forked from it): forget the original code of every function blocked now (the references
    stay blocked until the process ends, so it is never put back), and hide the files it
    could be compiled again from, with every compiled module of the package (``__pycache__``)
    and the source lines Python keeps in memory (``linecache``). So the package's own
    implementation cannot be dug out of the interpreter's objects (``gc``) nor run again
    from its source. What could not be done, or []."""
    import linecache

    import mpgpu_edu
    from mpgpu_edu.grading.checks._blocking import seal

    files = seal()
    caches = Path(mpgpu_edu.__file__).resolve().parent.rglob("__pycache__")
    linecache.clearcache()
    return hide_files(files, [str(folder) for folder in caches])


def _judged(case: Any, message: dict, request: dict, figure_sent: bool) -> dict:
    """A learner's own check: this child judges the case too (see ``session.State``)."""
    from mpgpu_edu.grading._outcome import figure_png
    from mpgpu_edu.grading.session import verdict

    status, text, evidence = verdict(case, message["data"])
    judged = {"type": "judged", "index": message["index"], "status": status,
              "message": text, "text": getattr(evidence, "text", "") or ""}
    if request["figures"] and not figure_sent and getattr(evidence, "traces", None):
        judged["figure"] = figure_png(evidence)
    return judged


@contextlib.contextmanager
def references_blocked(exercise_id: str) -> Iterator[None]:
    """While inside (a case's *compute* half), the package's own implementations that would
    do the exercise's work (``blocked_references``) raise when called, however the learner's
    code reached them: their code is swapped, not their names (``checks._blocking``), so a
    reference kept in a dict, a default argument or a subclass raises too. The judges after
    it use them again."""
    from mpgpu_edu.grading.checks import CheckFailure
    from mpgpu_edu.grading.checks._blocking import code_blocked

    with code_blocked([(owner, f"exercise {exercise_id} is yours to write: the package's own "
                               f"{attribute} cannot be called while it is checked")
                       for owner, attribute in blocked_references(exercise_id)], CheckFailure):
        yield


@contextlib.contextmanager
def collectives_blocked_at_import(exercise_id: str) -> Iterator[None]:
    """While the learner's file is imported: the collectives (``checks._support.
    forbidden_collectives``) raise too, as no exercise file needs one at import, and a table
    of their results made then would outlive every check."""
    from mpgpu_edu.grading.checks import CheckFailure
    from mpgpu_edu.grading.checks._blocking import code_blocked
    from mpgpu_edu.grading.checks._support import forbidden_collectives

    with code_blocked([(value, f"importing the file for exercise {exercise_id} called "
                               f"{display}: code at the top of an exercise file runs before "
                               "the check starts, and must not call the package's collectives")
                       for value, display in forbidden_collectives()], CheckFailure):
        yield


# Blocked for every exercise, besides each exercise's own ``REFERENCES``: the course's answer
# implementations, whose only use is to be an answer (or the package's own DDP and parameter
# servers, which no check computes with), so that one exercise's reference cannot do
# another's work (1.6's tree for 1.3, lesson 02's server for 1.2, the DDP's buckets for 3.1).
ANSWERS = ("mpgpu_edu.lessons.communication:binary_tree_all_reduce",
           "mpgpu_edu.lessons.parameter_server:*", "mpgpu_edu.lessons.welcome:device_ids_for",
           "mpgpu_edu.lessons.choosing_and_debugging:smooth_ring_reference",
           "mpgpu_edu.lessons.choosing_and_debugging:find_straggler_reference",
           "mpgpu_edu.dp.ddp:*", "mpgpu_edu.dp.wrapper:*", "mpgpu_edu.dp.fsdp:*",
           "mpgpu_edu.ps.sharded:*", "mpgpu_edu.ps.sync:*",
           "mpgpu_edu.memory.recompute:checkpointed")


def blocked_references(exercise_id: str) -> list[tuple[Any, str]]:
    """(object, name) of every reference blocked while ``exercise_id`` computes: its own
    lesson's ``REFERENCES`` for it, and ``ANSWERS``."""
    from mpgpu_edu.grading.checks import lesson_module
    from mpgpu_edu.grading.registry import get

    own = getattr(lesson_module(get(exercise_id).lesson), "REFERENCES", {}).get(exercise_id, ())
    return [found for target in dict.fromkeys([*own, *ANSWERS])
            for found in resolve_reference(target)]


def package_left_as_it_was(baseline: dict, learner_file: str) -> None:
    """Raise ``CheckFailure`` if the learner's code rebound one of the package's functions or
    classes, or swapped a function's code, since ``baseline`` (``package_bindings``, taken
    before the learner's file was imported), or bound code of its own in a module of the
    package (one first imported by the learner's file too)."""
    from mpgpu_edu.grading.checks import CheckFailure
    from mpgpu_edu.grading.checks._blocking import changed_bindings

    changed = changed_bindings(baseline, learner_file)
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise CheckFailure(f"the code changed the package's own {changed[0]}{more} while it "
                           "was checked: the package is not yours to change; leave its "
                           "modules as they are")


def resolve_reference(target: str) -> list[tuple[Any, str]]:
    """``"module:Class.method"`` (or ``"module:function"``, ``"module:Class"``) -> the object
    as its owner holds it (a method's ``staticmethod`` included) and the attribute's name;
    ``"module:*"``: every function and class the module defines."""
    import importlib
    import inspect

    module_name, _, attribute = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    if attribute == "*":
        return [(value, f"{module_name}.{name}") for name, value in vars(owner).items()
                if (inspect.isfunction(value) or inspect.isclass(value))
                and getattr(value, "__module__", "") == module_name]
    *classes, name = attribute.split(".")
    for part in classes:
        owner = getattr(owner, part)
    return [((owner.__dict__[name] if classes else getattr(owner, name)), attribute)]


def _lesson_list(exercise_id: str, name: str) -> tuple[str, ...]:
    """The exercise ids that ``exercise_id``'s lesson lists under ``name`` (none if it has
    no such list)."""
    from mpgpu_edu.grading.checks import lesson_module
    from mpgpu_edu.grading.registry import get

    return tuple(getattr(lesson_module(get(exercise_id).lesson), name, ()))


def ranks_apart(exercise_id: str) -> tuple[str, ...]:
    """The exercises of ``exercise_id``'s lesson whose ranks run apart in class grading
    (the lesson's ``RANKS_APART``)."""
    return _lesson_list(exercise_id, "RANKS_APART")


def jobs_in_order(exercise_id: str) -> bool:
    """Whether, with its ranks apart, each comm-stream job of ``exercise_id`` runs to its end
    before ``run_async`` returns (the lesson's ``JOBS_IN_ORDER``; ``comm.apart``)."""
    return exercise_id in _lesson_list(exercise_id, "JOBS_IN_ORDER")


class InRanks:
    """The learner's function, for an exercise whose ranks run apart in class grading
    (``RANKS_APART``): the child reads the file's text but never runs it; each rank process
    of ``comm.apart`` cuts itself off from the others (``runtime.isolate.cut_off``), then
    imports the file (``prepare``), and only there can the function be called. So no code
    of the submission runs where the router, the op lists and the other ranks' inputs are,
    and no rank holds another's input, nor the key that made them (the grader's)."""

    def __init__(self, request: dict) -> None:
        self.file, self.function = request["file"], request["function"]
        self.baseline: dict = {}  # in a rank: the package as it was before the file ran
        self.exercise, self.workdir = request["exercise"], request["workdir"]
        self.jobs_in_order = jobs_in_order(self.exercise)
        self.source = Path(self.file).read_text(encoding="utf-8", errors="replace")
        compile(self.source, self.file, "exec")  # a syntax error is the import's error
        self.loaded: Any = None
        self.ready = False  # in a rank's process, once it is cut off (``prepare``)
        self.importing = threading.Lock()
        self.__name__ = self.function.rsplit(".", 1)[-1]
        self.counted: dict[str, list[int]] | None = None  # counting_calls' dict, in the child
        self.calls: dict[str, int] = {}  # in a rank's process: its calls of each name

    @contextlib.contextmanager
    def counting(self, names: Any, calls: dict[str, list[int]]) -> Iterator[None]:
        """``checks._support.counting_calls`` with the ranks apart: each rank's process
        counts its calls of the file's functions ``names``, and its result brings them back
        (``calls_here``) into ``calls`` (``add_calls``)."""
        self.counted = calls
        try:
            yield
        finally:
            self.counted = None

    def calls_here(self) -> dict[str, int]:
        """In a rank's process, once its program returned: its calls of each counted name;
        first, as the child does after every case, fail if the package was changed."""
        package_left_as_it_was(self.baseline, self.file)
        return dict(self.calls)

    def add_calls(self, rank: int, calls: Any) -> None:
        if self.counted is None or type(calls) is not dict:
            return
        for name, count in calls.items():
            if name in self.counted and type(count) is int:
                self.counted[name] += [rank] * max(0, min(count, 10_000))

    def _count(self, module: Any) -> None:
        """In a rank's process: count the calls of the names ``counting`` was given."""
        import functools

        where = vars(module)
        for name in self.counted or ():
            fn = where.get(name)
            if not callable(fn):
                continue

            def counted(*args: Any, _name: str = name, _fn: Any = fn, **kwargs: Any) -> Any:
                self.calls[_name] = self.calls.get(_name, 0) + 1
                return _fn(*args, **kwargs)

            where[name] = functools.wraps(fn)(counted)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.ready:
            raise RuntimeError(f"exercise {self.exercise}'s function runs in the ranks' "
                               "processes only, where its check runs its ranks apart")
        with self.importing:
            if self.loaded is None:
                self._import()
        return self.loaded(*args, **kwargs)

    def _import(self) -> None:
        """In a rank's process, at the first call of the learner's function: import the
        file. A rank that only runs the check's side (a reference worker, server or stage)
        never calls it, so no code of the submission ever runs in its process: what it
        reports (its results, its compute regions) is the check's own."""
        with collectives_blocked_at_import(self.exercise):
            module = _module(self.file, self.source)
        self.loaded = _attribute(module, self.function)
        self._count(module)

    def prepare(self, rank: int) -> None:
        """In rank ``rank``'s process: cut the process off; the file is imported at the
        rank's first call of the function (``_import``)."""
        from mpgpu_edu.grading.checks import _support

        _support.SEED_SOURCE = None  # the pipe to the grader is not this process's
        problems = cut_off([self.workdir, "/tmp", "/dev/shm"])
        if problems:
            raise RuntimeError("the grader could not cut this rank's process off from the "
                               "others (" + "; ".join(problems) + "): ask the instructor "
                               "to grade where user namespaces are allowed")
        problems = _sealed()  # the collectives blocked for this case among them (1.x, 2.x)
        if problems:
            raise RuntimeError("the grader could not put the package's own code out of this "
                               "rank's reach (" + "; ".join(problems[:3]) + ")")
        from mpgpu_edu.grading.checks._blocking import package_bindings

        self.baseline = package_bindings()  # the blocks of the case included
        self.ready = True


def _load(file: str, function: str) -> Any:
    """The module ``file``'s attribute ``function``."""
    return _attribute(_module(file), function)


def _module(file: str, source: str | None = None) -> Any:
    """The module ``file`` (or, given ``source``, that text under the file's name)."""
    name = Path(file).stem
    if name in sys.modules:  # never shadow a module already loaded (torch, the checks...)
        name = f"_checked_{name}"
    if source is not None:
        import linecache
        import types

        module = types.ModuleType(name)
        module.__file__ = file
        linecache.cache[file] = (len(source), None, source.splitlines(True), file)
        sys.modules[name] = module
        exec(compile(source, file, "exec"), module.__dict__)  # noqa: S102 - the rank's own
    else:
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def _attribute(module: Any, function: str) -> Any:
    target: Any = module
    for part in function.split("."):
        if not hasattr(target, part):
            raise AttributeError(f"the file has no function {function} (was it renamed or "
                                 "deleted? `mpgpu-edu reset ID` restores the stub)")
        target = getattr(target, part)
    return target


def _import_message(exc: BaseException, request: dict) -> str:
    shown = request["display_file"]
    if isinstance(exc, CaseTimeout):
        return f"importing {shown} did not finish in time (a loop at the top level?)"
    if isinstance(exc, SyntaxError):
        return f"{shown} has a syntax error, line {exc.lineno}: {exc.msg}"
    if isinstance(exc, SystemExit):
        return f"importing {shown} called sys.exit({exc.code!r})"
    return (f"importing {shown} failed: {type(exc).__name__}: {exc}"
            + learner_frames(exc, request["file"], shown))
