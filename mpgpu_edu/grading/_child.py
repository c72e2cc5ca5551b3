"""The child side of ``runner``: limit itself, import the learner's file, run the cases.

Imported by the forkserver before it forks children, so torch and the checks are loaded
once; everything the learner's code could disturb happens after the fork.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mpgpu_edu.grading._outcome import CaseTimeout, classify, figure_png, learner_frames
from mpgpu_edu.grading.checks import Case, Evidence, cases_for, lesson_module
from mpgpu_edu.grading.registry import LESSONS

for _lesson in LESSONS:  # preload every lesson's checks in the server
    try:
        lesson_module(_lesson)
    except Exception:  # noqa: BLE001 - that lesson's own checks report the error when run
        pass


GRADING_CHILD_ENV = "MPGPU_EDU_GRADING_CHILD"


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
    """Entry point of a child: run cases ``request["start"]..`` of one exercise."""
    os.environ[GRADING_CHILD_ENV] = "1"  # this process runs checks (the demo-call log skips it)
    try:
        _isolate(request)
        output = CappedOutput(request["output_chars"])
        sys.stdout = sys.stderr = output
        _run(conn, request, output)
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        os._exit(0)  # do not wait for threads the learner's code left running


def _isolate(request: dict) -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.setsid()  # lead a process group: the parent stops it and its children at once
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.chdir(request["workdir"])  # a scratch folder: whatever the code writes lands there
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(Path(request["file"]).parent))  # the file's own neighbours
    os.environ["MPLBACKEND"] = "Agg"
    torch.set_num_threads(1)
    _limit_memory(request["memory_bytes"])
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, _on_alarm)


def _limit_memory(extra_bytes: int) -> None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return
    size = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                size = int(line.split()[1]) * 1024
    limit = size + extra_bytes
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _on_alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout()


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """A soft timeout (SIGALRM); where there is none, the parent's hard timeout remains."""
    if not hasattr(signal, "setitimer"):
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _run(conn: Any, request: dict, output: CappedOutput) -> None:
    started = time.monotonic()
    cases = cases_for(request["exercise"])
    conn.send({"type": "cases", "cases": [{"name": c.name, "points": c.points,
                                           "hidden": c.hidden} for c in cases]})
    conn.send({"type": "import"})
    try:
        with _alarm(min(30.0, request["budget_s"])):
            impl = _load(request["file"], request["function"])
    except BaseException as exc:  # noqa: BLE001 - anything the file does on import
        status = "timeout" if isinstance(exc, CaseTimeout) else "error"
        conn.send({"type": "import_error", "status": status,
                   "message": _import_message(exc, request)})
        return
    figure_sent = False
    for index in range(request["start"], len(cases)):
        case = cases[index]
        left = request["budget_s"] - (time.monotonic() - started)
        if left <= 0:
            break
        soft = min(case.timeout_s, request["case_timeout_s"] or case.timeout_s, left)
        conn.send({"type": "start", "index": index, "timeout_s": soft})
        result, evidence = _run_case(case, impl, soft, output, request)
        conn.send(dict(result, type="result", index=index))
        if request["figures"] and not figure_sent and evidence is not None and evidence.traces:
            png = figure_png(evidence)
            if png:
                conn.send({"type": "figure", "png": png})
                figure_sent = True
        if result["status"] == "timeout":
            break  # threads may still be running: continue in a fresh process
    conn.send({"type": "done"})


def _load(file: str, function: str) -> Any:
    name = Path(file).stem
    if name in sys.modules:  # never shadow a module already loaded (torch, the checks...)
        name = f"_checked_{name}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
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


def _run_case(case: Case, impl: Any, soft: float, output: CappedOutput,
              request: dict) -> tuple[dict, Evidence | None]:
    started = time.monotonic()
    evidence: Evidence | None = None
    try:
        with _alarm(soft):
            evidence = case.run(impl)
        status, message = "passed", ""
    except BaseException as exc:  # noqa: BLE001 - classified for the report
        evidence = getattr(exc, "evidence", None)
        status, message = classify(exc, soft, request["memory_bytes"], request["file"],
                                   request["display_file"])
    text = evidence.text if isinstance(evidence, Evidence) else ""
    result = {"name": case.name, "max_points": case.points, "status": status,
              "message": message, "hidden": case.hidden, "output": output.take(),
              "seconds": round(time.monotonic() - started, 3), "text": text}
    return result, evidence if isinstance(evidence, Evidence) else None
