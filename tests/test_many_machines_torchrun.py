"""A real two-"node" torchrun on localhost: two launchers, gloo, every rank where it belongs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from mpgpu_edu.lessons.many_machines import torchrun_command, torchrun_table, two_node_torchrun
from mpgpu_edu.runtime.torchrun import (REPORT_PREFIX, RankReport, TorchrunResult, check_reports,
                                        launch_nodes, read_reports)


def workers_alive() -> int:
    count = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        # a worker, not its launcher (whose command line names torch.distributed.run)
        count += (b"-m mpgpu_edu.lessons.many_machines" in text
                  and b"torch.distributed.run" not in text)
    return count


def test_the_launch_command_is_torchruns() -> None:
    assert torchrun_command(1, 2, 2, 29500)[1:] == [
        "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1",
        "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", "29500",
        "-m", "mpgpu_edu.lessons.many_machines"]


def report(node: int, local: int, rank: int, total: float = 10.0) -> RankReport:
    return RankReport(node, local, rank, 4, 2, "0,1", total, 1)


def test_reports_are_read_even_when_two_ranks_ran_them_together() -> None:
    a, b = report(0, 0, 0), report(0, 1, 1)
    line = lambda r: REPORT_PREFIX + json.dumps(r.__dict__)  # noqa: E731
    # two workers of one launcher share its stdout: text, text, newline, newline
    outputs = ["torchrun noise\n" + line(a) + line(b) + "\n\n", line(report(1, 0, 2)) + "\n"]
    assert read_reports(outputs) == [a, b, report(1, 0, 2)]


def test_check_reports_rejects_misplaced_ranks_and_wrong_sums() -> None:
    good = [report(k, j, 2 * k + j) for k in range(2) for j in range(2)]
    assert check_reports(TorchrunResult(good, [], 0.0), 2) == []
    swapped = [report(0, 0, 0), report(0, 1, 2), report(1, 0, 1), report(1, 1, 3)]
    assert len(check_reports(TorchrunResult(swapped, [], 0.0), 2)) == 2
    wrong_sum = good[:3] + [report(1, 1, 3, 4.0)]
    assert check_reports(TorchrunResult(wrong_sum, [], 0.0), 2) == ["rank 3 got 4, not 10"]


@pytest.mark.gloo
def test_two_launchers_make_one_job() -> None:
    result = two_node_torchrun(nproc_per_node=2, visible=("0,1", "2,3"), timeout=120)
    assert check_reports(result, 2) == []
    assert [(r.node, r.local_rank, r.rank) for r in result.reports] == [
        (0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)]
    assert [r.visible for r in result.reports] == ["0,1", "0,1", "2,3", "2,3"]
    assert all(r.world_size == 4 and r.all_reduce == 10 for r in result.reports)
    assert len({r.pid for r in result.reports}) == 4
    assert "global rank" in torchrun_table(result)


@pytest.mark.gloo
def test_a_timeout_stops_both_launchers_and_their_workers() -> None:
    before = workers_alive()
    with pytest.raises(RuntimeError, match="did not finish within"):
        two_node_torchrun(nproc_per_node=2, timeout=1.0)
    deadline = time.monotonic() + 10.0  # killed at once; on a loaded machine, gone a bit later
    while workers_alive() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert workers_alive() <= before


@pytest.mark.gloo
def test_a_timeout_kills_workers_that_torchrun_started_in_sessions_of_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torchrun starts each worker with start_new_session: killing a launcher's process group
    # alone leaves them running. These workers sleep, so all four are up when time runs out.
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("SLEEPER_MARKS", str(marks))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(Path(__file__).parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    with pytest.raises(RuntimeError, match="did not finish within"):
        launch_nodes("torchrun_sleeper", nproc_per_node=2, nnodes=2, timeout=15.0)
    pids = sorted(int(p.name) for p in marks.iterdir())
    assert len(pids) == 4, "the workers did not all start within 15 s: nothing was tested"
    deadline = time.monotonic() + 10.0
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
