"""Faults on the gloo backend: a rank that raises, hangs or dies stops every rank, the launch
says who and why, and no worker process is left behind."""

from __future__ import annotations

import time

import dist_fns
import psutil
import pytest

from mpgpu_edu.comm import LaunchTimeoutError, RankError, launch
from mpgpu_edu.comm.dist import WorkerDiedError
from mpgpu_edu.comm.pool import get_pool, shutdown_pools

pytestmark = pytest.mark.gloo
MP_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def gloo(fn, world_size: int = 2, timeout: float = 30):
    return launch(fn, world_size, backend="gloo", timeout=timeout)


def worker_processes(since: float = 0.0) -> list[psutil.Process]:
    """Descendants of this process started after ``since``, except multiprocessing's own
    helpers (the fork server and the resource tracker: direct children that live as long as
    this process)."""
    me, found = psutil.Process(), []
    for child in me.children(recursive=True):
        try:
            helper = child.ppid() == me.pid and any(h in " ".join(child.cmdline())
                                                    for h in MP_HELPERS)
            if not helper and child.create_time() >= since and child.status() != "zombie":
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def test_exception_in_one_rank_stops_all_and_keeps_its_traceback():
    gloo(dist_fns.whoami)
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        gloo(dist_fns.raise_on_rank_1)
    assert time.monotonic() - start < 10  # rank 0 was blocked forever: it was stopped
    err = info.value
    assert err.rank == 1 and isinstance(err.original, ValueError)
    assert "rank one is broken" in err.rank_traceback
    assert "dist_fns.py" in err.rank_traceback and "pool.py" not in err.rank_traceback
    assert "rank 1 raised ValueError: rank one is broken" in str(err)


def test_exception_in_an_async_job_stops_the_launch():
    with pytest.raises(RankError) as info:
        gloo(dist_fns.raise_in_async_job)
    assert info.value.rank == 0 and "lost on the comm stream" in info.value.rank_traceback


def test_hang_is_stopped_by_the_timeout_naming_who_waits_for_whom():
    gloo(dist_fns.whoami)
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        gloo(dist_fns.hang_on_recv, timeout=3)
    assert time.monotonic() - start < 3 + 5
    message = str(info.value)
    assert "rank 1: recv from rank 0, tag 0, 16 bytes (float32 [4])" in message
    assert "rank 0: finished" in message


def test_a_worker_that_exits_is_reported_as_dead():
    with pytest.raises(WorkerDiedError, match="rank 1's worker process died") as info:
        gloo(dist_fns.exit_rank_1)
    assert info.value.exitcode == 3
    assert isinstance(info.value, RankError)


def test_an_unpicklable_result_is_explained():
    with pytest.raises(RankError, match="cannot be sent back to the launcher"):
        gloo(dist_fns.unpicklable_result)


def test_the_pool_is_replaced_after_a_fault_and_nothing_is_left_behind():
    started = time.time() - 1.0
    old = get_pool(2, "gloo").pids
    with pytest.raises(RankError):
        gloo(dist_fns.raise_on_rank_1)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                   for p in old)
    assert gloo(dist_fns.whoami).results == [(0, 2, "cpu"), (1, 2, "cpu")]
    new = get_pool(2, "gloo").pids
    assert set(new).isdisjoint(old)
    assert {p.pid for p in worker_processes(started)} == set(new)
    shutdown_pools()
    assert worker_processes(started) == []
