"""``mpgpu_edu.measure.bench`` and ``mpgpu-edu bench allreduce``: the statistics, the
refinements of the ring, the report, and one-line errors."""

from __future__ import annotations

import importlib.util
from collections import Counter
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mpgpu_edu.measure import bench
from mpgpu_edu.measure import recording
from mpgpu_edu.cli import main
from mpgpu_edu.collectives import cost
from mpgpu_edu.comm import launch


def exit_code(argv: list[str]) -> int:
    """``main``'s exit status, whether it returns it or argparse raises SystemExit."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def test_ratio_is_ours_over_builtin() -> None:
    assert bench.ratios([2.0, 1.0, 3.0], [1.0, 2.0, 3.0]) == [2.0, 0.5, 1.0]


def test_combine_takes_the_slowest_rank_then_the_median() -> None:
    rank0 = {"ring": [[1.0, 5.0, 2.0]], "builtin": [[1.0, 1.0, 1.0]]}
    rank1 = {"ring": [[3.0, 1.0, 2.5]], "builtin": [[2.0, 0.5, 4.0]]}
    # slowest per repeat: ring [3, 5, 2.5] -> 3; builtin [2, 1, 4] -> 2
    assert bench.combine([rank0, rank1]) == {"ring": [3.0], "builtin": [2.0]}
    # CPU time adds up over ranks: ring [4, 6, 4.5] -> 4.5; builtin [3, 1.5, 5] -> 3
    assert bench.combine([rank0, rank1], across=sum) == {"ring": [4.5], "builtin": [3.0]}


@pytest.mark.parametrize("n", range(1, 8))
def test_repeats_balance_places_and_predecessors(n: int) -> None:
    """Over a cycle of repeats every operation runs in every place, and right after every
    other one, equally often (turning one order round fails the second: ring would always
    follow builtin)."""
    names = [f"op{k}" for k in range(n)]
    rows = 2 * n if n % 2 else n
    orders = [bench.in_turn(names, r) for r in range(rows)]
    assert bench.in_turn(names, rows) == orders[0]  # then it starts over
    assert all(sorted(order) == names for order in orders)
    for place in range(n):
        assert Counter(order[place] for order in orders) == Counter({k: rows // n for k in names})
    follows = Counter((a, b) for order in orders for a, b in zip(order, order[1:]))
    if n > 1:
        assert set(follows.values()) == {rows // n}
        assert len(follows) == n * (n - 1)


def test_sizes_round_up_to_fp32_and_must_be_positive() -> None:
    assert bench.fp32_sizes([1, 4, 1025]) == [4, 4, 1028]
    with pytest.raises(ValueError, match="positive"):
        bench.fp32_sizes([0])


def test_size_labels_are_exact() -> None:
    assert [bench.size_label(n) for n in (1024, 4100, 2**26, 3)] == ["1 KiB", "4100 B",
                                                                      "64 MiB", "3 B"]


def reused_sum(comm, numel: int) -> bool:
    """The ring with a kept scratch buffer, on data whose exact sum is known."""
    n = comm.world_size
    tensor = torch.arange(numel, dtype=torch.float32) * (comm.rank + 1)
    buffer = torch.empty(-(-numel // n))
    for _ in range(2):  # the second call reuses the buffer
        tensor.copy_(torch.arange(numel, dtype=torch.float32) * (comm.rank + 1))
        bench.all_reduce_ring_reused(comm, tensor, buffer)
    return torch.equal(tensor, torch.arange(numel, dtype=torch.float32) * n * (n + 1) / 2)


@pytest.mark.parametrize("world_size, numel", [(2, 1), (3, 2), (3, 257), (5, 1001)])
def test_the_ring_with_a_kept_buffer_gives_the_exact_sum(world_size, numel) -> None:
    # On the simulator: fewer elements than ranks, chunks one element apart.
    assert launch(reused_sum, world_size, numel).results == [True] * world_size


def fake_report() -> dict:
    return {"sizes": [1024, 2**20], "ring_s": [2e-3, 4e-3], "builtin_s": [1e-3, 5e-3],
            "ratio_ring": [2.0, 0.8], "paired_ring": [1.8, 0.7], "cpu_ratio_ring": [1.5, 0.9],
            "busbw_ring": [5.12e5, 2.62e8], "busbw_builtin": [1.02e6, 2.1e8],
            "algos": ["ring"], "world_size": 2, "backend": "gloo", "repeats": 3, "threads": 1,
            "loadavg": [1.5, 1.0, 0.5], "loadavg_start": [0.25, 0.5, 0.5], "cpus": 2,
            "torch": "2"}


def test_table_has_a_row_per_size_and_the_load() -> None:
    text = bench.table(fake_report())
    lines = text.splitlines()
    assert "ring ms" in lines[1] and "ring/builtin" in lines[1] and "busbw ring" in lines[1]
    assert "paired ring/builtin" in lines[1]
    assert lines[2].split()[:7] == ["1", "KiB", "2.000", "1.000", "2.00", "1.80", "1.50"]
    assert "1.50, 1.00, 0.50" in lines[-1]
    assert "before 0.25, after 1.50" in lines[-1]


def test_paired_is_the_median_of_ratios_within_a_repeat() -> None:
    rank0 = {"ring": [[2.0, 9.0, 3.0]], "builtin": [[1.0, 10.0, 1.0]]}
    rank1 = {"ring": [[1.0, 1.0, 1.0]], "builtin": [[2.0, 1.0, 1.0]]}
    # slowest rank per repeat: ring [2, 9, 3], builtin [2, 10, 1] -> ratios 1, 0.9, 3
    assert bench.paired([rank0, rank1], "ring") == [1.0]


def test_a_busy_machine_is_refused_unless_forced(monkeypatch) -> None:
    monkeypatch.setattr(recording.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(recording.os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    with pytest.raises(RuntimeError, match="0.60 per core"):
        recording.check_idle()
    recording.check_idle(force=True)
    monkeypatch.setattr(recording.os, "getloadavg", lambda: (0.9, 1.0, 1.0))
    recording.check_idle()


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def script(name: str) -> object:
    """A benchmark script, imported as a module (it is not a package)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["allreduce_vs_torch", "ddp_vs_torch"])
def test_the_scripts_do_not_write_results_on_a_busy_machine(name, monkeypatch, tmp_path,
                                                            capsys) -> None:
    module = script(name)
    monkeypatch.setattr(bench.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    results = tmp_path / "RESULTS.md"
    assert module.main(["--quick", "--results", str(results)]) == 2  # before any launch
    assert not results.exists()
    assert "not recording these timings" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--world-size", "1"], ["--world-size", "0"], ["--sizes", "12XB"], ["--sizes=-1KiB"],
    ["--sizes", "0"], ["--sizes", ","], ["--backend", "mpi"], ["--backend", "sim"],
    ["--repeats", "0"], ["--algos", "tree"], ["--algos", "ring,ring"], ["--threads", "0"],
])
def test_bad_input_is_one_line_and_exit_2(argv, capsys) -> None:
    assert exit_code(["bench", "allreduce", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err


@pytest.mark.gloo
def test_bench_json_is_consistent(capsys) -> None:
    argv = ["bench", "allreduce", "--backend", "gloo", "--world-size", "2",
            "--sizes", "1KiB,4097", "--repeats", "2", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["sizes"] == [1024, 4100]  # rounded up to whole fp32 elements
    assert (r["world_size"], r["backend"], r["repeats"]) == (2, "gloo", 2)
    assert len(r["loadavg"]) == 3
    for name in ("ring", "naive"):
        assert len(r[f"{name}_s"]) == 2 and all(t > 0 for t in r[f"{name}_s"])
        assert r[f"ratio_{name}"] == pytest.approx([a / b for a, b in
                                                    zip(r[f"{name}_s"], r["builtin_s"])])
        cpu = zip(r[f"{name}_cpu_s"], r["builtin_cpu_s"])
        assert r[f"cpu_ratio_{name}"] == pytest.approx([a / b for a, b in cpu])
    assert r["busbw_builtin"] == pytest.approx([cost.busbw(s, t, 2) for s, t in
                                                zip(r["sizes"], r["builtin_s"])])


@pytest.mark.gloo
def test_bench_quick_runs_end_to_end(capsys) -> None:
    assert main(["bench", "allreduce", "--quick", "--algos", "ring,ring_fast", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["sizes"] == bench.QUICK_SIZES and r["repeats"] == bench.QUICK_REPEATS
    assert len(r["paired_ring_fast"]) == len(r["sizes"]) and len(r["loadavg_start"]) == 3


@pytest.mark.gloo
@pytest.mark.parametrize("name, shows", [
    ("allreduce_vs_torch", "| size | ring/builtin | ring_fast/builtin |"),
    ("ddp_vs_torch", "median over 1 run(s) of the run medians of neighbouring ratios"),
    ("calibrate_vs_measured", "| size | ring: simulated vs measured | fast: simulated vs "),
    ("first_check", "First `mp.check(\"1.3\")` in a fresh process"),
])
def test_the_benchmark_scripts_run_quick(name, shows, tmp_path) -> None:
    results = tmp_path / "RESULTS.md"
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick",
                           "--results", str(results), "--force"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "1-minute load average before" in done.stdout
    assert "1-minute load average after" in done.stdout
    assert shows in done.stdout and shows in results.read_text()


@pytest.mark.gloo
def test_bench_of_every_algorithm_on_three_ranks_prints_a_table(capsys) -> None:
    argv = ["bench", "allreduce", "--world-size", "3", "--sizes", "4,1028", "--repeats", "1",
            "--algos", ",".join(bench.ALGOS)]
    assert main(argv) == 0  # each operation's sum is checked in the workers first
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("all-reduce, 3 ranks, gloo")
    assert [line.split()[0] for line in lines[2:4]] == ["4", "1028"]
