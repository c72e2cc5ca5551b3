"""A hostile class, graded as an instructor would (``mpgpu-edu grade``, sandboxed): every
cheat scores 0 on what it cheats on, honest learners keep full marks, no file outside the
grader's own output changes, no process of the grading survives, and a killed grader loses
nothing already graded (the next run resumes).

One learner per cheat or sabotage, mostly on exercise 0.1 (``visible_devices``: quick to
check); the Tensor subclass on 1.4 (``ring_reduce_scatter`` returns a tensor).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from mpgpu_edu.cli import main
from mpgpu_edu.grading.progress import function_span
from mpgpu_edu.runtime.sandbox import problem

ROOT = Path(__file__).resolve().parents[1]
WATCHED = [ROOT / "mpgpu_edu" / name for name in  # the files the cheats aim at
           ("grading/checks/lesson_00.py", "grading/session.py", "cluster/visible.py")]
TOKEN = uuid.uuid4().hex[:10]
MARK = "mpgpuhostile"  # the process name every daemon and forked child of a cheat takes
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(problem() is not None, reason=f"no sandbox: {problem()}")]

NAME_ME = f"""
        def _name_me():
            import ctypes
            ctypes.CDLL(None).prctl(15, b"{MARK}", 0, 0, 0)
"""
CHEATS = {  # learner: code put at the top of ex00_devices.py (after the imports)
    "fake_pipe": """
        import os
        from multiprocessing.connection import Connection
        from mpgpu_edu.grading.wire import encode
        class _Pwn:
            def __reduce__(self):
                return (open, ("/tmp/mpgpu-hostile-pwned-TOKEN", "w"))
        for _fd in range(3, 64):
            try:
                _c = Connection(_fd)
                _c.send_bytes(encode({"type": "ended", "index": 0, "status": "passed",
                                      "message": "", "output": "", "seconds": 0.0}))
                _c.send_bytes(__import__("pickle").dumps({"type": "done", "x": _Pwn()}))
            except Exception:
                pass
        os._exit(0)
    """,
    "patch_checks": """
        import mpgpu_edu.grading.checks.lesson_00 as _l
        import mpgpu_edu.cluster.visible as _v
        import mpgpu_edu.grading.session as _s
        _l.parse_visible = _v.parse_visible = lambda value, n: []
        _s.State.judge = lambda *args, **kwargs: None
    """,
    "read_solutions": """
        import pathlib
        import mpgpu_edu
        _source = (pathlib.Path(mpgpu_edu.__file__).parents[1] / "solutions" /
                   "ex00_devices.py").read_text()
    """,
    "edit_checker": """
        import pathlib
        import mpgpu_edu
        _file = pathlib.Path(mpgpu_edu.__file__).parent / "grading" / "checks" / "lesson_00.py"
        _file.write_text("CASES = {}")
    """,
    "killer": """
        import os, signal
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(-1, signal.SIGKILL)
    """,
}
STUB_BODY = "    return []\n"
BODIES = {  # learner: a new body of visible_devices (the rest of the file: the solution)
    "always_equal": """
        class _Yes(list):
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
        return _Yes()
    """,
    "call_reference": """
        from mpgpu_edu.cluster import parse_visible
        return parse_visible(value, n_physical)
    """,
}
SABOTAGE = {  # one learner does all of these at the top of the file, then answers honestly
    "daemon": NAME_ME + """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                _name_me()
                end = time.time() + 120
                while time.time() < end:
                    for _path in ("/tmp/mpgpu-hostile-daemon-TOKEN", "CSV"):
                        try:
                            open(_path, "w").write("owned")
                        except OSError:
                            pass
                    time.sleep(0.2)
            os._exit(0)
    """,
    "tmp_writer": """
        open("/tmp/mpgpu-hostile-tmp-TOKEN", "w").write("x")
        open("/dev/shm/mpgpu-hostile-shm-TOKEN", "w").write("x")
    """,
    "overwrite_others": """
        import pathlib, shutil
        for _learner in pathlib.Path("SUBMISSIONS").iterdir():
            for _file in _learner.glob("*.py"):
                try:
                    _file.write_text("def visible_devices(value, n_physical):\\n    return []\\n")
                except OSError:
                    pass
            shutil.rmtree(_learner, ignore_errors=True)
    """,
    "forkbomb": NAME_ME + """
        import os, time
        for _ in range(400):
            try:
                if os.fork() == 0:
                    _name_me()
                    time.sleep(120)
                    os._exit(0)
            except OSError:
                break
    """,
}


def with_top(text: str, code: str) -> str:
    marker = "# ---- exercises"
    return text.replace(marker, textwrap.dedent(code).strip() + "\n\n\n" + marker, 1)


def with_body(text: str, name: str, body: str) -> str:
    first, last = function_span(text, name)
    lines = text.splitlines(keepends=True)
    head = "".join(lines[first:last]).split('"""')
    keep = '"""'.join(head[:3]) + '"""\n'  # the signature and the docstring
    return ("".join(lines[:first]) + keep + textwrap.indent(textwrap.dedent(body).strip(),
                                                             "    ") + "\n\n\n"
            + "".join(lines[last:]))


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def package_digest() -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in WATCHED}


def grade(folder: Path, out: Path, *ids: str) -> dict[str, dict]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["grade", str(folder), "--csv", str(out), "--ids", *ids,
                     "--timeout", "40", "--memory", "2"]) == 0
    with out.open() as handle:
        return {row["learner"]: row for row in csv.DictReader(handle)}


def liar_on_1_4() -> str:
    """The solution of lesson 01 whose ``ring_reduce_scatter`` returns zeros as a Tensor
    subclass that answers True to allclose, equal and ==."""
    return with_body((ROOT / "solutions" / "ex01_communication.py").read_text(),
                     "ring_reduce_scatter", """
        class _Liar(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                if func in (torch.allclose, torch.equal, torch.Tensor.__eq__):
                    return True
                return super().__torch_function__(func, types, args, kwargs or {})
        chunk = torch.tensor_split(tensor.reshape(-1), comm.world_size)[comm.rank]
        return torch.zeros_like(chunk).as_subclass(_Liar)
    """)


def gone(within_s: float = 1.0) -> list[psutil.Process]:
    """``marked()`` once it is empty, or after ``within_s``."""
    deadline = time.monotonic() + within_s
    while (found := marked()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def run_main(argv: list[str]) -> tuple[int, str]:
    """``mpgpu-edu ARGV`` in this process: its exit code and what it wrote to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def marked() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == MARK:
            found.append(process)
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    subs = tmp_path_factory.mktemp("hostile")
    out = tmp_path_factory.mktemp("out") / "grades.csv"
    solution = (ROOT / "solutions" / "ex00_devices.py").read_text()
    stub = (ROOT / "exercises" / "ex00_devices.py").read_text()

    def learner(name: str, text: str) -> None:
        (subs / name).mkdir()
        (subs / name / "ex00_devices.py").write_text(
            text.replace("TOKEN", TOKEN).replace("SUBMISSIONS", str(subs))
            .replace('"CSV"', repr(str(out))))

    learner("z_honest", solution)
    learner("stub", stub)
    for name, code in CHEATS.items():
        learner(name, with_top(with_body(solution, "visible_devices", STUB_BODY), code))
    for name, body in BODIES.items():
        learner(name, with_body(solution, "visible_devices", body))
    learner("a_saboteur", with_top(solution, "\n".join(textwrap.dedent(code)
                                                       for code in SABOTAGE.values())))
    (subs / "symlinked").mkdir()
    (subs / "symlinked" / "exercises").symlink_to(ROOT / "solutions")
    # Exercise 1.4 for two learners who already have a sandbox (each exercise runs in a
    # child of its own): the honest one's solution, and a Tensor subclass that lies.
    (subs / "z_honest" / "ex01_communication.py").write_text(
        (ROOT / "solutions" / "ex01_communication.py").read_text())
    (subs / "always_equal" / "ex01_communication.py").write_text(liar_on_1_4())
    before = {"subs": digest(subs), "package": package_digest()}
    rows = grade(subs, out, "0.1", "1.4")
    return {"rows": rows, "before": before, "subs": subs, "out": out,
            "marked": [p.pid for p in gone()],
            "after": {"subs": digest(subs), "package": package_digest()},
            "sandboxes": [p.pid for p in psutil.Process().children(recursive=True)
                          if p.name() == "bwrap"]}


@pytest.mark.parametrize("learner", ["stub", *CHEATS, *BODIES, "symlinked"])
def test_each_cheat_scores_zero(graded: dict, learner: str) -> None:
    assert graded["rows"][learner]["0.1"] == "0", graded["rows"][learner]


@pytest.mark.parametrize("learner", ["z_honest", "a_saboteur"])
def test_honest_answers_keep_full_marks_whatever_else_the_file_does(graded: dict,
                                                                    learner: str) -> None:
    assert graded["rows"][learner]["0.1"] == "5", graded["rows"][learner]


def test_no_file_outside_the_output_changes(graded: dict) -> None:
    assert graded["after"] == graded["before"]
    for path in (f"/tmp/mpgpu-hostile-pwned-{TOKEN}", f"/tmp/mpgpu-hostile-daemon-{TOKEN}",
                 f"/tmp/mpgpu-hostile-tmp-{TOKEN}", f"/dev/shm/mpgpu-hostile-shm-{TOKEN}"):
        assert not os.path.exists(path), path
    assert "owned" not in graded["out"].read_text()


def test_no_process_of_the_grading_survives(graded: dict) -> None:
    assert graded["marked"] == []  # daemons, forked children
    assert graded["sandboxes"] == []


def test_a_tensor_subclass_cannot_make_allclose_lie(graded: dict) -> None:
    rows = graded["rows"]  # graded in the class above, beside their answers to 0.1
    assert rows["z_honest"]["1.4"] == "6" and rows["always_equal"]["1.4"] == "0"


def test_a_killed_grader_loses_nothing_and_the_next_run_resumes(tmp_path: Path) -> None:
    subs, out = tmp_path / "subs", tmp_path / "g.csv"
    solution = (ROOT / "solutions" / "ex00_devices.py").read_text()
    for name in ("a", "b"):
        (subs / name).mkdir(parents=True)
        (subs / name / "ex00_devices.py").write_text(solution)
    command = [sys.executable, "-m", "mpgpu_edu", "grade", str(subs), "--csv", str(out),
               "--ids", "0.1", "--html", str(tmp_path / "g.html"),
               "--json-file", str(tmp_path / "g.json")]
    grader = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and grader.poll() is None:
            html, js = tmp_path / "g.html", tmp_path / "g.json"
            # after a learner: the CSV, then the HTML and the JSON are rewritten; kill once
            # all three hold learner a (a kill between two of them left no HTML yet)
            if (out.exists() and len(out.read_text().splitlines()) >= 2 and html.exists()
                    and ">a</td>" in html.read_text() and js.exists()):
                break
            time.sleep(0.1)
        os.killpg(grader.pid, signal.SIGKILL)
    finally:
        grader.wait(30)
    rows = list(csv.reader(out.open()))
    assert rows[0][0] == "learner" and 1 <= len(rows) - 1 <= 2
    assert ">a</td>" in (tmp_path / "g.html").read_text()  # the report so far, whole
    so_far = json.loads((tmp_path / "g.json").read_text())  # and the JSON, whole
    assert "a" in json.dumps(so_far)
    assert all(row[1] == "5" for row in rows[1:])
    assert gone() == []
    # The next runs go through the same command line in this process (no second torch import).
    code, err = run_main(command[3:])
    assert code == 0, err[-2000:]
    if len(rows) - 1 < 2:
        assert f"resuming: {len(rows) - 1} learner(s)" in err
    final = {row["learner"]: row for row in csv.DictReader(out.open())}
    assert sorted(final) == ["a", "b"] and all(r["0.1"] == "5" for r in final.values())
    (subs / "a" / "ex00_devices.py").write_text(
        (ROOT / "exercises" / "ex00_devices.py").read_text())  # a changed submission
    code, err = run_main(command[3:] + ["--fresh"])
    assert code == 0 and "resuming" not in err
    assert {row["learner"]: row["0.1"] for row in csv.DictReader(out.open())} == {
        "a": "0", "b": "5"}


def test_class_grading_refuses_to_run_without_isolation_unless_told(tmp_path: Path,
                                                                    monkeypatch) -> None:
    import mpgpu_edu.runtime.sandbox as sandbox

    (tmp_path / "subs" / "a").mkdir(parents=True)
    (tmp_path / "subs" / "a" / "ex00_devices.py").write_text(
        (ROOT / "exercises" / "ex00_devices.py").read_text())
    monkeypatch.setattr(sandbox, "problem", lambda: "bubblewrap (bwrap) is not installed")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["grade", str(tmp_path / "subs"), "--csv", str(tmp_path / "g.csv"),
                     "--ids", "0.1"])
    assert code == 2 and "--no-isolation" in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1
    assert not (tmp_path / "g.csv").exists()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        assert main(["grade", str(tmp_path / "subs"), "--csv", str(tmp_path / "g.csv"),
                     "--ids", "0.1", "--no-isolation"]) == 0

