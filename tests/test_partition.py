"""Partitioning layers into stages: costs, hand-made and balanced splits, stage modules."""

from itertools import combinations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from mpgpu_edu.pipeline.partition import (
    LayerCost,
    layer_costs,
    partition_balanced,
    partition_by_list,
    partition_by_sizes,
    split_module,
)


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 4))


def named(weights: list[int]) -> list[LayerCost]:
    return [LayerCost(f"l{i}", n_params=w, flops=10 * w) for i, w in enumerate(weights)]


def test_layer_costs_count_parameters_bytes_and_forward_flops():
    costs = layer_costs(mlp(), torch.randn(2, 8))
    assert [c.name for c in costs] == ["0", "1", "2", "3", "4"]
    assert [c.n_params for c in costs] == [8 * 16 + 16, 0, 16 * 16 + 16, 0, 16 * 4 + 4]
    assert [c.param_bytes for c in costs] == [4 * c.n_params for c in costs]
    assert [c.flops for c in costs] == [2 * 2 * 8 * 16, 0, 2 * 2 * 16 * 16, 0, 2 * 2 * 16 * 4]


def test_layer_cost_assumes_fp32_bytes_unless_told():
    assert LayerCost("fc", 10, 0).param_bytes == 40
    assert LayerCost("fc", 10, 0, param_bytes=20).param_bytes == 20


def test_partition_by_list_splits_before_each_boundary():
    placement = partition_by_list(named([1] * 10), [4, 7])
    assert [len(s.layers) for s in placement.stages] == [4, 3, 3]
    assert placement.stages[1].layers == ("l4", "l5", "l6")
    assert [(s.stage, s.device, s.physical_device) for s in placement.stages] == [
        (0, 0, 0), (1, 1, 1), (2, 2, 2)]
    assert placement.stages[2].flops == 30 and placement.stages[2].param_bytes == 12
    assert placement.layers == [f"l{i}" for i in range(10)]
    assert placement.stage_of("l6") == 1


def test_partition_by_sizes_and_by_list_agree():
    model = mlp()
    assert partition_by_sizes(model, [2, 2, 1]) == partition_by_list(model, [2, 4])
    assert partition_by_sizes(["a", "b"], [2]).stages[0].layers == ("a", "b")


@pytest.mark.parametrize("boundaries", [[7, 4], [4, 4], [0, 4], [4, 10], [-1]])
def test_bad_boundaries_are_named(boundaries):
    with pytest.raises(ValueError, match="must increase strictly and lie in 1..9"):
        partition_by_list(named([1] * 10), boundaries)


def test_too_many_or_too_few_stages_are_refused():
    with pytest.raises(ValueError, match="cannot split 3 layers into 5 stages"):
        partition_balanced(named([1, 1, 1]), 5)
    with pytest.raises(ValueError, match="use at most 3 stages"):
        partition_by_list(named([1, 1, 1]), [1, 2, 3])
    with pytest.raises(ValueError, match="n_stages must be at least 1, got 0"):
        partition_balanced(named([1, 1, 1]), 0)
    with pytest.raises(ValueError, match="add up to the 3 layers"):
        partition_by_sizes(named([1, 1, 1]), [1, 1])


def brute_force_best(weights: list[int], n_parts: int) -> int:
    n = len(weights)
    best = None
    for cuts in combinations(range(1, n), n_parts - 1):
        edges = [0, *cuts, n]
        largest = max(sum(weights[a:b]) for a, b in zip(edges, edges[1:]))
        best = largest if best is None else min(best, largest)
    return best


@given(weights=st.lists(st.integers(0, 50), min_size=1, max_size=9), data=st.data())
def test_balanced_split_is_the_exact_optimum(weights, data):
    n_parts = data.draw(st.integers(1, len(weights)))
    placement = partition_balanced(named(weights), n_parts)
    assert placement.n_stages == n_parts
    assert all(stage.layers for stage in placement.stages)
    assert placement.layers == [f"l{i}" for i in range(len(weights))]
    assert max(s.n_params for s in placement.stages) == brute_force_best(weights, n_parts)


def test_balance_by_flops_uses_the_flop_counts():
    costs = [LayerCost("a", 100, 1), LayerCost("b", 1, 1), LayerCost("c", 1, 2)]
    assert [s.layers for s in partition_balanced(costs, 2).stages] == [("a",), ("b", "c")]
    by_flops = partition_balanced(costs, 2, by="flops")
    assert [s.layers for s in by_flops.stages] == [("a", "b"), ("c",)]
    override = partition_balanced(costs, 2, by="flops", flops_per_layer=[5, 1, 1])
    assert [s.layers for s in override.stages] == [("a",), ("b", "c")]
    assert override.stages[0].flops == 5


def test_balance_by_flops_needs_flops():
    with pytest.raises(ValueError, match="no FLOPs are known: pass flops_per_layer"):
        partition_balanced(mlp(), 2, by="flops")
    with pytest.raises(ValueError, match="flops_per_layer has 2 values for 5 layers"):
        partition_balanced(mlp(), 2, by="flops", flops_per_layer=[1, 2])
    with pytest.raises(ValueError, match="balance by 'params' or by 'flops'"):
        partition_balanced(mlp(), 2, by="time")  # type: ignore[arg-type]


def test_split_module_shares_the_layers_and_computes_the_same():
    model = mlp()
    placement = partition_balanced(layer_costs(model, torch.randn(2, 8)), 3, by="flops")
    stages = split_module(model, placement)
    assert len(stages) == 3
    assert [list(dict(s.named_children())) for s in stages] == [
        list(s.layers) for s in placement.stages]
    assert stages[0][0] is model[0]
    x = torch.randn(5, 8)
    y = x
    for stage in stages:
        y = stage(y)
    torch.testing.assert_close(y, model(x), rtol=0, atol=0)


def test_split_module_refuses_a_placement_of_another_model():
    with pytest.raises(ValueError, match="build the placement from this model"):
        split_module(mlp(), partition_by_list(named([1] * 5), [2]))


def test_with_devices_maps_logical_to_physical():
    placement = partition_by_list(mlp(), [3]).with_devices([2, 3])
    assert [(s.device, s.physical_device) for s in placement.stages] == [(0, 2), (1, 3)]
    assert "stage 1 on cuda:1 (GPU 3): 3, 4" in str(placement)
    with pytest.raises(ValueError, match="needs 2 different physical ids"):
        placement.with_devices([5])
    with pytest.raises(ValueError, match="needs 2 different physical ids"):
        placement.with_devices([1, 1])
