"""Real processes on gloo: message sizes checked as on the simulator, a killed launcher
leaves nothing behind, and under torchrun the rank that raised is the root cause and a
deadlock ends with the pending messages named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dist_fns
import psutil
import pytest

from mpgpu_edu.comm import MessageMismatchError, launch

pytestmark = pytest.mark.gloo
REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("how", ["larger", "smaller", "dtype", "shape", "irecv-larger",
                                 "any-larger"])
def test_a_receive_into_another_size_fails_as_on_the_simulator(how):
    if not how.startswith("any"):  # the simulator's recv_any waits for a message that fits
        with pytest.raises(MessageMismatchError, match="same shape and dtype"):
            launch(dist_fns.size_mismatch, 2, how)
    with pytest.raises(MessageMismatchError) as gloo:
        launch(dist_fns.size_mismatch, 2, how, backend="gloo", timeout=30)
    message = str(gloo.value)
    assert "rank 0 sends float32 [4] (16 bytes) but rank 1 receives into" in message
    assert "same shape and dtype" in message


@pytest.mark.parametrize("segment_bytes", [None, 8])
def test_the_fast_ring_checks_its_tensors_once_and_names_both(segment_bytes):
    """The fast ring's segments carry no envelope each (``comm.sized_by``): ranks that
    all-reduce tensors of different sizes are still told so, by the one check per call."""
    with pytest.raises(MessageMismatchError) as gloo:
        launch(dist_fns.fast_ring_sizes_differ, 2, segment_bytes, backend="gloo", timeout=30)
    message = str(gloo.value)
    assert "runs this collective on float32 [" in message and "same shape and dtype" in message


def test_a_fast_ring_that_disagrees_after_agreeing_is_still_named():
    """A neighbours block's size-check receive is posted when the last one passed: the
    third call, on tensors of different sizes, meets it and is named as the first would."""
    with pytest.raises(MessageMismatchError) as gloo:
        launch(dist_fns.fast_ring_agree_then_differ, 2, backend="gloo", timeout=30)
    assert "same shape and dtype" in str(gloo.value)


def test_size_check_receives_carry_from_job_to_job_in_a_pool():
    """The receive a block leaves posted lives with the process groups, which a pool's
    ranks keep from job to job: a later job (checks on, off, on again, other sizes) meets it
    and every sum is right."""
    pids = set()
    for numel, checked in ((1000, True), (1000, False), (333, True), (1000, True)):
        run = launch(dist_fns.fast_ring_sums, 2, numel, checked, backend="gloo", timeout=60)
        assert [sums for _, sums in run.results] == [[3.0 * numel] * 3] * 2, (numel, checked)
        pids.update(pid for pid, _ in run.results)
    assert len(pids) == 2  # the same two ranks ran every job


def test_a_fast_ring_on_very_different_sizes_is_named_and_aborts_no_rank():
    """A segment posted before the one envelope arrives never meets a receive of another
    size (``envelope.sized_tag``): gloo, receiving 2 MB into a 2 KB buffer, would abort that
    rank's whole process with "terminate called ... EnforceNotMet" on stderr."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        import dist_fns
        from mpgpu_edu.comm import MessageMismatchError, launch
        for numels in ([1000, 1_000_000], [1_000_000, 1000]):
            try:
                launch(dist_fns.fast_ring_numel, 2, numels, backend="gloo", timeout=30)
            except MessageMismatchError as exc:
                print("named:", exc, flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=150)
    named = [line for line in done.stdout.splitlines() if line.startswith("named:")]
    assert len(named) == 2, done.stdout + done.stderr
    assert all("every rank must pass a tensor of the same shape and dtype" in line
               for line in named)
    assert "terminate called" not in done.stderr and "EnforceNotMet" not in done.stderr


def test_sized_tags_keep_the_callers_tag_and_tell_sizes_apart():
    from mpgpu_edu.comm.base import RESERVED_TAG
    from mpgpu_edu.comm.envelope import SIZE_CODES, sized_tag

    assert sized_tag(7, 2000) != sized_tag(7, 2_000_000)
    assert sized_tag(7, 2000) != sized_tag(8, 2000)
    assert sized_tag(7, 2000) % 2**20 == 7 and sized_tag(7, 2000) < 2**31
    assert sized_tag(7, 2000) == sized_tag(7, 2000 + SIZE_CODES)  # the stated limit
    assert sized_tag(RESERVED_TAG + 3, 2000) == RESERVED_TAG + 3


def test_message_checks_can_be_turned_off_and_then_gloo_does_not_notice(monkeypatch):
    monkeypatch.setenv("MPGPU_EDU_CHECK_MESSAGES", "0")
    launch(dist_fns.size_mismatch, 2, "larger", backend="gloo", timeout=30)  # no error


def _alive(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_killed_launcher_takes_its_workers_and_fork_server_with_it():
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        import dist_fns
        from mpgpu_edu.comm import launch
        print("launching", flush=True)
        launch(dist_fns.deadlock, 2, backend="gloo", timeout=600)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                text=True, cwd=REPO)
    try:
        assert launcher.stdout.readline().strip() == "launching"
        me = psutil.Process(launcher.pid)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the server and both ranks are up
            descendants = me.children(recursive=True)
            if len(descendants) >= 3:
                break
            time.sleep(0.5)
        time.sleep(2.0)  # the ranks are blocked in their receives
        pids = [p.pid for p in me.children(recursive=True)]
        assert len(pids) >= 3, pids
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
        deadline = time.monotonic() + 15
        while _alive(pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(pids) == []
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _torchrun(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)])}
    return subprocess.run([str(torchrun), "--nproc-per-node", "2", "-m", "mpgpu_edu.run",
                           *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_torchrun_names_the_rank_that_raised_as_the_root_cause():
    done = _torchrun("dist_fns:raise_on_rank_1")
    assert done.returncode != 0
    root = done.stderr.split("Root Cause", 1)[1]
    assert "rank      : 1" in root.split("\n-", 1)[0] or "rank: 1" in root
    assert "rank one is broken" in root


@pytest.mark.slow
def test_a_deadlock_under_torchrun_ends_at_the_timeout_naming_the_pending_messages():
    start = time.monotonic()
    done = _torchrun("dist_fns:deadlock", "--timeout", "5")
    assert done.returncode != 0
    assert time.monotonic() - start < 5 + 90  # startup of two ranks under load, then 5 s
    assert "MessageTimeoutError" in done.stderr
    assert "gave up waiting for: recv from rank 1, tag 0, 16 bytes (float32 [4])" in \
        done.stderr or "gave up waiting for: recv from rank 0, tag 0, 16 bytes" in done.stderr
