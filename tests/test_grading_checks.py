"""The checks catch wrong answers by their structure, not only their numbers.

Each test runs one exercise's cases in this process against a plausible wrong answer and
asserts which cases fail and what the learner is told."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mpgpu_edu.collectives import all_gather, all_reduce, all_reduce_ring, reduce_scatter
from mpgpu_edu.grading._outcome import classify
from mpgpu_edu.grading.checks import FEEDBACK, cases_for
from mpgpu_edu.pipeline import Step
from mpgpu_edu.pipeline.executor import message_tag

ROOT = Path(__file__).resolve().parents[1]


def solution(module: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"solution_{module}",
                                                  ROOT / "solutions" / f"{module}.py")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def verdicts(exercise_id: str, impl: Callable[..., Any]) -> dict[str, tuple[str, str]]:
    """{case name: (status, message)} of every case of the exercise."""
    out = {}
    for case in cases_for(exercise_id):
        try:
            case.run(impl)
            out[case.name] = ("passed", "")
        except BaseException as exc:  # noqa: BLE001 - what the runner does too
            out[case.name] = classify(exc, case.timeout_s, 2**30, "", "")
    return out


def failing(results: dict[str, tuple[str, str]]) -> set[str]:
    return {name for name, (status, _) in results.items() if status != "passed"}


# ---- lesson 00: the contract's sign rule and repeated requests -----------------------------

def test_a_parser_of_bare_digits_fails_only_on_signs() -> None:
    from tests.mutants.lesson_00 import visible_rejects_plus

    results = verdicts("0.1", visible_rejects_plus)
    assert failing(results) == {"blanks, signs and leading digits", "hidden: random values"}
    assert "'+2,0'" in results["blanks, signs and leading digits"][1]
    assert all(status == "passed" for status, _ in verdicts(
        "0.1", solution("ex00_devices").visible_devices).values())


def test_device_ids_that_drop_a_repeat_are_told_the_count() -> None:
    from tests.mutants.lesson_00 import device_ids_drop_repeats

    results = verdicts("0.2", device_ids_drop_repeats)
    assert failing(results) == {"logical ids, not physical ones", "hidden: random visible lists"}
    assert "returned 1 id for 2 requested GPUs" in results["logical ids, not physical ones"][1]


# ---- lesson 01: from scratch, right pattern, right speed ----------------------------------

def ring_through_rank_0(comm: Any, tensor: torch.Tensor) -> None:
    solution("ex01_communication").naive_all_reduce(comm, tensor)


def ring_calling_the_package(comm: Any, tensor: torch.Tensor) -> None:
    all_reduce_ring(comm, tensor)


def ring_with_blocking_sends(comm: Any, tensor: torch.Tensor) -> None:
    n = comm.world_size
    for _ in range(2 * (n - 1)):
        comm.send(tensor, (comm.rank + 1) % n)
        comm.recv(tensor, (comm.rank - 1) % n)


def ring_sending_everything(comm: Any, tensor: torch.Tensor) -> None:
    n, total = comm.world_size, tensor.clone()
    buffer = torch.empty_like(tensor)
    current = tensor.clone()
    for _ in range(n - 1):
        work = comm.isend(current, (comm.rank + 1) % n)
        comm.recv(buffer, (comm.rank - 1) % n)
        work.wait()
        total += buffer
        current = buffer.clone()
    tensor.copy_(total)


def ring_one_direction_at_a_time(comm: Any, tensor: torch.Tensor) -> None:
    """Right chunks and message counts, but even ranks send while odd ones wait: slow."""
    n, rank = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    buffer = torch.empty_like(chunks[0])

    def step(out: torch.Tensor, into: torch.Tensor) -> None:
        if rank % 2 == 0:
            comm.send(out, (rank + 1) % n)
            comm.recv(into, (rank - 1) % n)
        else:
            comm.recv(into, (rank - 1) % n)
            comm.send(out, (rank + 1) % n)

    for k in range(n - 1):
        incoming = chunks[(rank - 1 - k) % n]
        step(chunks[(rank - k) % n], buffer[: incoming.numel()])
        incoming.add_(buffer[: incoming.numel()])
    for k in range(n - 1):
        step(chunks[(rank + 1 - k) % n].clone(), chunks[(rank - k) % n])


def test_a_naive_all_reduce_is_not_a_ring() -> None:
    results = verdicts("1.3", ring_through_rank_0)
    assert failing(results) == {"traffic: 2(N-1)/N of the tensor, to the right neighbour",
                                "time: every link busy at once",
                                "runs on meta tensors, as the lesson's figures do",  # traffic
                                "hidden: random sizes and world sizes 1-7"}
    assert "on a ring it sends to its right neighbour" in results[
        "traffic: 2(N-1)/N of the tensor, to the right neighbour"][1]


def test_calling_a_built_in_collective_fails_every_case() -> None:
    results = verdicts("1.3", ring_calling_the_package)
    assert all(status == "failed" for status, _ in results.values())
    assert "it called mpgpu_edu.collectives" in results["sums in place on 4 ranks"][1]
    import mpgpu_edu.collectives as package  # every blocked function is restored afterwards

    assert package.all_reduce_ring is all_reduce_ring
    assert globals()["all_reduce_ring"].__module__ == "mpgpu_edu.collectives.allreduce"


def test_a_ring_that_deadlocks_is_a_failure_with_the_waiting_ranks() -> None:
    status, message = verdicts("1.3", ring_with_blocking_sends)["sums in place on 4 ranks"]
    assert status == "failed" and "Deadlock" in message and "rank" in message


def test_a_ring_that_sends_too_much_fails_on_traffic() -> None:
    results = verdicts("1.3", ring_sending_everything)
    assert results["sums in place on 4 ranks"][0] == "passed"
    assert "traffic: 2(N-1)/N of the tensor, to the right neighbour" in failing(results)


def test_a_ring_that_waits_for_its_neighbours_is_too_slow() -> None:
    results = verdicts("1.3", ring_one_direction_at_a_time)
    assert failing(results) == {"time: every link busy at once"}


def test_a_composed_all_reduce_that_crashes_earns_no_case() -> None:
    """Unpadded chunks crash with mismatched messages; the time case crashes too."""
    def composed_without_padding(comm: Any, tensor: torch.Tensor) -> None:
        ex01 = solution("ex01_communication")
        mine = ex01.ring_reduce_scatter(comm, tensor)
        tensor.copy_(torch.cat(ex01.ring_all_gather(comm, mine)).view_as(tensor))

    results = verdicts("1.7", composed_without_padding)
    assert all(status == "failed" for status, _ in results.values()), results
    assert "MessageMismatchError" in results["time: as fast as the ring"][1]


def test_a_buffer_made_on_the_cpu_fails_only_on_the_figures_meta_tensors() -> None:
    """Right sums, traffic and time on CPU tensors; the lesson's figures run meta tensors."""
    from tests.mutants.lesson_01 import composed_buffer_on_the_cpu

    results = verdicts("1.7", composed_buffer_on_the_cpu)
    assert failing(results) == {"runs on meta tensors, as the lesson's figures do"}, results
    assert "tensor.new_zeros" in results["runs on meta tensors, as the lesson's figures do"][1]


def test_the_padded_byte_count_is_explained_and_one_message_is_singular() -> None:
    from mpgpu_edu.grading.checks.lesson_01.all_reduce import _count

    results = verdicts("1.7", ring_sending_everything)
    message = results["traffic: 2(N-1)/N of the tensor, padded, to the right neighbour"][1]
    assert "padded to N chunks of ceil(numel/N) = ceil(1000/4) = 250 elements" in message
    assert (_count(1, "message"), _count(3, "message")) == ("1 message", "3 messages")


def test_reduce_scatter_must_leave_its_input_alone() -> None:
    right = solution("ex01_communication").ring_reduce_scatter

    def mutating(comm: Any, tensor: torch.Tensor) -> torch.Tensor:
        out = right(comm, tensor)
        tensor.zero_()
        return out

    results = verdicts("1.4", mutating)
    kept = next(c.name for c in cases_for("1.4") if c.name.endswith(FEEDBACK))
    # seen only inside the rank's process: feedback, and nothing else fails
    assert failing(results) == {kept}, results
    assert "input tensor was changed" in results[kept][1]


# ---- lesson 03: overlap must really overlap -------------------------------------------------

def after_backward(comm: Any, model: torch.nn.Module, loss: torch.Tensor) -> None:
    loss.backward()
    for param in model.parameters():
        all_reduce(comm, param.grad, op="mean")


def blocking_hooks(comm: Any, model: torch.nn.Module, loss: torch.Tensor) -> None:
    handles = [p.register_post_accumulate_grad_hook(
        lambda p: all_reduce(comm, p.grad, op="mean")) for p in model.parameters()]
    loss.backward()
    for handle in handles:
        handle.remove()


def hooks_left_behind(comm: Any, model: torch.nn.Module, loss: torch.Tensor) -> None:
    works = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(
            lambda p: works.append(comm.run_async(all_reduce, comm, p.grad, "mean")))
    loss.backward()
    for work in works:
        work.wait()


def test_a_sum_instead_of_a_mean_is_named_as_n_times_too_large() -> None:
    from tests.mutants import lesson_03 as wrong

    results = verdicts("3.1", wrong.average_sums)
    assert "3 times the expected" in results["every replica holds the mean gradient"][1]
    assert "4 times the expected" in results["same gradients as one device on the whole "
                                             "batch"][1]


def _case(exercise_id: str, start: str) -> str:
    return next(c.name for c in cases_for(exercise_id) if c.name.startswith(start))


def test_averaging_after_backward_is_not_overlap() -> None:
    results = verdicts("3.3", after_backward)
    averaged, timeline = _case("3.3", "gradients are averaged"), _case("3.3", "timeline")
    assert failing(results) == {averaged, timeline}
    assert "after backward ends" in results[timeline][1]
    # the points go with what the grader saw: the all-reduces ran in the rank's program
    assert "from its own program" in results[averaged][1], results[averaged][1]


def test_blocking_all_reduce_in_a_hook_is_not_overlap() -> None:
    results = verdicts("3.3", blocking_hooks)
    averaged, timeline = _case("3.3", "gradients are averaged"), _case("3.3", "timeline")
    assert failing(results) == {averaged, timeline}, results
    assert "never run at the same time" in results[timeline][1]
    assert "from its own program" in results[averaged][1], results[averaged][1]


def test_jobs_started_after_backward_in_parameter_order_lose_the_averaging_points() -> None:
    """All-reduces run as comm-stream jobs after backward, one per parameter in
    ``parameters()`` order (a hunt's file: full marks once the timeline earned nothing): the
    jobs' bytes, in the order started, are not the order backward makes the gradients."""
    def jobs_after(comm: Any, model: torch.nn.Module, loss: torch.Tensor) -> None:
        loss.backward()
        for param in model.parameters():
            comm.run_async(all_reduce, comm, param.grad, "mean").wait()

    results = verdicts("3.3", jobs_after)
    averaged = _case("3.3", "gradients are averaged")
    assert results[averaged][0] == "failed", results
    assert "started its all-reduce jobs in an order" in results[averaged][1]


def test_hooks_must_be_removed() -> None:
    results = verdicts("3.3", hooks_left_behind)
    assert failing(results) == {"hooks are removed afterwards"}, results


def test_an_overlap_that_never_waits_is_asked_about_waiting() -> None:
    from tests.mutants import lesson_03 as wrong

    status, message = verdicts("3.3", wrong.overlap_never_waits)[
        _case("3.3", "gradients are averaged")]
    assert status == "failed" and "wait() on each work" in message, message


def test_adam_memory_must_refuse_an_unknown_precision() -> None:
    from tests.mutants import lesson_03 as wrong

    results = verdicts("3.4", wrong.adam_memory_never_refuses)
    assert failing(results) == {"meta device and bad precision"}, results
    assert "adam_memory(model, 'fp8') returned dict" in results[
        "meta device and bad precision"][1]


def test_a_wrapper_that_averages_only_its_first_step_is_told_so() -> None:
    from tests.mutants import lesson_03 as wrong

    status, message = verdicts("3.5", wrong.ddp_only_first_step)[
        "3 ranks from different starts: rank 0's start, then one device's training"]
    assert status == "failed" and "launched 4 all-reduces in 3 steps, 12 expected" in message, \
        message


def test_ddp_wrapper_is_judged_on_its_buckets_and_its_timeline() -> None:
    from tests.mutants import lesson_03 as wrong

    forward = verdicts("3.5", wrong.ddp_forward_buckets)
    case = "buckets: reverse order, one all-reduce each; one broadcast, at construction"
    calls = next(c.name for c in cases_for("3.5") if c.name.startswith("the calls"))
    timeline = _case("3.5", "timeline")
    assert failing(forward) == {case, calls, timeline}, forward  # its messages, both runs
    assert "not those of the contract's collectives" in forward[case][1]
    assert "[23, 40, 8, 48]" in forward[case][1]  # the contract's buckets, from the messages
    assert "[18, 45, 8, 48]" in forward[calls][1]  # the learner's, as its process recorded
    per_parameter = verdicts("3.5", wrong.ddp_broadcasts_per_parameter)
    hidden = "hidden: 2-5 ranks, other layers, bucket caps that split unevenly"
    assert failing(per_parameter) == {case, calls, hidden, timeline}, per_parameter
    assert "broadcast 6 tensor(s)" in per_parameter[calls][1]
    waiting = verdicts("3.5", wrong.ddp_waits_in_hook)
    # the timeline (where the compute falls) earns nothing; the router saw the all-reduces
    # come from the program, not from comm-stream jobs
    assert failing(waiting) == {case, timeline}, waiting
    assert "from its own program" in waiting[case][1]
    assert "never run at the same time" in waiting[timeline][1]


# ---- lessons 04-06: memory, FLOPs and state per rank -------------------------------------

def test_gpipe_is_not_1f1b() -> None:
    gpipe_orders = solution("ex04_pipeline").gpipe_orders
    results = verdicts("4.3", gpipe_orders)
    assert failing(results) == {"memory: stage p holds at most min(P-p, M) microbatches",
                                "the 1F1B order", "hidden: random sizes"}
    assert "dev 0 |" in results["the 1F1B order"][1]  # the grids are shown


def test_zero1_must_shard_the_optimizer_state() -> None:
    sol = solution("ex05_tensor_and_hybrid")

    def replicated_state(comm: Any, params: torch.Tensor, grad: torch.Tensor, state: dict,
                         lr: float = 1e-3) -> None:
        grad = grad.clone()
        all_reduce(comm, grad, op="mean")
        sol.adam_update(params, grad, state, lr)

    results = verdicts("5.2", replicated_state)
    state = "optimizer state per rank is 1/N " + FEEDBACK  # seen only inside the rank
    assert state in failing(results)
    assert results["matches torch.optim.Adam on the mean gradient"][0] == "passed"


def test_column_parallel_must_split_the_work() -> None:
    def everything_everywhere(comm: Any, x: torch.Tensor, weight_shard: torch.Tensor,
                              bias_shard: torch.Tensor | None) -> torch.Tensor:
        weight = torch.cat(all_gather(comm, weight_shard.contiguous()))
        out = x @ weight.T
        if bias_shard is not None:
            out = out + torch.cat(all_gather(comm, bias_shard.contiguous()))
        return out

    results = verdicts("5.1", everything_everywhere)
    flops = next(name for name in results if name.startswith("each rank computes 1/N"))
    assert flops in failing(results)
    # the FLOPs are the submission's own count: shown, worth nothing; the traffic (the
    # whole weight gathered) is what costs this answer its points
    assert next(c for c in cases_for("5.1") if c.name == flops).points == 0
    assert "traffic: an all-gather of the output" in failing(results)
    assert results["the full output on every rank, with and without a bias"][0] == "passed"


def test_zero1_with_a_gradient_sum_fails_on_adams_moments() -> None:
    sol = solution("ex05_tensor_and_hybrid")

    def summed(comm: Any, params: torch.Tensor, grad: torch.Tensor, state: dict,
               lr: float = 1e-3) -> None:
        shard = torch.tensor_split(params, comm.world_size)[comm.rank]
        sol.adam_update(shard, reduce_scatter(comm, grad), state, lr)
        params.copy_(torch.cat(all_gather(comm, shard.clone())))

    results = verdicts("5.2", summed)
    assert results["matches torch.optim.Adam on the mean gradient"][0] == "passed"  # hidden
    status, message = results["Adam's moments are the mean gradient's, shard by shard"]
    assert status == "failed" and "exp_avg" in message


def test_megatron_with_a_second_all_reduce_fails_on_traffic_only() -> None:
    sol = solution("ex05_tensor_and_hybrid")

    def reduces_twice(comm: Any, x: torch.Tensor, w1: torch.Tensor, b1: Any, w2: torch.Tensor,
                      b2: Any) -> torch.Tensor:
        out = sol.megatron_mlp(comm, x, w1, b1, w2, b2)
        again = out.detach().clone()
        all_reduce(comm, again, op="mean")
        return out + (again - out.detach())

    results = verdicts("5.4", reduces_twice)
    assert failing(results) == {
        "traffic: one all-reduce of the output forward, one of x's gradient backward",
        "hidden features not a multiple of N: 7 or 3 on 4 ranks, and 4 on 3 ranks without "
        "biases",
        "hidden: other sizes, world sizes 1-5 and (B, T, d) inputs"}, results
    assert "2 all-reduces' worth" in results[
        "traffic: one all-reduce of the output forward, one of x's gradient backward"][1]


def test_a_parity_rule_deadlocks_on_odd_pairs() -> None:
    def by_parity(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
        if partner == comm.rank:
            return tensor.clone()
        got = torch.empty_like(tensor)
        if comm.rank % 2 == 0:
            comm.send(tensor, partner)
            comm.recv(got, partner)
        else:
            comm.recv(got, partner)
            comm.send(tensor, partner)
        return got

    results = verdicts("6.2", by_parity)
    status, message = results["any pairing, e.g. ranks 1 and 3"]
    assert status == "failed" and "Deadlock" in message
    assert results["two ranks swap"][0] == "passed"


def test_the_longest_waiter_is_named_as_such() -> None:
    from tests.mutants.lesson_06 import straggler_longest_waiter

    results = verdicts("6.4", straggler_longest_waiter)
    status, message = results["not the rank that waits longest"]
    assert status == "failed" and "waited longest" in message
    assert results["4 ranks, rank 3 three times slower"][0] == "failed"


# ---- property cases: hidden, reproducible, with the failing example ------------------------

def test_a_property_failure_names_the_smallest_example_every_time() -> None:
    def wrong_for_long_lists(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
        if len(sizes) >= 7:
            return [list(range(len(sizes)))]
        return solution("ex03_data_parallel").make_buckets(sizes, bucket_bytes)

    first = verdicts("3.2", wrong_for_long_lists)
    again = verdicts("3.2", wrong_for_long_lists)
    assert failing(first) == {"hidden: random sizes"}
    message = first["hidden: random sizes"][1]
    assert message == again["hidden: random sizes"][1]
    assert message.startswith("fails for sizes=[")
    assert message.split("sizes=")[1].split("]")[0].count(",") == 6  # shrunk to 7 sizes


def test_a_stub_is_not_implemented_in_every_case_quickly() -> None:
    def stub(*args: Any) -> None:
        raise NotImplementedError("Exercise 1.3: ring_all_reduce (notebooks/...)")

    results = verdicts("1.3", stub)
    assert {status for status, _ in results.values()} == {"not_implemented"}


def test_an_exception_in_a_rank_is_an_error_pointing_at_the_code() -> None:
    def index_error(comm: Any, tensor: torch.Tensor) -> None:
        [][comm.rank]

    status, message = verdicts("1.2", index_error)["sums in place on 4 ranks"]
    assert status == "error" and "IndexError" in message and "rank" in message


def test_steps_of_the_executor_must_send_to_the_next_stage_only() -> None:
    sol = solution("ex04_pipeline")

    def broadcast_activations(comm: Any, stage: Any, step: Step, n_stages: int,
                              x: Any, in_shape: tuple[int, ...]) -> torch.Tensor:
        y = sol.pipeline_forward_step(comm, stage, step, n_stages, x, in_shape)
        if comm.rank == 0 and n_stages > 2:
            comm.send(y.detach(), 2, tag=1000 + step.microbatch)
        if comm.rank == 2 and step.stage == 2:
            comm.recv(torch.empty(in_shape), 0, tag=1000 + step.microbatch)
        return y

    results = verdicts("4.4", broadcast_activations)
    assert failing(results) == {"traffic: one activation per microbatch, to the next stage, "
                                "tagged message_tag, every message waited"}


def test_a_forward_step_must_let_the_gradient_flow_back() -> None:
    def cuts_the_graph(comm: Any, stage: Any, step: Step, n_stages: int, x: Any,
                       in_shape: tuple[int, ...]) -> torch.Tensor:
        if step.stage > 0:
            x = torch.empty(in_shape)
            comm.recv(x, step.stage - 1, tag=message_tag(step))  # no requires_grad_()
        with comm.compute("forward", step.token):
            y = stage(x)
        if step.stage < n_stages - 1:
            comm.send(y.detach(), step.stage + 1, tag=message_tag(step))
        return y

    results = verdicts("4.4", cuts_the_graph)
    name = ("the output keeps its graph, and backward reaches the received activation (its "
            "gradient goes back) " + FEEDBACK)
    assert failing(results) == {name}
    assert "never reaches the activation received from stage 0" in results[name][1]


def test_a_forward_step_must_tag_its_messages_with_message_tag() -> None:
    """The grader's ``sends`` names a tag that is right for the microbatch but not the
    convention (``m`` instead of ``2 m``): a neighbour using ``message_tag`` would never match."""
    def tags_by_microbatch(comm: Any, stage: Any, step: Step, n_stages: int, x: Any,
                           in_shape: tuple[int, ...]) -> torch.Tensor:
        if step.stage > 0:
            x = torch.empty(in_shape)
            comm.recv(x, step.stage - 1, tag=step.microbatch)
            x.requires_grad_()
        with comm.compute("forward", step.token):
            y = stage(x)
        if step.stage < n_stages - 1:
            comm.send(y.detach(), step.stage + 1, tag=step.microbatch)
        return y

    results = verdicts("4.4", tags_by_microbatch)
    name = ("traffic: one activation per microbatch, to the next stage, tagged message_tag, "
            "every message waited")
    assert failing(results) == {name}
    assert "tagged its activations for microbatches 0..3 [0, 1, 2, 3]" in results[name][1]
    assert "message_tag(step) gives [0, 2, 4, 6]" in results[name][1]


def test_the_package_executor_passes_the_executor_check() -> None:
    from mpgpu_edu.lessons.pipeline import reference_executor

    results = verdicts("4.5", reference_executor)
    assert not failing(results), results


def test_an_executor_that_ignores_the_schedule_holds_too_much() -> None:
    from mpgpu_edu.lessons.pipeline import reference_executor
    from mpgpu_edu.pipeline import gpipe

    def always_gpipe(comm: Any, schedule: Any, *args: Any) -> Any:
        return reference_executor(comm, gpipe(schedule.n_stages, schedule.n_microbatches),
                                  *args)

    results = verdicts("4.5", always_gpipe)
    in_flight = next(c.name for c in cases_for("4.5") if c.name.startswith("in flight"))
    memory = next(c.name for c in cases_for("4.5") if c.name.startswith("memory"))
    assert {in_flight, memory} <= failing(results)
    assert results["GPipe: loss, gradients and parameters after a step equal one device's"][0] \
        == "passed"
    assert "the schedule has [4, 3, 2]" in results[in_flight][1]
    assert "the schedule has 4 in flight there" in results[memory][1]


def test_an_executor_that_never_frees_fails_only_the_memory_cases() -> None:
    from tests.mutants.lesson_04 import executor_never_frees

    results = verdicts("4.5", executor_never_frees)
    memory = next(c.name for c in cases_for("4.5") if c.name.startswith("memory"))
    assert memory.endswith(FEEDBACK)  # what a stage keeps alive is seen only in its process
    assert failing(results) == {memory}
    assert "still keeps microbatch 0's input or output alive, after B(0)" in results[memory][1]


# ---- lesson 02: the server loop takes gradients as they arrive; shards follow tensor_split ----

def test_a_server_loop_in_rank_order_fails_only_the_arrival_order() -> None:
    from tests.mutants.lesson_02 import loop_in_rank_order

    results = verdicts("2.3", loop_in_rank_order)
    order = "a fast worker's gradient is not held behind a slower one's"
    assert failing(results) == {order}
    message = results[order][1]
    assert "from workers [0, 1, 2]" in message and "arrival order: [1, 2, 0]" in message


def test_a_server_loop_that_posts_every_irecv_then_waits_in_rank_order_passes() -> None:
    """Its messages still move as they arrive (the irecvs are all posted): only the order of
    the additions differs, which the contract leaves free."""
    def server_loop(comm: Any, params: torch.Tensor, steps: int, lr: float) -> None:
        workers = [r for r in range(comm.world_size) if r != comm.rank]
        for _ in range(steps):
            inbox = {w: torch.empty_like(params) for w in workers}
            works = [comm.irecv(inbox[w], w) for w in workers]
            for work in works:
                work.wait()
            params.sub_(sum(inbox.values()) / len(workers), alpha=lr)
            for w in workers:
                comm.send(params, w)

    assert failing(verdicts("2.3", server_loop)) == set()


@pytest.mark.parametrize("exercise_id", ["2.1", "2.2"])
def test_a_drawn_zero_gradient_passes_parameters_that_did_not_move(
        exercise_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a class-grading key the hidden examples draw other gradients; one can be zero,
    and then the right step leaves the parameters where they were. A server that never
    updates still fails (its other examples move)."""
    from mpgpu_edu.grading.checks import _support

    monkeypatch.setattr(_support, "SEED_SOURCE", lambda seed: seed + 2)
    assert _support.rank_inputs(2, 1, 0)[1].item() == 0  # the first example: N=2, 1 number
    hidden = "hidden: random sizes and servers"
    module = solution("ex02_parameter_server")
    impl = module.ps_worker_step if exercise_id == "2.1" else module.ps_server_step
    assert verdicts(exercise_id, impl)[hidden] == ("passed", "")

    def server_that_never_updates(comm: Any, params: torch.Tensor, lr: float) -> None:
        buffer = torch.empty_like(params)
        for worker in [r for r in range(comm.world_size) if r != comm.rank]:
            comm.recv(buffer, worker)
        for worker in [r for r in range(comm.world_size) if r != comm.rank]:
            comm.send(params, worker)

    if exercise_id == "2.2":
        assert "never changed" in verdicts("2.2", server_that_never_updates)[hidden][1]


def test_sharded_step_with_other_shard_sizes_fails_on_traffic() -> None:
    from tests.mutants.lesson_02 import sharded_last_takes_the_rest

    results = verdicts("2.4", sharded_last_takes_the_rest)
    assert results["one step, N = 4, 12 parameters"][0] == "passed"  # 12 = 4 x 3: same shards
    assert "rank 0 should send each rank k" in results[
        "shards that differ in size: N = 3, 10 parameters, float32 and float64"][1]
    assert verdicts("2.4", solution("ex02_parameter_server").ps_sharded_step) == {
        name: ("passed", "") for name in results}


def test_values_off_by_a_simple_factor_are_named() -> None:
    import pytest

    from mpgpu_edu.grading.checks import CheckFailure
    from mpgpu_edu.grading.checks._support import expect_close

    want = torch.tensor([0.5, -1.0, 2.0])
    for got, words in ((2 * want, "exactly twice"), (want / 2, "exactly half"),
                       (-want, "sign flipped")):
        with pytest.raises(CheckFailure, match=words):
            expect_close(got, want, "the gradient")
    with pytest.raises(CheckFailure) as plain:
        expect_close(want + torch.tensor([0.0, 0.0, 1.0]), want, "the gradient")
    assert "(" not in str(plain.value)


def test_a_search_over_every_split_runs_out_of_time() -> None:
    """4.1 is right by brute force on small inputs; 96 layers in 8 stages (about 10^10 splits)
    cannot finish, and the grader says so within the case's 10 s. The function comes from a
    module, so the grader runs it in a child process that it stops (a function defined here
    would run in a thread of this process, which nothing can stop)."""
    from mpgpu_edu.grading import check
    from tests.mutants.lesson_04 import search_every_split

    result = check("4.1", search_every_split, figures=False, strict=False, timeout=120)
    assert result.ran_in == "a separate process", result.ran_in
    by_name = {case.name: case for case in result.cases}
    assert by_name["too many or too few stages raise ValueError"].status == "passed"
    deep = next(case for name, case in by_name.items() if name.startswith("96 layers"))
    assert deep.status == "timeout" and result.points == 3


def test_a_collective_that_does_nothing_on_meta_tensors_fails_the_meta_case() -> None:
    """The figures' meta run must send what a real run sends (the grader's record of its
    messages), not just return without an error."""
    solved = solution("ex01_communication")

    def skips_meta(comm: Any, tensor: torch.Tensor) -> None:
        if not tensor.is_meta:
            solved.ring_all_reduce(comm, tensor)

    results = verdicts("1.3", skips_meta)
    meta = "runs on meta tensors, as the lesson's figures do"
    assert failing(results) == {meta}, results
    assert "on meta tensors" in results[meta][1] and "sent to ranks []" in results[meta][1]

    def reduce_scatter_skipping_meta(comm: Any, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_meta:
            return torch.tensor_split(tensor, comm.world_size)[comm.rank].clone()
        return solved.ring_reduce_scatter(comm, tensor)

    results = verdicts("1.4", reduce_scatter_skipping_meta)
    assert {name for name in failing(results)} == {
        next(c.name for c in cases_for("1.4") if c.name.startswith("traffic"))}, results


def test_fsdp_prefetch_is_judged_on_the_order_of_its_jobs() -> None:
    """Which gathers start ahead is read from the order of the comm-stream jobs the grader
    saw (their bytes name the layer), not from the rank's own record of its calls."""
    from tests.mutants import lesson_08 as wrong

    cases = {c.name: c for c in cases_for("8.2")}
    for start, mutant, words in (
            ("4 ranks, Adam", wrong.fsdp_ignores_prefetch, "contract's (prefetch=True)"),
            ("4 ranks, Adam", wrong.fsdp_prefetches_after_reduce, "first differ at job"),
            ("collectives", wrong.fsdp_prefetches_always, "contract's (prefetch=False)")):
        with pytest.raises(AssertionError, match="comm-stream jobs") as failed:
            cases[_case("8.2", start)].run(mutant)
        assert words in str(failed.value), failed.value
