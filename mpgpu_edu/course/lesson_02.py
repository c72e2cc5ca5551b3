"""Lesson 02: parameter server."""

from __future__ import annotations

from mpgpu_edu.course._types import CAPSTONE, Lesson, Prediction, ex

EXERCISES = (
    ex('2.1', 'ps_worker_step', "Parameter server: the worker's step", 4,
       ("A worker talks to the server only: its gradient goes up, the new parameters come "
        "down, and it must not go on before they are in.",
        "Two messages, in order: a blocking send of the gradient to `server`, then a "
        "blocking receive into `params` itself (in place), both with tag 0.",
        "comm.send(..., server)\ncomm.recv(..., server)")),
    ex('2.2', 'ps_server_step', "Parameter server: the server's step", 5,
       ("The server receives one gradient from every other rank, and only when all are in "
        "does it average (over the workers: N - 1 of them) and update; then everybody gets "
        "the same new parameters.",
        "List the workers (every rank but comm.rank); receive each one's gradient into a "
        "buffer and add it to a running total; sgd_update with total / number of workers; "
        "then send params to each worker.",
        "workers = [r for r in range(comm.world_size) if r != comm.rank]\n"
        "for w in workers:\n    comm.recv(buffer, w); total += buffer\n"
        "sgd_update(params, ..., lr)\nfor w in workers: comm.send(...)")),
    ex('2.3', 'ps_server_loop', 'Capstone: the server loop, gradients as they arrive', 9,
       ("A step of the loop is exercise 2.2, but the gradients are taken in the order they "
        "arrive (comm.recv_any returns who sent), so a slow worker does not hold up a fast "
        "one. The update still waits until every worker's gradient of this step is in.",
        "Two loops, one inside the other: the outer one over the steps; the inner one "
        "receives until every worker has been heard from this step, asking recv_any only "
        "for the workers still missing (a worker sends once per step) and adding each "
        "gradient to a total. Only after the inner loop: the update, then the parameters "
        "to every worker, every send finished (or waited on) before the next step changes "
        "params.",
        "for _ in range(steps):\n    total, waiting = torch.zeros_like(params), list(workers)\n"
        "    while waiting:\n        src = comm.recv_any(buffer, ...)\n"
        "        ...  # who is still missing? what goes into total?\n"
        "    sgd_update(params, ..., lr)\n"
        "    # send params to every worker (isend + wait on each work, or send)"),
       CAPSTONE),
    ex('2.4', 'ps_sharded_step', 'Capstone: a parameter server sharded over every rank', 10,
       ("Every rank is a worker and the server of shard comm.rank. Two exchanges: gradient "
        "shard k goes to rank k (which averages over all N ranks, itself included, and "
        "updates its shard), then every rank's updated shard goes to everybody. Both "
        "directions are in flight at once, so use isend/irecv.",
        "grad_shards = torch.tensor_split(grad, n), param_shards likewise (views into "
        "params). Round 1: isend grad_shards[k] to each other k, irecv shard comm.rank of "
        "each other rank's gradient; wait for all. Average with your own shard, sgd_update "
        "param_shards[me]. Round 2 (messages between two ranks arrive in order, so the same "
        "tag is fine): isend your shard to each other rank, irecv shard k from rank k "
        "(straight into param_shards[k], a contiguous view, or into a buffer you copy from "
        "after the wait); wait.",
        "works = [comm.isend(grad_shards[k].contiguous(), k) for k in others]\n"
        "works += [comm.irecv(inbox[k], k) for k in others]\n"
        "for w in works: w.wait()\n"
        "sgd_update(param_shards[me], (grad_shards[me] + sum(inbox.values())) / n, lr)\n"
        "# round 2: send param_shards[me] to each k, receive param_shards[k] from k"),
       CAPSTONE),
)

PREDICTIONS = (
    Prediction(
        key="02.eight-vs-four",
        question=("One server, the light model, 8 A100s on NVSwitch. Going from 4 devices "
                  "(3 workers and the server) to 8 (7 workers and the server), one "
                  "synchronous step takes:"),
        choices=("about half as long: 7 workers share the batch instead of 3",
                 "about as long: the compute shrinks, the server's link grows, they cancel",
                 "longer: the server's link grows more than the compute shrinks"),
        answer=2,
        why=("Each worker's share of the FLOPs shrinks like 1 / (N - 1), but its compute time "
             "shrinks less (kernel launches and the elementwise work on the whole parameter "
             "vector do not depend on the batch), while the server's link carries 2 (N - 1) "
             "messages of the whole model every step. For a light model on fast links the "
             "server's link wins: 8 devices are slower than 4."),
    ),
    Prediction(
        key="02.sharded-vs-one",
        question=("Still 8 devices. Take 4 of them as servers, each owning a quarter of the "
                  "parameters, so only 4 workers compute (instead of 7 with one server). "
                  "One step takes:"),
        choices=("less time than with one server, even with fewer workers",
                 "about the same time",
                 "more time: fewer workers compute, so each does more"),
        answer=0,
        why=("With 4 servers each server receives 4 quarter-size gradients, S bytes in all, "
             "against 7 whole gradients (7 S) for the one server, and the 4 servers' links "
             "work at once: each server's receiving time shrinks about 7-fold, which far "
             "outweighs the extra compute of 4 workers instead of 7."),
    ),
    Prediction(
        key="02.ssp-fast-worker",
        question=("A staleness-bounded (SSP) server with bound 1 and three workers, one "
                  "three times as fast as the slowest. What happens to the fast worker's "
                  "gradients when it gets more than one step ahead?"),
        choices=("they are dropped, and it recomputes from fresh parameters",
                 "they are applied, and then the fast worker waits for its parameters until "
                 "the slowest catches up",
                 "they are queued on the server and applied later"),
        answer=1,
        why=("SSP never throws work away: every gradient is applied when it arrives. The "
             "bound acts on the *next* step: the server keeps the fast worker's parameters "
             "back, so it idles, until the slowest worker is close enough again."),
    ),
)

LESSON = Lesson(2, 'parameter server', 'ex02_parameter_server',
                'notebooks/02_parameter_server.ipynb', EXERCISES, PREDICTIONS,
                drives_demos=('2.1', '2.3', '2.4'))
