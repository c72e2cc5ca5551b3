"""Checks of lesson 02: the parameter server's worker, its server (one step and the whole
loop), and a server sharded over every rank.

*compute* runs the learner's side on the simulator against the reference of the other side
(``steps._reference_worker``, ``steps._reference_server``) and hands over plain facts: each
rank's parameters, its traffic, and where asked the timeline. *judge* rebuilds the expected
values from the same seeds with the grader's own arithmetic: one SGD step on the mean
gradient, or plain training on one device for the cases that train a small model.

Modules: ``steps`` (one step, either side), ``training`` (a small model against one device),
``arrivals`` (2.3's loop against workers of uneven speed), ``sharded`` (2.4).
"""

from __future__ import annotations

from mpgpu_edu.grading.checks import FEEDBACK, Case
from mpgpu_edu.grading.checks._support import expect_waited
from mpgpu_edu.grading.checks.lesson_02.arrivals import (_judge_no_early_send,
                                                         _judge_no_early_update, _judge_uneven,
                                                         _uneven_workers)
from mpgpu_edu.grading.checks.lesson_02.sharded import (_hidden_sharded, _judge_sharded,
                                                        _judge_sharded_grad_kept,
                                                        _judge_sharded_updates,
                                                        _judge_sharded_waits, _run_sharded)
from mpgpu_edu.grading.checks.lesson_02.steps import (_hidden_steps, _run_step,
                                                      _server_one_update,
                                                      _server_step_traffic, _steps,
                                                      _worker_grad_kept, _worker_traffic)
from mpgpu_edu.grading.checks.lesson_02.training import _hidden_training, _training


# Run with every rank in a process of its own in class grading (see lesson 01's checks):
# each rank holds only its own gradient, or its own samples of each step's batch.
RANKS_APART = ("2.1", "2.2", "2.3", "2.4")

REFERENCES = {  # the package's own implementation, out of reach while the learner's runs
    "2.1": ["mpgpu_edu.lessons.parameter_server:reference_worker_step"],
    "2.2": ["mpgpu_edu.ps.sync:server_step",
            "mpgpu_edu.lessons.parameter_server:reference_server_loop",  # one step: steps=1
            "mpgpu_edu.ps.sharded:server_step_sharded"],
    "2.3": ["mpgpu_edu.lessons.parameter_server:reference_server_loop",
            "mpgpu_edu.ps.sync:server_step", "mpgpu_edu.ps.sharded:server_step_sharded"],
    "2.4": ["mpgpu_edu.lessons.parameter_server:reference_sharded_step"],
}

CASES: dict[str, list[Case]] = {
    "2.1": [
        Case("sends the gradient, receives the new parameters, float64 too", 1,
             *_steps("worker", [(3, 2), (3, 1, "float64")])),
        Case("the server need not be the last rank", 1, *_steps("worker", [(4, 0), (2, 1)])),
        Case("traffic: one message each way, with the server only, both waited", 1,
             lambda impl: _run_step(impl, "worker", 4, 100, 3), _worker_traffic),
        Case("the caller's grad unchanged " + FEEDBACK, 0,
             lambda impl: _run_step(impl, "worker", 4, 100, 3), _worker_grad_kept),
        Case("hidden: random sizes and servers", 1, *_hidden_steps("worker"), hidden=True),
    ],
    "2.2": [
        Case("averages the workers' gradients and updates, float64 too", 2,
             *_steps("server", [(4, 3), (3, 2, "float64")])),
        Case("any server rank, N = 2, 3, 5", 1, *_steps("server", [(2, 0), (3, 1), (5, 4)])),
        Case("traffic: (N-1) gradients in, then (N-1) parameter copies out, all waited", 1,
             lambda impl: _run_step(impl, "server", 5, 100, 4, watch=True),
             _server_step_traffic),
        Case("one update, once every gradient is in " + FEEDBACK, 0,
             lambda impl: _run_step(impl, "server", 5, 100, 4, watch=True),
             _server_one_update),
        Case("hidden: random sizes and servers", 1, *_hidden_steps("server"), hidden=True),
    ],
    "2.3": [
        Case("one step: the mean of every worker's gradient, float64 too", 1,
             *_steps("loop", [(4, 3), (3, 2, "float64")])),
        Case("trains a linear model like one device, N = 3", 2,
             *_training("2.3", [(3, "linear", 4)])),
        Case("a fast worker's gradient is not held behind a slower one's", 1,
             _uneven_workers, _judge_uneven),
        Case("no parameters go out before every gradient of the step is in", 2,
             _uneven_workers, _judge_no_early_send),
        Case("no update before every gradient of the step is in " + FEEDBACK, 0,
             _uneven_workers, _judge_no_early_update),
        Case("waits: every isend and irecv is waited on", 1,
             _uneven_workers, lambda facts: expect_waited(facts["works"][-1], "the server")),
        Case("hidden: other world sizes, models and step counts", 2,
             *_hidden_training("2.3"), hidden=True),
    ],
    "2.4": [
        Case("one step, N = 4, 12 parameters", 2,
             lambda impl: _run_sharded(impl, 4, 12), lambda f: _judge_sharded(f, 4, 12)),
        Case("shards that differ in size: N = 3, 10 parameters, float32 and float64", 2,
             lambda impl: [_run_sharded(impl, 3, 10), _run_sharded(impl, 3, 10, dtype="float64")],
             lambda runs: (_judge_sharded(runs[0], 3, 10),
                           _judge_sharded(runs[1], 3, 10, dtype="float64")) and None),
        Case("trains an MLP like one device, N = 4", 2, *_training("2.4", [(4, "mlp", 3)])),
        Case("the step again, every isend and irecv waited on, N = 3, 10 parameters", 1,
             lambda impl: _run_sharded(impl, 3, 10),
             lambda f: _judge_sharded_waits(f, 3, 10)),
        Case("the caller's grad unchanged " + FEEDBACK, 0,
             lambda impl: _run_sharded(impl, 3, 10),
             lambda f: _judge_sharded_grad_kept(f, 3)),
        Case("one update per rank " + FEEDBACK, 0, lambda impl: _run_sharded(impl, 3, 10),
             lambda f: _judge_sharded_updates(f, 3)),
        Case("hidden: other world sizes, models, sizes that do not divide", 3,
             *_hidden_sharded(), hidden=True),
    ],
}
