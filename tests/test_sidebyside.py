"""Ours against torch's real tools on gloo processes: DDP, 1F1B pipelining, ZeRO-3 / FSDP2.

Each comparison trains the same model on the same batches with the capstone's solution (and
a second sharded wrapper written here to lesson 08's contract), with torch's tool and on one
device, and the losses must agree to 1e-5 at every step; the oracle ``reference.train_single``
must give the one-device losses too. Step times are reported (printed), never asserted.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from mpgpu_edu.collectives import all_gather, reduce_scatter
from mpgpu_edu.comm import Communicator
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.replica.reference import train_single
from mpgpu_edu.sidebyside import SideBySide, compare_ddp, compare_fsdp, compare_pipelining

pytestmark = [pytest.mark.gloo, pytest.mark.slow]

STEPS = 5
SIZES = (16, 64, 64, 4)
PIPE_SIZES = (16, 64, 64, 64, 4)


def solution(module: str) -> object:
    """A module of solutions/, imported by a name the gloo workers can import too."""
    return importlib.import_module(f"solutions.{module}")


def assert_equal_to_one_device(result: SideBySide, sizes: tuple[int, ...], batch: int,
                               optimizer: str, lr: float) -> None:
    print(result)  # the step times: reported, never asserted
    _, oracle = train_single(functools.partial(make_mlp, sizes),
                             make_batches(STEPS, batch, sizes[0], sizes[-1]), optimizer, lr)
    assert result.losses["one device"] == pytest.approx(oracle, abs=1e-6)
    for name in ("ours", "torch"):
        assert len(result.losses[name]) == STEPS
        assert result.losses[name] == pytest.approx(oracle, abs=1e-5), name
    assert result.max_loss_diff("ours", "torch") <= 1e-5
    assert result.matches
    assert result.losses["ours"][-1] < result.losses["ours"][0]  # it trained
    assert all(len(s) == STEPS and min(s) > 0 for s in result.step_seconds.values())
    assert math.isfinite(result.ratio)


# ---- a sharded (ZeRO-3) wrapper to lesson 08's contract, for the tests ---------------------

class _GatheredLayer(torch.autograd.Function):
    """A layer whose parameters exist only as shards: all-gathered for its forward, dropped,
    gathered again for its backward (which recomputes the forward), and its parameters'
    gradients reduce-scattered (mean) into the shards' gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, owner: "_Zero3", index: int,
                *shards: torch.Tensor) -> torch.Tensor:
        ctx.owner, ctx.index = owner, index
        ctx.save_for_backward(x)
        with torch.no_grad():
            return owner.call(index, owner.gather(index), x)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor) -> tuple:
        (x,) = ctx.saved_tensors
        owner, index = ctx.owner, ctx.index
        full = [p.requires_grad_() for p in owner.gather(index)]
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(x.requires_grad)
            y = owner.call(index, full, x_in)
            inputs = [x_in, *full] if x.requires_grad else full
            grads = torch.autograd.grad(y, inputs, grad_y)
        grad_x = grads[0] if x.requires_grad else None
        grad_full = grads[1:] if x.requires_grad else grads
        return (grad_x, None, None, *owner.scatter(grad_full))


class _Zero3:
    """ZeRO-3 on a ``nn.Sequential``: each parameter flattened, padded to a multiple of N
    and cut in N; this rank keeps its piece (``parameters()``)."""

    def __init__(self, comm: Communicator, module: nn.Sequential) -> None:
        self.comm, self.module = comm, module
        n = comm.world_size
        self.layers: list[list[tuple[str, torch.Size]]] = []
        self.shards: list[list[nn.Parameter]] = []
        for layer in module:
            named = list(layer.named_parameters())
            self.layers.append([(name, p.shape) for name, p in named])
            pieces = []
            for _, p in named:
                flat = p.detach().reshape(-1)
                flat = torch.cat([flat, flat.new_zeros(-len(flat) % n)])
                pieces.append(nn.Parameter(flat.chunk(n)[comm.rank].clone()))
            self.shards.append(pieces)

    def gather(self, index: int) -> list[torch.Tensor]:
        out = []
        for (_, shape), shard in zip(self.layers[index], self.shards[index]):
            flat = torch.cat(all_gather(self.comm, shard.detach()))
            out.append(flat[:shape.numel()].view(shape).clone())
        return out

    def scatter(self, grads: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        n = self.comm.world_size
        out = []
        for grad in grads:
            flat = grad.reshape(-1)
            flat = torch.cat([flat, flat.new_zeros(-len(flat) % n)])
            out.append(reduce_scatter(self.comm, flat, "mean"))
        return out

    def call(self, index: int, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        names = [name for name, _ in self.layers[index]]
        return torch.func.functional_call(self.module[index], dict(zip(names, params)), (x,))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.module):
            if self.layers[index]:
                x = _GatheredLayer.apply(x, self, index, *self.shards[index])
            else:
                x = layer(x)
        return x

    def finish(self) -> None:
        """Every reduce-scatter ran inside backward: nothing is left to wait for."""

    def parameters(self) -> Iterator[nn.Parameter]:
        return (shard for pieces in self.shards for shard in pieces)


def wrap_fsdp(comm: Communicator, module: nn.Sequential, prefetch: bool = False) -> _Zero3:
    """Lesson 08's contract, without prefetch (the flag changes timing, not numbers)."""
    return _Zero3(comm, module)


# ---- the three comparisons -------------------------------------------------------------------

@pytest.mark.parametrize("ranks,optimizer,lr", [(2, "sgd", 0.05), (3, "adam", 1e-3)])
def test_ddp_solution_equals_torch_ddp_and_one_device(ranks: int, optimizer: str,
                                                      lr: float) -> None:
    result = compare_ddp(solution("ex03_data_parallel").wrap_ddp, ranks=ranks, steps=STEPS,
                         sizes=SIZES, batch=12 * ranks, optimizer=optimizer, lr=lr,
                         bucket_bytes=4096)
    assert_equal_to_one_device(result, SIZES, 12 * ranks, optimizer, lr)
    assert result.labels["torch"] == "torch DistributedDataParallel"


def test_pipeline_solution_equals_schedule_1f1b_and_one_device() -> None:
    result = compare_pipelining(solution("ex04_pipeline").execute_schedule, ranks=2,
                                steps=STEPS, microbatches=4, sizes=PIPE_SIZES, batch=16,
                                optimizer="adam", lr=1e-3)
    assert_equal_to_one_device(result, PIPE_SIZES, 16, "adam", 1e-3)
    assert "mean over microbatches" in result.convention


@pytest.mark.parametrize("prefetch", [False, True])
def test_fsdp_solution_equals_fsdp2_and_one_device(prefetch: bool) -> None:
    result = compare_fsdp(solution("ex08_bigger_models").wrap_fsdp, ranks=2, steps=STEPS,
                          sizes=SIZES, batch=24, optimizer="adam", lr=1e-3, prefetch=prefetch)
    assert_equal_to_one_device(result, SIZES, 24, "adam", 1e-3)
    assert result.labels["torch"] == "torch fully_shard (FSDP2)"


def test_sharded_wrapper_equals_fsdp2_and_one_device() -> None:
    import test_sidebyside  # this module, by the name the gloo workers import it by

    result = compare_fsdp(test_sidebyside.wrap_fsdp, ranks=2, steps=STEPS, sizes=SIZES,
                          batch=24, optimizer="adam", lr=1e-3)
    assert_equal_to_one_device(result, SIZES, 24, "adam", 1e-3)


def test_the_defaults_run_the_package_reference() -> None:
    result = compare_ddp(ranks=2, steps=3, sizes=SIZES, batch=8)
    assert result.labels["ours"] == "the package's DDP wrapper" and result.matches
    result = compare_pipelining(ranks=2, steps=3, sizes=PIPE_SIZES, batch=8)
    assert result.labels["ours"] == "the package's executor" and result.matches
    result = compare_fsdp(ranks=2, steps=3, sizes=SIZES, batch=8, prefetch=True)
    assert result.labels["ours"] == "the package's sharded wrapper" and result.matches


def test_the_table_and_the_figure_show_all_three_runs() -> None:
    result = SideBySide("DDP", "a model", "the mean", {"one device": "one device",
                        "ours": "ours", "torch": "torch DDP"},
                        {"one device": [0.3, 0.2, 0.1], "ours": [0.3, 0.2, 0.1],
                         "torch": [0.3, 0.2, 0.1 + 2e-5]},
                        {"one device": [1.0, 0.01, 0.03], "ours": [1.0, 0.04, 0.06],
                         "torch": [1.0, 0.02, 0.02]})
    assert result.median_seconds == {"one device": 0.02, "ours": 0.05, "torch": 0.02}
    assert result.ratio == pytest.approx(2.5)
    assert not result.matches  # 2e-5 apart at the last step
    text = str(result)
    assert "torch DDP" in text and "NOT equal" in text and "2.50x" in text
    fig = result.plot()
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 3
    # a long label keeps its words in the table, and only its name in the figure
    result.labels["ours"] = "reference DDP wrapper (yours: not found in exercises/ex03.py)"
    assert "not found in exercises/ex03.py" in str(result)
    fig = result.plot()
    ticks = [t.get_text().replace("\n", " ") for t in fig.axes[1].get_xticklabels()]
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert ticks[1] == legend[1] == "reference DDP wrapper", (ticks, legend)


def test_bad_arguments_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="splits evenly"):
        compare_ddp(ranks=2, batch=7)
    with pytest.raises(ValueError, match="equal microbatches"):
        compare_pipelining(ranks=2, batch=10, microbatches=4)
    with pytest.raises(ValueError, match="without parameters"):
        compare_pipelining(ranks=3, sizes=(4, 8, 2), batch=8)
