"""The torch.distributed backend on gloo: real processes, the same programs as the simulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dist_fns
import pytest
import torch

from mpgpu_edu.comm import launch
from mpgpu_edu.comm.dist import NotPicklableError
from mpgpu_edu.comm.pool import get_pool, pickle_job
from mpgpu_edu.run import main as run_main

pytestmark = pytest.mark.gloo
REPO = Path(__file__).resolve().parents[1]


def gloo(fn, world_size: int, *args, **kwargs):
    return launch(fn, world_size, *args, backend="gloo", timeout=30, **kwargs)


def test_ranks_see_their_rank_world_size_and_cpu_device():
    assert gloo(dist_fns.whoami, 2).results == [(0, 2, "cpu"), (1, 2, "cpu")]


@pytest.mark.parametrize("world_size", [2, 3])
def test_ring_shift_moves_data_and_counts_bytes_per_peer(world_size):
    result = gloo(dist_fns.ring_shift, world_size, 250)
    for rank, got in enumerate(result.results):
        assert torch.equal(got, torch.full((250,), float((rank - 1) % world_size)))
    assert result.bytes_sent_per_rank == [1000] * world_size
    assert result.bytes_received_per_rank == [1000] * world_size
    assert result.bytes_per_link() == {(r, (r + 1) % world_size): 1000
                                       for r in range(world_size)}


def test_a_cluster_gives_the_world_size_and_one_rank_works_alone():
    from mpgpu_edu.cluster import Cluster

    assert gloo(dist_fns.whoami, Cluster.preset("2xCPU-gloo")).results[1] == (1, 2, "cpu")
    assert gloo(dist_fns.whoami, 1).results == [(0, 1, "cpu")]


def test_irecv_event_spans_from_post_to_wait():
    result = gloo(dist_fns.late_wait, 2, 0.2)
    assert result.results[1] == 8.0
    recv = result.trace.on(1, "comm", "recv")[0]
    compute = result.trace.on(1, "compute", "backward")[0]
    assert recv.start <= compute.start and recv.end >= compute.end
    assert recv.nbytes == 32 and recv.peer == 0


def test_blocking_send_recv():
    assert gloo(dist_fns.blocking_pair, 2, 100).results == [0.0, sum(range(100))]


def test_gloo_matches_messages_by_tag_not_by_order():
    assert gloo(dist_fns.tags_out_of_order, 2).results[1] == (1.0, 2.0)


def test_sub_group_renumbers_ranks_and_talks_by_global_rank():
    result = gloo(dist_fns.sub_group, 3)
    assert result.results == [(0, 2, 0.0), None, (1, 2, 42.0)]
    assert result.stats[0].sent_to == {2: 4}
    assert result.stats[1].bytes_sent == 0


def test_barrier_on_three_ranks():
    assert gloo(dist_fns.barrier_then_rank, 3).results == [0, 1, 2]


def test_run_async_overlaps_communication_with_compute():
    seconds = 0.4
    result = gloo(dist_fns.overlap, 2, seconds)
    assert result.results == [0.0, 0.0]  # rank 1 received rank 0's zeros
    compute = result.trace.on(1, "compute")[0]
    recv = result.trace.on(1, "comm", "recv")[0]
    assert recv.start < compute.end and compute.start < recv.end  # the two overlap in time
    assert result.trace.makespan < 2 * seconds


def test_measured_trace_stats_logs_memory_and_output(capsys):
    result = gloo(dist_fns.measured, 2)
    trace = result.trace
    assert trace.source == "measured" and trace.n_devices == 2
    for rank in range(2):
        kinds = {e.kind for e in trace.on(rank)}
        assert kinds == {"forward", "send", "recv"}
        assert all(e.start >= 0 and e.duration >= 0 for e in trace.on(rank))
        assert [m.delta for m in trace.memory if m.device == rank] == [1000, -1000]
        assert trace.peak_memory(rank) == 1000
        assert result.logs[rank][0].endswith(f"hello from {rank}")
    assert result.stats[0].sent_to == {1: 100} and result.stats[1].received_from == {0: 100}
    assert trace.bytes_sent() == [100, 100]
    assert result.ledgers[0].peak() == 1000
    out = capsys.readouterr().out
    assert "[rank 0] printed by rank 0" in out and "[rank 1] printed by rank 1" in out


def test_pool_is_kept_between_launches():
    gloo(dist_fns.whoami, 2)
    before = get_pool(2, "gloo").pids
    pids = gloo(dist_fns.pid, 2).results
    assert pids == before  # the same worker processes: no start-up paid again


def test_an_edited_module_is_imported_again(tmp_path, monkeypatch):
    module = tmp_path / "edited_fns.py"
    module.write_text("def value(comm):\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import edited_fns

    assert gloo(edited_fns.value, 2).results == [1, 1]
    module.write_text("def value(comm):\n    return 2\n")
    os.utime(module, (time.time() + 5, time.time() + 5))
    assert gloo(edited_fns.value, 2).results == [2, 2]


def test_a_function_from_the_notebook_is_refused_before_starting():
    def my_fn(comm):
        return comm.rank

    my_fn.__module__, my_fn.__qualname__ = "__main__", "my_fn"
    with pytest.raises(NotPicklableError) as info:
        launch(my_fn, 2, backend="gloo")
    message = str(info.value)
    assert "`my_fn` is defined in the notebook (module __main__)" in message
    assert "exercises/my_code.py" in message and "backend='sim'" in message


def test_a_lambda_or_closure_is_refused_clearly():
    with pytest.raises(NotPicklableError, match="lambda or is defined inside another function"):
        launch(lambda comm: 0, 2, backend="gloo")
    with pytest.raises(NotPicklableError, match="make.<locals>.inner`"):
        def make():
            def inner(comm):
                return 0
            return inner
        pickle_job(make(), (), {})


def test_an_argument_from_the_notebook_is_refused():
    class Config:
        pass

    Config.__module__ = "__main__"
    with pytest.raises(NotPicklableError, match="module __main__"):
        pickle_job(dist_fns.whoami, (Config(),), {})


def test_run_without_torchrun_says_how_to_start_it(monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert run_main(["allreduce"]) == 2
    assert "run me under torchrun, e.g. `torchrun --nproc-per-node 2" in capsys.readouterr().err
    assert run_main(["no_such_entry"]) == 2


@pytest.mark.slow
def test_torchrun_runs_a_registered_entry():
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(torchrun), "--nproc-per-node", "2", "-m", "mpgpu_edu.run",
                           "allreduce", "--numel", "1000", "--backend", "gloo", "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["expected"] == 3.0 and result["bytes_sent"] == 4000
