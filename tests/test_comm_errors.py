"""A stopped launch's errors carry what each rank waited in as data (``pending``, ``finished``),
on the simulator and on gloo, so that a figure or a grader never parses the message."""

from __future__ import annotations

import pickle

import pytest

import mpgpu_edu as mp
from mpgpu_edu.comm.errors import DeadlockError, LaunchTimeoutError, Pending
from mpgpu_edu.lessons import choosing_and_debugging as cd


def test_a_simulated_deadlock_names_each_ranks_send() -> None:
    with pytest.raises(DeadlockError) as caught:
        mp.launch(cd.both_send_first, 2)
    got = sorted((p.rank, p.op, p.peer, p.tag, p.stream) for p in caught.value.pending)
    assert got == [(0, "send", 1, 0, False), (1, "send", 0, 0, False)]
    assert caught.value.finished == ()
    assert all(p.text in str(caught.value) for p in caught.value.pending)


def test_pending_survives_a_board_line_and_pickling() -> None:
    pending = Pending(3, "recv", "recv from rank 1, tag 7, 16 bytes | odd text", 1, 7, True)
    assert Pending.from_line(3, pending.to_line(), stream=True) == pending
    assert Pending.from_line(2, "waiting for a job on its comm stream").op == "other"
    error = LaunchTimeoutError("stopped", [pending], [0, 2])
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), again.pending, again.finished) == (
        LaunchTimeoutError, "stopped", (pending,), (0, 2))
    assert isinstance(again, TimeoutError)


@pytest.mark.gloo
def test_a_gloo_timeout_names_the_receive_and_the_finished_rank() -> None:
    with pytest.raises(LaunchTimeoutError) as caught:
        mp.launch(cd.forgot_to_send, 2, backend="gloo", timeout=3)
    assert [(p.rank, p.op, p.peer, p.tag) for p in caught.value.pending] == [(0, "recv", 1, 0)]
    assert caught.value.finished == (1,)
    figure = cd.plot_wait_for(caught.value)
    assert "finished" in figure.axes[0].get_title(loc="left")
