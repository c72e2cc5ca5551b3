"""``mpgpu_edu.measure.calibrate`` and ``mpgpu-edu calibrate``: the fit, the profile as a
cluster, and a small end-to-end run on gloo."""

from __future__ import annotations

import json

import pytest

from mpgpu_edu.measure import calibrate as cal
from mpgpu_edu.cli import main
from mpgpu_edu.collectives import cost

SIZES = [0, 2**10, 2**14, 2**20, 2**26]


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.mark.parametrize("alpha, beta", [(30e-6, 2e9), (1e-3, 5e7), (0.0, 1e10), (2e-6, 1e12)])
def test_fit_recovers_alpha_and_beta_from_exact_points(alpha, beta) -> None:
    points = [(n, alpha + n / beta) for n in SIZES if alpha + n / beta > 0]
    got_alpha, got_beta = cal.fit_alpha_beta(points)
    assert got_alpha == pytest.approx(alpha, rel=1e-9, abs=1e-15)
    assert got_beta == pytest.approx(beta, rel=1e-9)


def test_fit_weighs_relative_error_so_small_sizes_keep_alpha() -> None:
    # 2% noise on the largest point only: absolute least squares would move alpha a lot.
    points = [(n, 30e-6 + n / 2e9) for n in SIZES]
    points[-1] = (points[-1][0], points[-1][1] * 1.02)
    alpha, beta = cal.fit_alpha_beta(points)
    assert alpha == pytest.approx(30e-6, rel=0.05)
    assert beta == pytest.approx(2e9, rel=0.03)


def test_fit_clamps_a_negative_alpha_and_rejects_what_it_cannot_fit() -> None:
    alpha, beta = cal.fit_alpha_beta([(1000, 1e-6), (2000, 3e-6)])  # the line crosses below 0
    assert alpha == 0.0 and beta > 0
    for points in ([(1024, 1e-3)], [(1024, 1e-3), (1024, 2e-3)], [(0, 0.0), (10, 1.0)],
                   [(0, 2e-3), (2**20, 1e-3)]):
        with pytest.raises(ValueError):
            cal.fit_alpha_beta(points)


def profile(alpha: float = 25e-6, beta: float = 3e9, **extra) -> dict:
    return {"format": cal.FORMAT, "backend": "gloo", "world_size": 2, "alpha_s": alpha,
            "beta_Bps": beta, "topology": "shared_host", "points": [], **extra}


def test_load_calibrated_builds_a_cluster_whose_routes_have_the_numbers(tmp_path) -> None:
    path = cal.save_profile(profile(), tmp_path / "deep" / "calibration.json")
    cluster = cal.load_calibrated(path)
    route = cluster.route(0, 1)
    assert (cluster.world_size, route.alpha_s, route.beta_Bps) == (2, 25e-6, 3e9)
    assert (cluster.route(1, 0).alpha_s, cluster.route(1, 0).beta_Bps) == (25e-6, 3e9)
    assert cluster.gpu.name == "CPU-16GB"
    wider = cal.load_calibrated(path, world_size=4)
    assert wider.world_size == 4 and wider.route(3, 1).alpha_s == 25e-6


def test_a_uniform_profile_simulates_the_closed_form(tmp_path) -> None:
    path = cal.save_profile(profile(topology="uniform"), tmp_path / "u.json")
    cluster = cal.load_calibrated(path, 3)
    assert "host.copy" not in cluster.route(0, 1).resources
    for nbytes in (12, 3 * 2**20):
        want = cost.ring_allreduce_time(3, nbytes, 25e-6, 3e9)
        assert cal.predict_ring(cluster, nbytes) == pytest.approx(want, rel=1e-9)


def test_on_a_shared_host_the_two_directions_take_turns(tmp_path) -> None:
    cluster = cal.load_calibrated(cal.save_profile(profile(), tmp_path / "s.json"))
    assert "host.copy" in cluster.route(0, 1).resources
    # 2 ranks: each ring step moves S/2 each way through one resource, and on a CPU each
    # message's alpha is work that holds it too: 2 alpha + S / beta per step
    nbytes = 2**20
    assert cal.predict_ring(cluster, nbytes) == pytest.approx(2 * (2 * 25e-6 + nbytes / 3e9))


def test_on_a_shared_host_a_ranks_pipelined_messages_pay_every_alpha(tmp_path) -> None:
    """Four messages posted at once from rank 0 to rank 1: with alpha a wire delay they
    would overlap their alphas (alpha + 4 n / beta); on a CPU each pays its own."""
    from mpgpu_edu.comm import launch

    cluster = cal.load_calibrated(cal.save_profile(profile(), tmp_path / "p.json"))

    def four(comm) -> None:
        import torch
        buf = [torch.empty(2**18, device="meta") for _ in range(4)]
        works = [comm.isend(b, 1) if comm.rank == 0 else comm.irecv(b, 0) for b in buf]
        for w in works:
            w.wait()

    n = 2**20  # bytes of each message (2**18 fp32)
    assert launch(four, cluster).trace.makespan == pytest.approx(4 * (25e-6 + n / 3e9))


@pytest.mark.parametrize("content, message", [
    ("not json", "cannot read"), (json.dumps({"alpha_s": 1}), "not a calibration profile"),
    (json.dumps(profile(beta=0.0)), "beta_Bps"), (json.dumps(profile(alpha=-1.0)), "alpha_s"),
    (json.dumps(profile(topology="ring")), "topology"),
])
def test_a_bad_profile_says_what_is_wrong(tmp_path, content, message) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        cal.load_calibrated(path)


def test_an_nccl_profile_needs_a_gpu_name(tmp_path) -> None:
    path = cal.save_profile(profile(backend="nccl"), tmp_path / "n.json")
    with pytest.raises(ValueError, match="name the GPU"):
        cal.load_calibrated(path)
    assert cal.load_calibrated(path, gpu="H100-SXM-80GB").gpu.name == "H100-SXM-80GB"


def test_the_default_profile_lives_in_the_repository() -> None:
    path = cal.default_profile_path()
    assert path.parts[-2:] == (".mpgpu", "calibration.json")
    assert (path.parents[1] / "pyproject.toml").exists()


@pytest.mark.parametrize("argv", [
    ["--world-size", "1"], ["--sizes", "12XB"], ["--sizes=-4KiB"], ["--backend", "mpi"],
    ["--sizes", "0"], ["--allreduce-sizes", "0"], ["--repeats", "0"],
])
def test_bad_input_is_one_line_and_exit_2(argv, capsys) -> None:
    assert exit_code(["calibrate", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err


@pytest.mark.gloo
def test_calibrate_end_to_end_writes_a_profile_that_loads(tmp_path, capsys) -> None:
    out = tmp_path / "calibration.json"
    argv = ["calibrate", "--backend", "gloo", "--world-size", "2", "--sizes", "0,1KiB,16MiB",
            "--allreduce-sizes", "4KiB", "--repeats", "2", "--out", str(out), "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    saved = cal.read_profile(out)
    assert report["profile_path"] == str(out)
    assert saved["alpha_s"] == report["alpha_s"] >= 0 and saved["beta_Bps"] > 0
    assert [p["bytes"] for p in saved["points"]] == [0, 1024, 16 * 2**20]
    assert all(p["seconds"] > 0 and p["exchange_seconds"] > 0 for p in saved["points"])
    assert saved["topology"] == "shared_host" and saved["allreduce"]["sizes"] == [4096]
    assert saved["torch"] and saved["date"] and saved["backend"] == "gloo"
    compared = report["comparison"]
    assert compared["sizes"] == [4096] and len(compared["error"]) == 1
    p, m = compared["predicted_s"][0], compared["measured_s"][0]
    assert compared["error"][0] == pytest.approx((p - m) / m)
    b = compared["builtin_s"][0]
    assert compared["error_builtin"][0] == pytest.approx((p - b) / b)
    assert cal.load_calibrated(out).route(0, 1).beta_Bps == saved["beta_Bps"]
    # the adds: four sizes, each point 3 x an operand's bytes; a fit, or none on a noisy box
    assert [p["bytes"] for p in saved["add_points"]] == [3 * n for n in cal.ADD_SIZES]
    assert all(p["seconds"] > 0 for p in saved["add_points"])
    if saved["memory_Bps"] is not None:
        assert saved["memory_Bps"] > 0 and saved["op_overhead_s"] >= 0
        assert cal.load_calibrated(out).memory_Bps == saved["memory_Bps"]


def test_a_profile_with_memory_charges_the_rings_adds(tmp_path) -> None:
    """Ring all-reduce of S bytes on N ranks with a port each: the closed form plus, in each
    of the N - 1 reduce-scatter steps, one add of a chunk of s = S/N bytes (read 2s, write
    s): (N - 1)(op_overhead + 3 s / memory_Bps)."""
    path = cal.save_profile(profile(topology="uniform", memory_Bps=5e9, op_overhead_s=4e-6),
                            tmp_path / "m.json")
    cluster = cal.load_calibrated(path, 3)
    assert (cluster.memory_Bps, cluster.launch_overhead_s) == (5e9, 4e-6)
    nbytes = 3 * 2**20
    add = 4e-6 + 3 * (nbytes / 3) / 5e9
    want = cost.ring_allreduce_time(3, nbytes, 25e-6, 3e9) + 2 * add
    assert cal.predict_ring(cluster, nbytes) == pytest.approx(want, rel=1e-9)


def test_a_profile_without_memory_leaves_adds_free(tmp_path) -> None:
    cluster = cal.load_calibrated(cal.save_profile(profile(), tmp_path / "old.json"))
    assert (cluster.memory_Bps, cluster.launch_overhead_s) == (0.0, 0.0)


@pytest.mark.parametrize("extra, message", [
    ({"memory_Bps": 0.0}, "memory_Bps"), ({"memory_Bps": 1e9, "op_overhead_s": -1.0},
                                          "op_overhead_s"),
])
def test_bad_memory_numbers_say_what_is_wrong(tmp_path, extra, message) -> None:
    path = cal.save_profile(profile(**extra), tmp_path / "bad.json")
    with pytest.raises(ValueError, match=message):
        cal.load_calibrated(path)


def test_the_shared_part_of_alpha_is_fitted_from_the_exchanges() -> None:
    alpha, beta = 250e-6, 3e9
    for sigma in (0.0, 0.4, 1.0):
        points = [(n, alpha + n / beta, (1 + sigma) * alpha + 2 * n / beta)
                  for n in (0, 2**12, 2**20, 2**24)]
        assert cal.fit_shared_alpha(points, alpha, beta) == pytest.approx(sigma, abs=1e-9)
    # noise past either end is clamped
    assert cal.fit_shared_alpha([(0, alpha, 3 * alpha)], alpha, beta) == 1.0
    assert cal.fit_shared_alpha([(0, alpha, 0.5 * alpha)], alpha, beta) == 0.0


@pytest.mark.parametrize("sigma", [0.0, 0.5])
def test_an_exchange_pays_one_alpha_and_the_shared_part_of_the_other(sigma, tmp_path) -> None:
    from mpgpu_edu.comm import launch

    path = cal.save_profile({**profile(), "alpha_shared": sigma}, tmp_path / "x.json")
    cluster = cal.load_calibrated(path)

    def exchange(comm) -> None:
        import torch
        out, into = torch.empty(2**18, device="meta"), torch.empty(2**18, device="meta")
        work = comm.isend(out, 1 - comm.rank)
        comm.recv(into, 1 - comm.rank)
        work.wait()

    n = 2**20
    assert launch(exchange, cluster).trace.makespan == pytest.approx(
        (1 + sigma) * 25e-6 + 2 * n / 3e9)
