"""Check of exercise 1.1: a point-to-point message's time, against the simulator's own
measure of a lone send on the same cluster."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._plain import type_name
from mpgpu_edu.grading.checks._support import expect, run_spmd, uniform

Impl = Callable[..., Any]


P2P_SETS: dict[str, list[tuple[Callable[[], Cluster], list[tuple[int, int]], list[int]]]] = {
    "uniform": [(lambda: uniform(2), [(0, 1), (1, 0)], [0, 1, 1000, 10**6])],
    # routes that differ from 0 -> 1's: across the socket, and between nodes
    "preset": [(lambda: Cluster.preset("4xRTX4090-pcie"), [(0, 2)], [4096, 2**20]),
               (lambda: Cluster.preset("8xRTX4090-pcie"), [(0, 7)], [2**20]),
               (lambda: Cluster.preset("2x8xH100-ib"), [(0, 8)], [4096, 2**20])],
    # both PCIe cards on one socket: across the socket link even a lone transfer runs at that
    # link's shared 10 GB/s, which the route's beta_Bps (24 GB/s) does not carry
    "visible": [(lambda: Cluster.preset("8xRTX4090-pcie", visible="5,4"), [(0, 1)], [2**20]),
                (lambda: Cluster.preset("2x8xH100-ib", visible="0,9"), [(1, 0)], [2**20])],
}


def _p2p_program(src: int, dst: int, nbytes: int) -> Callable[..., None]:
    def program(comm: Any) -> None:
        buffer = torch.zeros(nbytes, dtype=torch.uint8)
        if comm.rank == src:
            comm.send(buffer, dst)
        elif comm.rank == dst:
            comm.recv(buffer, src)
    return program


def _p2p_case(name: str, key: str) -> Case:
    def compute(impl: Impl) -> list[Any]:
        return [impl(make(), src, dst, nbytes) for make, pairs, sizes in P2P_SETS[key]
                for src, dst in pairs for nbytes in sizes]

    def judge(got: list[Any]) -> None:
        answers = iter(got)
        for make, pairs, sizes in P2P_SETS[key]:
            cluster = make()
            for src, dst in pairs:
                for nbytes in sizes:
                    value = next(answers)
                    measured = run_spmd(_p2p_program(src, dst, nbytes), cluster).trace.makespan
                    expect(type(value) in (int, float), f"p2p_time should return seconds as a "
                                                        f"float, got {type_name(value)}")
                    expect(abs(value - measured) <= 1e-9 * measured + 1e-15,
                           f"p2p_time({cluster.name}, {src}, {dst}, {nbytes}) returned "
                           f"{value:.6g} s; the simulator measures {measured:.6g} s")
    return Case(name, 1, compute, judge)
