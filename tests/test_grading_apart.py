"""Class grading runs the collectives of lesson 01 with every rank in a process of its own
(``RANKS_APART``, ``comm.apart``, ``compute.InRanks``): a rank holds only its own input, its
process is cut off from the others (``runtime.isolate``), and the record of its messages is
kept where no code of the submission runs. Each cheat below scores full marks where the
ranks are threads of one process (a learner's own ``check``, which need not resist its own
learner), and nothing on what it cheats on in class grading."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpgpu_edu.grading import check
from mpgpu_edu.grading.checks import lesson_module
from mpgpu_edu.grading.runner import run_exercise

ROOT = Path(__file__).resolve().parents[1]
SOLVED = (ROOT / "solutions" / "ex01_communication.py").read_text()


def _with_ring(body: str) -> str:
    """The solved file, with 1.3's ring replaced by ``body`` (indented code)."""
    start = SOLVED.index("    ### BEGIN SOLUTION 1.3")
    end = SOLVED.index("    ### END SOLUTION", start) + len("    ### END SOLUTION")
    return SOLVED[:start] + body + SOLVED[end:]


_SHOW = """    chunks = list(torch.tensor_split(tensor.view(-1), n))
    right, left = (rank + 1) % n, (rank - 1) % n
    for k in range(2 * (n - 1)):  # ring-shaped messages of the right sizes, for show
        out = chunks[(rank - 1 - k) % n].new_zeros(chunks[(rank - 1 - k) % n].shape)
        into = chunks[(rank - 2 - k) % n].new_zeros(chunks[(rank - 2 - k) % n].shape)
        work = comm.isend(out, right)
        comm.recv(into, left)
        work.wait()
"""

# Each computes the sum from what it should not know, and sends messages only for show.
CHEATS = {
    "the other ranks' inputs, read from the caller's frame": """    import sys
    n, rank = comm.world_size, comm.rank
    frame, inputs = sys._getframe(1), None
    while frame is not None and inputs is None:
        found = frame.f_locals.get("inputs")
        if isinstance(found, list) and len(found) == n:
            inputs = found
        frame = frame.f_back
""" + _SHOW + """    if inputs is not None and not tensor.is_meta:
        tensor.copy_(sum(t.reshape(tensor.shape).to(tensor.dtype) for t in inputs))
""",
    "the inputs made again from the check's own seeds": """\
    from mpgpu_edu.grading.checks._support import rank_inputs
    n, rank = comm.world_size, comm.rank
    mine, total = tensor.reshape(-1).clone(), None
    for seed in range(0 if tensor.is_meta else 8):  # the check's seeds are small
        made = rank_inputs(n, mine.numel(), seed)
        if mine.dtype == torch.float64:
            made = [t.double() + (r + 1) / 7 for r, t in enumerate(made)]
        if torch.equal(made[rank].to(mine.dtype), mine):
            total = sum(made).to(mine.dtype).reshape(tensor.shape)
            break
""" + _SHOW + """    if total is not None:
        tensor.copy_(total)
""",
    "the inputs passed round in files": """    import os, time
    n, rank = comm.world_size, comm.rank
    folders = ["/tmp", "/dev/shm", os.getcwd()]
    if not tensor.is_meta:
        for folder in folders:
            torch.save(tensor.clone(), os.path.join(folder, f"cheat-{n}-{rank}.pt"))
""" + _SHOW + """    if not tensor.is_meta:
        total = tensor.clone()
        for other in range(n):
            if other != rank:
                for folder in folders:
                    path = os.path.join(folder, f"cheat-{n}-{other}.pt")
                    if os.path.exists(path):
                        total += torch.load(path)
                        break
        tensor.copy_(total)
""",
}


DDP_CHEAT = """
def average_gradients(comm, model):
    \"\"\"Every rank's gradient computed here, from every rank's slice of the batch found in
    the caller's frame: the mean, without one message.\"\"\"
    import sys
    import torch
    frame, shards = sys._getframe(1), None
    while frame is not None and shards is None:
        found = frame.f_locals.get("shards")
        if isinstance(found, list) and len(found) == 2:
            shards = found
        frame = frame.f_back
    grads = []
    for xs, ys in zip(*shards):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for p, *mine in zip(model.parameters(), *grads):
        p.grad = torch.stack(mine).mean(0)
"""


def test_a_rank_cannot_average_gradients_from_slices_it_was_not_given(tmp_path: Path
                                                                      ) -> None:
    """3.1: every rank holds only its own slice of the batch (and the data are drawn with the
    grader's secret), so the mean gradient needs the other ranks' messages."""
    solved = (ROOT / "solutions" / "ex03_data_parallel.py").read_text()
    learner = tmp_path / "ex03_data_parallel.py"
    learner.write_text(solved + DDP_CHEAT)
    own = check("3.1", impl=str(tmp_path), figures=False)
    assert own.points == own.max_points, str(own)  # the cheat works among threads
    graded = run_exercise("3.1", learner, judge_here=True)
    # the traffic case only caps what a rank sends: sending nothing passes it
    assert graded.points <= 1, str(graded)


def test_lesson_01_runs_its_collectives_apart() -> None:
    assert set(lesson_module(1).RANKS_APART) == {"1.2", "1.3", "1.4", "1.5", "1.6", "1.7"}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_cheat_that_works_among_threads_scores_nothing_apart(name: str, tmp_path: Path
                                                               ) -> None:
    learner = tmp_path / "ex01_communication.py"
    learner.write_text(_with_ring(CHEATS[name]))
    own = check("1.3", impl=str(tmp_path), figures=False)
    assert own.points == own.max_points, str(own)  # the cheat works among threads
    graded = run_exercise("1.3", learner, judge_here=True)
    # only "runs on meta tensors" is left: the cheat's messages do run on meta tensors
    assert graded.points <= 1, str(graded)


@pytest.mark.parametrize("exercise_id, filename", [
    ("1.4", "ex01_communication.py"),  # what the rank learns comes back in its result
    ("1.7", "ex01_communication.py"),  # calls of the learner's 1.4 and 1.5, counted apart
    ("2.3", "ex02_parameter_server.py"),  # what the server's parameters held, collected
    ("3.5", "ex03_data_parallel.py"),  # the calls of the collectives, recorded apart
    ("6.3", "ex06_choosing.py")])
def test_the_solution_keeps_full_marks_apart(exercise_id: str, filename: str) -> None:
    assert exercise_id in lesson_module(int(exercise_id.split(".")[0])).RANKS_APART
    graded = run_exercise(exercise_id, ROOT / "solutions" / filename, judge_here=True)
    assert graded.points == graded.max_points, str(graded)


_PROBE = """    import os
    n, rank = comm.world_size, comm.rank
    seen = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            seen.append(os.readlink(f"/proc/self/fd/{fd}").split(":")[0])
        except OSError:
            pass
    pids = sorted(d for d in os.listdir("/proc") if d.isdigit())
    writes = []
    for path in ("made-by-a-rank.txt", "/dev/made-by-a-rank", "/tmp/made-by-a-rank"):
        try:
            open(path, "w").close()
            writes.append("written")
        except OSError as exc:
            import errno
            writes.append(errno.errorcode[exc.errno])
    import fcntl
    locks = []
    with open(os.__file__, "rb") as shared:  # a file every process can open
        for lock in (lambda: fcntl.lockf(shared, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 2**40),
                     lambda: fcntl.flock(shared, fcntl.LOCK_SH | fcntl.LOCK_NB)):
            try:
                lock()
                locks.append("locked")
            except OSError as exc:
                import errno
                locks.append(errno.errorcode[exc.errno])
    raise ValueError(f"PROBE sockets={seen.count('socket')} pids={pids} "
                     f"parent={os.getppid()} tmp={sorted(os.listdir('/tmp'))} "
                     f"cwd={sorted(os.listdir('.'))} writes={writes} locks={locks} "
                     f"sys={os.listdir('/sys')}")
"""


def test_a_rank_process_holds_only_its_own_pipes_and_cannot_read_its_launcher(
        tmp_path: Path) -> None:
    """A rank's process keeps no descriptor of the child's but its own two pipes (not the
    child's pipe to the grader), sees no other process (its own PID namespace: none to read
    the memory of, or to signal), and sees empty /tmp and scratch folders, and no folder it
    can write to (/dev included), an empty /sys, and may lock no file (a lock on a shared
    read-only file carried a second hunt's inputs from rank to rank)."""
    learner = tmp_path / "ex01_communication.py"
    learner.write_text(_with_ring(_PROBE))
    graded = run_exercise("1.3", learner, judge_here=True)
    text = str(graded) + "".join(str(getattr(c, "message", "")) for c in graded.cases)
    assert ("PROBE sockets=2 pids=['1'] parent=0 tmp=[] cwd=[] "
            "writes=['EROFS', 'EROFS', 'EROFS'] locks=['EPERM', 'EPERM'] sys=[]") in text, text


_SECRET_HUNT = """    import re
    from mpgpu_edu.grading.checks import _support
    key = "SECRET_HEX"  # the two halves apart: the whole key is made by nothing here
    head, tail = bytes.fromhex(key[:32]), bytes.fromhex(key[32:])
    found = ["_support.SECRET"] if _support.SECRET else []
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if "r" not in perms or line.rstrip().endswith(("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                data = mem.read(end - start)
                at = data.find(head)
                while at >= 0:
                    if data[at + 16:at + 32] == tail:
                        found.append(line.split()[-1] if len(line.split()) > 5 else span)
                        break
                    at = data.find(head, at + 1)
            except (OSError, ValueError, OverflowError):
                pass
    raise ValueError(f"HUNT found={found}")
"""


def test_no_rank_finds_the_grader_s_secret(tmp_path: Path) -> None:
    """The key of the ranks' inputs never leaves the grader: the child asks it for each seed
    it needs. So the key's bytes are nowhere in a rank's memory, freed memory included (read
    here through /proc/self/mem, which the rank's new /proc shows where the class-grading
    sandbox does not hide it)."""
    from mpgpu_edu.grading.checks import _support

    saved = _support.SECRET
    try:
        _support.grading_secret()
        learner = tmp_path / "ex01_communication.py"
        learner.write_text(_with_ring(_SECRET_HUNT.replace("SECRET_HEX",
                                                           _support.SECRET.hex())))
        graded = run_exercise("1.3", learner, judge_here=True)
    finally:  # the key stays this test's: later tests draw their inputs without one
        _support.SECRET = saved
    text = "".join(str(getattr(c, "message", "")) for c in graded.cases)
    assert "HUNT found=[]" in text, text


def test_the_secret_keys_every_seed() -> None:
    from mpgpu_edu.grading.checks import _support

    saved = _support.SECRET
    try:
        _support.SECRET = bytearray()
        assert _support.secret_seed(7) == 7  # a learner's own check: the seeds as they are
        _support.SECRET = bytearray(b"k" * 32)
        one = _support.secret_seed(7)
        _support.SECRET = bytearray(b"j" * 32)
        assert one != _support.secret_seed(7) and 0 <= one < 2**63
    finally:
        _support.SECRET = saved


class _NoFile:
    """What ``compute.InRanks`` is to ``run_spmd``, for a program that needs no file."""

    jobs_in_order = False

    def prepare(self, rank: int) -> None:
        pass

    def calls_here(self) -> dict:
        return {}

    def add_calls(self, rank: int, calls: dict) -> None:
        pass


def test_results_that_ignore_the_messages_content_fail_the_case(monkeypatch) -> None:
    """However a rank learnt the other ranks' data (a channel no sandbox closes), results
    computed from it, beside messages sent for show, stay the same when the grader changes
    the messages in flight; the grader's replay then fails the case. Results computed from
    the messages change."""
    import torch

    from mpgpu_edu.collectives import all_reduce_ring
    from mpgpu_edu.grading.checks import _support
    from mpgpu_edu.grading.checks._clock import RecordError, resolve

    monkeypatch.setattr(_support, "APART", _NoFile())
    inputs = [torch.arange(8.0) * (r + 1) for r in range(4)]

    def known(comm):  # every rank knows every input: the sum, and a ring of zeros for show
        t = inputs[comm.rank].clone()
        all_reduce_ring(comm, torch.zeros_like(t))
        t.copy_(sum(inputs))
        return t

    def honest(comm):
        t = inputs[comm.rank].clone()
        all_reduce_ring(comm, t)
        return t

    shown = _support.run_spmd(known, 4)
    assert shown.blind is True
    with pytest.raises(RecordError, match="not computed from what the messages carry"):
        resolve(_support.launch_facts(shown))
    real = _support.run_spmd(honest, 4)
    assert real.blind is False
    assert torch.equal(resolve(_support.launch_facts(real))["results"][0], sum(inputs))


def test_a_rank_that_runs_only_the_checks_side_never_imports_the_file(tmp_path: Path) -> None:
    """The learner's file is imported in a rank's process at that rank's first call of the
    function: a rank running only the check's side (here rank 1) never runs its code."""
    from mpgpu_edu.comm.apart import run_apart
    from mpgpu_edu.grading.compute import InRanks

    file = tmp_path / "ex02_parameter_server.py"
    file.write_text("import builtins\nbuiltins.IMPORTED_HERE = True\n\n"
                    "def worker_step(comm, params, grad, server):\n    return comm.rank\n")
    impl = InRanks({"file": str(file), "function": "worker_step", "exercise": "2.1",
                    "workdir": str(tmp_path)})

    def program(comm: object) -> list:
        import builtins
        called = impl(comm, None, None, 1) if comm.rank == 0 else None
        return [called, getattr(builtins, "IMPORTED_HERE", False)]

    result = run_apart(program, 2, prepare=impl.prepare)
    assert result.results == [[0, True], [None, False]]


def test_a_ring_run_on_a_real_copy_of_a_meta_tensor_loses_the_meta_point(tmp_path: Path
                                                                           ) -> None:
    """The figures' meta run must run on the meta tensor: where the ranks run apart, the
    launcher sees whether a message carried data, and a meta run's carry none."""
    start = SOLVED.index("    ### BEGIN SOLUTION 1.3")
    end = SOLVED.index("    ### END SOLUTION", start)
    body = SOLVED[SOLVED.index("\n", start) + 1:end]
    learner = tmp_path / "ex01_communication.py"
    learner.write_text(_with_ring("    if tensor.is_meta:  # a real tensor in its place\n"
                                  "        tensor = torch.zeros(tensor.shape, "
                                  "dtype=tensor.dtype)\n" + body))
    graded = run_exercise("1.3", learner, judge_here=True)
    meta = next(c for c in graded.cases if c.name.startswith("runs on meta tensors"))
    assert meta.points == 0 and "carried data" in meta.message, str(graded)
    assert graded.points == graded.max_points - 1, str(graded)


class _InOrder(_NoFile):
    jobs_in_order = True  # as for 3.3, 3.5 and 8.2 (their lessons' ``JOBS_IN_ORDER``)


def _gated_backward(comm, model, loss):  # noqa: ANN001, ANN202 - 3.3's signature
    """One comm-stream job, started at the first gradient, that waits (on a
    ``threading.Event`` the simulator cannot see) until backward has ended, then averages
    every gradient: the timeline shows its messages from the first gradient on, during
    backward, though they were sent after it."""
    import threading

    from mpgpu_edu.collectives import all_reduce

    gate, works = threading.Event(), []

    def everything() -> None:
        gate.wait()
        for param in model.parameters():
            all_reduce(comm, param.grad, "mean")

    def hook(_param):  # noqa: ANN001, ANN202
        if not works:
            works.append(comm.run_async(everything))

    handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()]
    loss.backward()
    for handle in handles:
        handle.remove()
    gate.set()
    for work in works:
        work.wait()


def test_a_job_that_waits_for_the_end_of_backward_makes_no_overlap_apart(monkeypatch) -> None:
    """Among threads the gated job scores 3.3's timeline; with the ranks apart each job runs
    to its end before ``run_async`` returns (``JOBS_IN_ORDER``), so it waits forever, while
    the solution's timeline passes as before."""
    import contextlib

    from mpgpu_edu.comm import LaunchTimeoutError, apart
    from mpgpu_edu.grading.checks import _support, cases_for
    from tests.test_grading_checks import solution

    assert lesson_module(3).JOBS_IN_ORDER == ("3.3", "3.5")
    assert lesson_module(8).JOBS_IN_ORDER == ("8.2",)
    timeline = next(c for c in cases_for("3.3") if c.name.startswith("timeline"))
    timeline.run(_gated_backward)  # among threads: the overlap it shows is taken as real
    real = apart.run_apart

    def short(fn, cluster, args=(), kwargs=None, timeout=60.0, **rest):  # noqa: ANN001, ANN202
        return real(fn, cluster, args, kwargs, min(timeout, 3.0), **rest)

    monkeypatch.setattr(apart, "run_apart", short)

    @contextlib.contextmanager
    def ranks_apart():  # noqa: ANN202 - the compute half as class grading runs it
        saved, _support.APART = _support.APART, _InOrder()
        try:
            yield
        finally:
            _support.APART = saved

    with pytest.raises(LaunchTimeoutError, match="waiting for comm-stream job 0 to end"):
        timeline.run(_gated_backward, guard=ranks_apart)
    timeline.run(solution("ex03_data_parallel").backward_with_overlap, guard=ranks_apart)
