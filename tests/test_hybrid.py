"""Hybrid DP x PP: the mesh as data, its groups, and training equal to one device."""

from __future__ import annotations

import pytest
import torch

from mpgpu_edu.comm import RankError, launch
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.hybrid import Mesh, make_groups, train_hybrid
from mpgpu_edu.hybrid.runner import mesh_for, run_demo
from mpgpu_edu.pipeline import gpipe, one_f_one_b, partition_by_sizes
from mpgpu_edu.pipeline.runner import optimizer_factory
from mpgpu_edu.replica.reference import train_single

SIZES = (8, 32, 32, 32, 2)  # 7 layers


def model_fn():
    return make_mlp(SIZES, seed=0)


# ---- the mesh ------------------------------------------------------------------------------------

def test_mesh_maps_ranks_to_replica_and_stage():
    mesh = Mesh(dp=2, pp=3)
    assert mesh.world_size == 6
    assert [mesh.coords(r) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(mesh.rank_of(*mesh.coords(r)) == r for r in range(6))
    assert [mesh.replica_ranks(d) for d in range(2)] == [[0, 1, 2], [3, 4, 5]]
    assert [mesh.stage_ranks(s) for s in range(3)] == [[0, 3], [1, 4], [2, 5]]


def test_mesh_describe_and_drawable_structure():
    mesh = Mesh(2, 3)
    text = mesh.describe()
    assert text.splitlines()[1].split() == ["stage", "0", "stage", "1", "stage", "2"]
    assert "replica 1  rank 3   rank 4   rank 5" in text
    assert "data-parallel groups (columns): [0, 3], [1, 4], [2, 5]" in text
    drawn = mesh.to_dict()
    assert drawn["cells"][4] == {"rank": 4, "dp_index": 1, "pp_index": 1}
    assert drawn["pipeline_groups"] == [[0, 1, 2], [3, 4, 5]]
    assert drawn["data_parallel_groups"] == [[0, 3], [1, 4], [2, 5]]


def test_mesh_that_does_not_fit_the_world_names_both_numbers():
    with pytest.raises(ValueError, match="dp=2 x pp=3 needs 6 ranks, but the world size is 4"):
        Mesh(2, 3).check(4)
    with pytest.raises(RankError, match="needs 6 ranks, but the world size is 4"):
        launch(lambda comm: make_groups(comm, Mesh(2, 3)), 4)


@pytest.mark.parametrize("dp, pp", [(0, 2), (2, -1), (1.5, 2), (True, 2)])
def test_mesh_sizes_are_positive_whole_numbers(dp, pp):
    with pytest.raises(ValueError, match="whole number >= 1"):
        Mesh(dp, pp)


def test_groups_renumber_ranks_by_stage_and_by_replica():
    def prog(comm):
        groups = make_groups(comm, Mesh(2, 3))
        return (groups.pipeline.rank, groups.pipeline.world_size,
                groups.data.rank, groups.data.world_size)

    assert launch(prog, 6).results == [(s, 3, d, 2) for d in range(2) for s in range(3)]


def test_mesh_for_picks_or_checks_dp_and_pp():
    assert mesh_for(4) == Mesh(2, 2)
    assert mesh_for(6, pp=3) == Mesh(2, 3)
    assert mesh_for(6, dp=3) == Mesh(3, 2)
    assert mesh_for(3) == Mesh(1, 3)
    with pytest.raises(ValueError, match="needs 6 ranks, but the world size is 4"):
        mesh_for(4, dp=3, pp=2)


# ---- training equals one device -----------------------------------------------------------------

def assert_matches(result, mesh, data, optimizer="sgd"):
    ref_params, ref_losses = train_single(model_fn, data, optimizer, 0.05)
    atol = 1e-5 if optimizer == "adam" else 1e-6
    for d in range(mesh.dp):
        state = {k: v for r in result.results if r["dp_index"] == d
                 for k, v in r["state"].items()}
        for name, expected in ref_params.items():
            torch.testing.assert_close(state[name], expected, rtol=1e-5, atol=atol)
    for d in range(mesh.dp):
        losses = result.results[mesh.rank_of(d, mesh.pp - 1)]["losses"]
        assert losses == pytest.approx(ref_losses, rel=1e-5)


@pytest.mark.parametrize("dp, pp, schedule, n", [
    (2, 2, gpipe(2, 2), 16),
    (2, 3, one_f_one_b(3, 3), 16),
    (3, 2, gpipe(2, 2), 14),  # shards of 5, 5 and 4 samples: weighted, still exact
])
def test_dp_x_pp_equals_single_device(dp, pp, schedule, n):
    mesh, data = Mesh(dp, pp), make_batches(2, n, SIZES[0], SIZES[-1], seed=5)
    result = launch(train_hybrid, dp * pp, mesh, model_fn(), data, schedule)
    assert_matches(result, mesh, data)


def test_adam_and_unequal_stages():
    mesh, data = Mesh(2, 2), make_batches(2, 16, SIZES[0], SIZES[-1], seed=5)
    placement = partition_by_sizes(model_fn(), [5, 2])
    result = launch(train_hybrid, 4, mesh, model_fn(), data, one_f_one_b(2, 4), placement,
                    optimizer_factory("adam"))
    assert_matches(result, mesh, data, "adam")


def test_each_stage_all_reduces_its_gradients_across_replicas():
    mesh, data = Mesh(2, 2), make_batches(1, 16, SIZES[0], SIZES[-1])
    placement = partition_by_sizes(model_fn(), [3, 4])
    result = launch(train_hybrid, 4, mesh, model_fn(), data, gpipe(2, 2), placement)
    # replicas talk only within a column: ranks 0 <-> 2 and 1 <-> 3, besides their pipelines
    links = {link for link, nbytes in result.bytes_per_link().items() if nbytes}
    assert links == {(0, 1), (1, 0), (2, 3), (3, 2), (0, 2), (2, 0), (1, 3), (3, 1)}
    stage0_grad_bytes = (8 * 32 + 32 + 32 * 32 + 32) * 4
    assert result.stats[0].sent_to[2] == stage0_grad_bytes  # ring of 2: half, twice


def test_schedule_must_match_the_mesh():
    with pytest.raises(RankError, match="has 3 stages but the mesh has pp=2"):
        launch(train_hybrid, 4, Mesh(2, 2), model_fn(), make_batches(1, 8), gpipe(3, 2))


# ---- the runner and gloo -------------------------------------------------------------------------

def test_run_demo_reports_the_comparison():
    report = run_demo("sim", 4, 2, "sgd", dp=2, schedule="1f1b", microbatches=2)
    assert (report["strategy"], report["dp"], report["pp"]) == ("hybrid", 2, 2)
    for key in ("backend", "world_size", "steps", "losses", "reference_losses", "final_loss",
                "reference_final_loss", "max_abs_param_diff", "mesh"):
        assert key in report
    assert report["losses"] == pytest.approx(report["reference_losses"], rel=1e-5)
    assert report["max_abs_param_diff"] < 1e-6


@pytest.mark.parametrize("options, message", [
    ({"dp": 3, "pp": 2}, "needs 6 ranks, but the world size is 4"),
    ({"batch_size": 3}, "cannot feed dp=2 replicas x 2 microbatches"),
    ({"pp": 4, "dp": 1, "sizes": (8, 2)}, "cannot split a 1-layer model into pp=4"),
    ({"schedule": "zigzag"}, "unknown schedule"),
])
def test_run_demo_bad_input(options, message):
    with pytest.raises(ValueError, match=message):
        run_demo("sim", 4, 1, "sgd", **options)


@pytest.mark.gloo
def test_gloo_2x2_equals_single_device():
    mesh, data = Mesh(2, 2), make_batches(2, 16, SIZES[0], SIZES[-1], seed=5)
    result = launch(train_hybrid, 4, mesh, model_fn(), data, gpipe(2, 2), backend="gloo",
                    timeout=90)
    assert_matches(result, mesh, data)
