"""Checks of lesson 06: choosing a strategy that fits, a swap and a halo exchange that cannot
deadlock, and a straggler found from per-rank logs.

Oracles: ``estimate_memory`` against ``Cluster.capacity_bytes`` for the choice; for the
exchanges, the simulator (which detects a deadlock and names who waits for whom) and the
smoothing done on one device; for the straggler,
``lessons.choosing_and_debugging.find_straggler_reference`` on logs the grader generates itself
(other world sizes, other slow ranks, ties, a rank busy between steps).

Modules: ``choice`` (6.1), ``exchanges`` (6.2, 6.3), ``straggler`` (6.4).
"""

from __future__ import annotations

from mpgpu_edu.grading.checks import FEEDBACK, Case
from mpgpu_edu.grading.checks._support import each
from mpgpu_edu.grading.checks.lesson_06.choice import (GPT2_SMALL, LLAMA_7B, LLAMA_13B,
                                                       _choice_case, _choice_example,
                                                       _exact_fit, _random_choices)
from mpgpu_edu.grading.checks.lesson_06.exchanges import (_CHAIN, _TRAFFIC_PARTNERS,
                                                          _judge_no_chain, _judge_smooth_kept,
                                                          _judge_smooth_traffic, _judge_swap,
                                                          _judge_swap_new, _judge_swap_traffic,
                                                          _random_pairings, _random_rings,
                                                          _run_smooth, _run_swap, _smooth_case,
                                                          _swap_case, _swap_dtypes_case)
from mpgpu_edu.grading.checks.lesson_06.straggler import (_find_case, _random_stragglers,
                                                          _straggler)


# Run with every rank in a process of its own in class grading (see lesson 01's checks).
RANKS_APART = ("6.2", "6.3")

REFERENCES = {  # the package's own implementation, out of reach while the learner's runs
    "6.3": ["mpgpu_edu.lessons.choosing_and_debugging:smooth_ring_reference",
            "mpgpu_edu.lessons.choosing_and_debugging:smooth_on_one_device"],
    "6.4": ["mpgpu_edu.lessons.choosing_and_debugging:find_straggler_reference",
            "mpgpu_edu.lessons.choosing_and_debugging:phase_seconds"],
}

CASES: dict[str, list[Case]] = {
    "6.1": [
        _choice_case("one device: single, or none", 1,
                     [_choice_example(GPT2_SMALL, "4xRTX4090-pcie", "0"),
                      _choice_example(LLAMA_7B, "4xRTX4090-pcie", "0"),
                      _exact_fit(GPT2_SMALL, "4xRTX4090-pcie", "0", "single"),
                      _exact_fit(GPT2_SMALL, "4xRTX4090-pcie", "0", "single", spare=-1)]),
        _choice_case("data parallel when a replica fits, even with no byte to spare", 1,
                     [_choice_example(GPT2_SMALL, "8xA100-nvlink"),
                      _choice_example(GPT2_SMALL, "4xRTX4090-pcie"),
                      _exact_fit(GPT2_SMALL, "4xRTX4090-pcie", None, "dp"),
                      _exact_fit(GPT2_SMALL, "4xRTX4090-pcie", None, "dp", spare=-1)]),
        _choice_case("ZeRO when it does not (7B on 8 GPUs)", 1,
                     [_choice_example(LLAMA_7B, "8xA100-nvlink"),
                      _choice_example(LLAMA_7B, "8xRTX4090-pcie"),
                      _choice_example(LLAMA_13B, "8xRTX4090-pcie"),
                      _choice_example(LLAMA_13B, "8xA100-nvlink")]),
        _choice_case("activations, fp32 and the optimizer count too", 1,
                     [_choice_example(LLAMA_7B, "8xA100-nvlink", None, "adam", "mixed",
                                      50 * 2**30),
                      _choice_example(LLAMA_7B, "8xRTX4090-pcie", None, "adam", "fp32", 0),
                      _choice_example(2_000_000_000, "8xRTX4090-pcie", None, "sgd", "mixed"),
                      _choice_example(2_500_000_000, "8xRTX4090-pcie", None, "sgd-momentum",
                                      "mixed"),
                      _choice_example(GPT2_SMALL, "4xRTX4090-pcie", "1,2", "sgd", "fp32", 0)]),
        _choice_case("hidden: random models and clusters", 1, _random_choices(), hidden=True),
    ],
    "6.2": [
        _swap_case("two ranks swap", 1, [[1, 0]]),
        _swap_case("any pairing, e.g. ranks 1 and 3", 1,
                   [[1, 0, 3, 2, 4], [0], [0, 3, 2, 1], [3, 2, 1, 0]]),
        _swap_dtypes_case("any dtype and shape: float64 2-D, bfloat16 3-D, int64", 1),
        Case("traffic: one message to the partner", 1,
             lambda impl: _run_swap(impl, _TRAFFIC_PARTNERS, numel=10), _judge_swap_traffic),
        Case("returns a new tensor, not the one it was given " + FEEDBACK, 0,
             lambda impl: _run_swap(impl, [1, 0, 3, 2, 4]),
             lambda facts: _judge_swap_new(facts, [1, 0, 3, 2, 4])),
        Case("hidden: random pairings", 1, *each(_random_pairings(), _run_swap, _judge_swap),
             hidden=True),
    ],
    "6.3": [
        _smooth_case("4 ranks, blocks of 3, one step", 1, [{"lengths": [3] * 4, "steps": 1}]),
        _smooth_case("odd world sizes, uneven blocks, 0 to 3 steps", 2,
                     [{"lengths": [2, 1, 4], "steps": 3},
                      {"lengths": [3, 1, 2, 5, 1], "steps": 2},
                      {"lengths": [2, 3, 1], "steps": 0}]),
        _smooth_case("two ranks: left and right neighbour are one rank", 2,
                     [{"lengths": [3, 2], "steps": 2}, {"lengths": [1, 4], "steps": 1}]),
        _smooth_case("one rank: the ring closes on itself", 1,
                     [{"lengths": [5], "steps": 2}]),
        _smooth_case("float64 blocks stay float64, halos included", 1,
                     [{"lengths": [3, 1, 4], "steps": 3, "dtype": "float64"},
                      {"lengths": [2, 5], "steps": 2, "dtype": "float64"},
                      {"lengths": [4], "steps": 2, "dtype": "float64"}]),
        Case("traffic: one element to each neighbour per step", 1,
             lambda impl: _run_smooth(impl, [3, 2, 4, 1, 2], 2, with_trace=True),
             lambda facts: _judge_smooth_traffic(facts, [3, 2, 4, 1, 2], 2)),
        Case("returns a new block and leaves the caller's as it was " + FEEDBACK, 0,
             lambda impl: [_run_smooth(impl, [2, 1, 4], 3), _run_smooth(impl, [3, 2], 0)],
             lambda runs: (_judge_smooth_kept(runs[0], [2, 1, 4], 3),
                           _judge_smooth_kept(runs[1], [3, 2], 0)) and None),
        Case("7 ranks: no rank waits for a chain of others", 1,
             lambda impl: _run_smooth(impl, **_CHAIN, with_trace=True), _judge_no_chain),
        _smooth_case("hidden: world sizes 2-7, uneven blocks, 1-3 steps", 1, _random_rings(),
                     hidden=True),
    ],
    "6.4": [
        _find_case("4 ranks, rank 3 three times slower", 1, [_straggler(4, 3, 1)]),
        _find_case("not the rank that waits longest", 2, [_straggler(5, 1, 3),
                                                          _straggler(3, 0, 2)]),
        _find_case("every step counts: the most compute in all, not the slowest step", 1,
                   [_straggler(6, 2, 3, (1.5, 2.5, 4.0)), _straggler(4, 0, 4, (1.2, 3.0)),
                    _straggler(3, 1, 3, (3.0,), spiky=0, spike=5.0),
                    _straggler(5, 3, 4, (2.0,), spiky=1, spike=4.0)]),
        _find_case("a long run: time stamps past 10 000 ms", 1,
                   [_straggler(4, 2, 3, (3.0,), step_ms=4000.0)]),
        _find_case("a rank that loads data between steps: only compute counts", 2,
                   [_straggler(5, 1, 3, (1.5,), loader=3, load_ms=15.0),
                    _straggler(4, 2, 2, (1.4, 1.8), loader=0, load_ms=20.0)]),
        _find_case("two ranks equally slow: the lower one", 1,
                   [_straggler(6, 2, 3, (2.0,), also_slow=4),
                    _straggler(5, 3, 2, (1.5, 2.5), also_slow=1)]),
        _find_case("hidden: other world sizes, slow ranks and slowdowns", 2,
                   _random_stragglers(), hidden=True),
    ],
}
