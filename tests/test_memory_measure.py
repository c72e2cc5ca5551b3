"""Measured memory: the ledger holds the real tensors' bytes, category by category."""

from __future__ import annotations

import pytest
import torch

from mpgpu_edu.comm import launch
from mpgpu_edu.replica.data import loss_fn, make_batch, make_mlp
from mpgpu_edu.memory.measure import (saved_activations, track_gradients, track_optimizer_state,
                                      track_parameters)

SIZES = [4, 8, 8, 2]
B = 5


def held(comm) -> dict[str, int]:  # noqa: ANN001
    """What the rank's ledger holds now, by category."""
    return dict(comm.memory.ledger.by_category())


def on_one_rank(fn):  # noqa: ANN001, ANN201
    return launch(fn, 1).results[0]


def test_parameters_and_gradients_are_their_real_bytes() -> None:
    def prog(comm):  # noqa: ANN001, ANN202
        model = make_mlp(SIZES)
        params, grads = track_parameters(comm, model), track_gradients(comm, model)
        return params.nbytes, grads.nbytes, held(comm)

    params, grads, ledger = on_one_rank(prog)
    expected = sum(p.numel() * p.element_size() for p in make_mlp(SIZES).parameters())
    assert params == grads == expected == 4 * (4 * 8 + 8 + 8 * 8 + 8 + 8 * 2 + 2)
    assert ledger["parameters"] == ledger["gradients"] == expected


def test_adam_state_is_two_parameters_plus_a_step_per_tensor() -> None:
    def prog(comm, name):  # noqa: ANN001, ANN202
        model = make_mlp(SIZES)
        opt = torch.optim.Adam(model.parameters()) if name == "adam" else torch.optim.SGD(
            model.parameters(), lr=0.1)
        state = track_optimizer_state(comm, opt)  # before the first step: nothing yet
        before = state.nbytes
        loss_fn(model(torch.randn(B, 4)), torch.randn(B, 2)).backward()
        opt.step()
        after = state.update()
        return before, after, held(comm)["optimizer"]

    param_bytes = sum(p.numel() * 4 for p in make_mlp(SIZES).parameters())
    n_tensors = len(list(make_mlp(SIZES).parameters()))
    # exp_avg and exp_avg_sq: 2 x the parameters; "step": a 0-d float32 per parameter tensor.
    assert launch(prog, 1, "adam").results[0] == (0, 2 * param_bytes + 4 * n_tensors,
                                                   2 * param_bytes + 4 * n_tensors)
    assert launch(prog, 1, "sgd").results[0] == (0, 0, 0)  # plain SGD keeps no state


def test_activations_of_a_linear_relu_mlp_are_the_hand_computed_saved_tensors() -> None:
    def prog(comm, device):  # noqa: ANN001, ANN202
        model = make_mlp(SIZES, device=device)
        x, _ = make_batch(B, 4, 2, device=device)
        with saved_activations(comm, "mb 0") as acts:
            out = model(x)
        during = (acts.nbytes, held(comm)["activations"])
        if device != "meta":
            out.sum().backward()
        acts.free()
        return during, held(comm)["activations"]

    # Linear 1 saves its input x (B x 4); ReLU 1 saves its output (B x 8), which Linear 2
    # saves again as its input (one storage, counted once); the same for ReLU 2 / Linear 3.
    # The weights Linear saves are parameters, not activations.
    expected = 4 * B * (4 + 8 + 8)
    for device in ("cpu", "meta"):
        (nbytes, ledger), after = launch(prog, 1, device).results[0]
        assert nbytes == ledger == expected
        assert after == 0


def test_the_same_tensor_saved_twice_counts_once() -> None:
    def prog(comm):  # noqa: ANN001, ANN202
        w = torch.randn(3, 3, requires_grad=True)
        a = torch.randn(3, 3) @ w  # an activation: (3, 3) float32, 36 bytes
        with saved_activations(comm) as acts:
            y = (a * a).sum()  # mul saves both operands: the same tensor, twice
        y.backward()
        return acts.nbytes

    assert on_one_rank(prog) == 36


def test_the_loss_keeps_its_output_and_target() -> None:
    def prog(comm):  # noqa: ANN001, ANN202
        model = make_mlp(SIZES)
        x, y = make_batch(B, 4, 2)
        with saved_activations(comm) as acts:
            loss_fn(model(x), y).backward()
        return acts.nbytes

    # the MLP's saved tensors, plus mse_loss's output (B x 2) and target (B x 2)
    assert on_one_rank(prog) == 4 * B * (4 + 8 + 8) + 4 * B * (2 + 2)


def test_update_re_measures_and_free_releases() -> None:
    def prog(comm):  # noqa: ANN001, ANN202
        model = make_mlp(SIZES)
        tracked = track_parameters(comm, model)
        first = held(comm)["parameters"]
        model.append(torch.nn.Linear(2, 3))  # the model grows: 4 * (6 + 3) bytes
        tracked.update()
        grown = held(comm)["parameters"]
        tracked.free()
        return first, grown, held(comm)["parameters"]

    first, grown, after = on_one_rank(prog)
    assert grown - first == 4 * (2 * 3 + 3)
    assert after == 0


@pytest.mark.parametrize("category", ["parameters", "activations"])
def test_records_appear_on_the_trace(category: str) -> None:
    def prog(comm):  # noqa: ANN001, ANN202
        model = make_mlp(SIZES)
        track_parameters(comm, model)
        with saved_activations(comm, "forward"):
            model(torch.randn(B, 4))

    trace = launch(prog, 1).trace
    assert any(m.category == category for m in trace.memory)
