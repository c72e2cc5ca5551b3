"""Collectives on the simulator: results against torch computed directly, and the byte
pattern each algorithm leaves in the communicator's stats."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import (ALGORITHMS, all_gather, all_reduce, broadcast,
                                   broadcast_tree, gather, reduce, reduce_scatter, reduce_tree,
                                   scatter)
from mpgpu_edu.comm import RankError, launch

WORLD_SIZES = [1, 2, 3, 4, 5, 7]
ALGOS = list(ALGORITHMS)
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2,
             torch.bfloat16: 5e-2}


def data(rank: int, numel: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Rank ``rank``'s input: different on every rank, the same on every run."""
    gen = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(numel, generator=gen, dtype=torch.float64).to(dtype)


def oracle(n: int, numel: int, dtype: torch.dtype = torch.float64, op: str = "sum",
           ) -> torch.Tensor:
    """The reduction computed directly by torch, in fp64, from the same inputs."""
    total = torch.stack([data(r, numel, dtype).double() for r in range(n)]).sum(0)
    return total / n if op == "mean" else total


def sizes(n: int) -> list[int]:
    return sorted({0, 1, max(n - 1, 0), 2 * n + 1, 1000})


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = TOLERANCE[got.dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


# ---- all-reduce ---------------------------------------------------------------------------

def _all_reduce(comm, numel, dtype, op, algo):
    tensor = data(comm.rank, numel, dtype)
    assert all_reduce(comm, tensor, op=op, algo=algo) is None  # in place
    return tensor


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_all_reduce_sums_every_size(algo: str, n: int) -> None:
    for numel in sizes(n):
        result = launch(_all_reduce, n, numel, torch.float64, "sum", algo)
        for got in result.results:
            assert_close(got, oracle(n, numel))
            # Each algorithm reduces each element once, so every rank ends bitwise equal.
            assert torch.equal(got, result.results[0])


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16,
                                   torch.bfloat16])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_all_reduce_dtypes_and_ops(algo: str, dtype: torch.dtype, op: str) -> None:
    for n in (3, 4):
        result = launch(_all_reduce, n, 2 * n + 1, dtype, op, algo)
        for got in result.results:
            assert got.dtype == dtype
            assert_close(got, oracle(n, 2 * n + 1, dtype, op))


def _all_reduce_shaped(comm, algo):
    matrix = data(comm.rank, 15).view(3, 5)
    transposed = matrix.t()  # (5, 3), not contiguous
    all_reduce(comm, transposed, algo=algo)
    scalar = torch.tensor(float(comm.rank + 1))
    all_reduce(comm, scalar, algo=algo)
    return matrix, scalar


@pytest.mark.parametrize("algo", ALGOS)
def test_all_reduce_multidim_noncontiguous_and_scalar(algo: str) -> None:
    n = 3
    result = launch(_all_reduce_shaped, n, algo)
    for matrix, scalar in result.results:
        assert_close(matrix.reshape(-1), oracle(n, 15))  # written back through the view
        assert scalar.item() == 6.0


def _all_reduce_meta(comm, numel, algo):
    tensor = torch.empty(numel, dtype=torch.bfloat16, device="meta")
    all_reduce(comm, tensor, op="mean", algo=algo)
    return tensor


@pytest.mark.parametrize("algo", ALGOS)
def test_all_reduce_meta_tensor_costs_bytes_without_data(algo: str) -> None:
    result = launch(_all_reduce_meta, 4, 2**20, algo)
    assert all(t.is_meta and t.shape == (2**20,) for t in result.results)
    assert sum(result.bytes_sent_per_rank) > 0
    assert result.trace.makespan > 0


def test_parameters_can_be_broadcast_and_averaged_in_place() -> None:
    # Data parallel starts by broadcasting rank 0's parameters: leaves that require grad.
    def fn(comm):
        param = torch.nn.Parameter(data(comm.rank, 6).view(2, 3))
        broadcast(comm, param)
        same = param.detach().clone()
        all_reduce(comm, param, op="mean")
        gathered = all_gather(comm, param)
        return same, param, gathered
    for same, param, gathered in launch(fn, 3).results:
        assert torch.equal(same.reshape(-1), data(0, 6))
        assert param.requires_grad and param.grad_fn is None  # still a leaf
        assert_close(param.detach().reshape(-1), data(0, 6))
        assert not any(g.requires_grad for g in gathered)


def test_all_reduce_on_a_sub_group() -> None:
    def fn(comm):
        tensor = data(comm.rank, 7)
        if comm.rank in (0, 2, 3):
            all_reduce(comm.group([0, 2, 3]), tensor)
        return tensor
    result = launch(fn, 4)
    want = data(0, 7) + data(2, 7) + data(3, 7)
    for rank in (0, 2, 3):
        assert_close(result.results[rank], want)
    assert torch.equal(result.results[1], data(1, 7))


def test_unknown_algo_and_op_are_clear_errors() -> None:
    with pytest.raises(RankError) as info:
        launch(lambda comm: all_reduce(comm, torch.ones(3), algo="butterfly"), 2)
    assert isinstance(info.value.original, ValueError)
    assert "naive, tree, ring" in str(info.value.original)
    with pytest.raises(RankError, match="unknown reduction op 'max'"):
        launch(lambda comm: all_reduce(comm, torch.ones(3), op="max"), 2)
    with pytest.raises(RankError, match="floating-point"):
        launch(lambda comm: all_reduce(comm, torch.ones(3, dtype=torch.int64), op="mean"), 2)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 7), numel=st.integers(0, 40), algo=st.sampled_from(ALGOS),
       op=st.sampled_from(["sum", "mean"]))
def test_all_reduce_property(n: int, numel: int, algo: str, op: str) -> None:
    result = launch(_all_reduce, n, numel, torch.float64, op, algo)
    for got in result.results:
        assert_close(got, oracle(n, numel, op=op))


# ---- broadcast, reduce, gather, scatter ---------------------------------------------------

@pytest.mark.parametrize("fn", [broadcast, broadcast_tree])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 7])
def test_broadcast_from_every_root(fn, n: int) -> None:
    def body(comm, root):
        tensor = data(comm.rank, 5)
        fn(comm, tensor, root=root)
        return tensor
    for root in range(n):
        result = launch(body, n, root)
        assert all(torch.equal(t, data(root, 5)) for t in result.results)


@pytest.mark.parametrize("fn", [reduce, reduce_tree])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reduce_to_every_root(fn, n: int, op: str) -> None:
    def body(comm, root):
        tensor = data(comm.rank, 6)
        fn(comm, tensor, root=root, op=op)
        return tensor
    for root in range(n):
        result = launch(body, n, root)
        for rank, got in enumerate(result.results):
            if rank == root:
                assert_close(got, oracle(n, 6, op=op))
            else:  # only the root's tensor changes
                assert torch.equal(got, data(rank, 6))


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_gather_and_scatter(n: int) -> None:
    root = n - 1
    gathered = launch(lambda comm: gather(comm, data(comm.rank, 4).view(2, 2), root), n)
    for rank, got in enumerate(gathered.results):
        if rank == root:
            assert [p.shape for p in got] == [(2, 2)] * n
            assert all(torch.equal(p.reshape(-1), data(r, 4)) for r, p in enumerate(got))
        else:
            assert got is None

    def scatter_fn(comm):
        out = torch.zeros(3, dtype=torch.float64)
        chunks = [data(r, 3) for r in range(n)] if comm.rank == root else None
        scatter(comm, chunks, out, root)
        return out
    scattered = launch(scatter_fn, n)
    assert all(torch.equal(out, data(r, 3)) for r, out in enumerate(scattered.results))


def test_scatter_checks_its_chunks() -> None:
    with pytest.raises(RankError, match="one chunk per rank"):
        launch(lambda comm: scatter(comm, [torch.ones(2)], torch.zeros(2)), 2)
    with pytest.raises(RankError, match="root 5 does not exist"):
        launch(lambda comm: broadcast(comm, torch.ones(2), root=5), 2)


# ---- all-gather and reduce-scatter --------------------------------------------------------

@pytest.mark.parametrize("n", WORLD_SIZES)
def test_all_gather_and_reduce_scatter(n: int) -> None:
    for numel in sizes(n):
        gathered = launch(lambda comm: all_gather(comm, data(comm.rank, numel)), n)
        for got in gathered.results:
            assert len(got) == n
            assert all(torch.equal(p, data(r, numel)) for r, p in enumerate(got))

        def rs(comm):
            tensor = data(comm.rank, numel)
            return reduce_scatter(comm, tensor, "mean"), tensor
        scattered = launch(rs, n)
        want = torch.tensor_split(oracle(n, numel, op="mean"), n)
        for rank, (mine, tensor) in enumerate(scattered.results):
            assert mine.shape == want[rank].shape  # tensor_split's chunks, empty ones too
            assert_close(mine, want[rank])
            assert torch.equal(tensor, data(rank, numel))  # the input is left intact


def test_all_gather_keeps_shape_and_meta() -> None:
    result = launch(lambda comm: all_gather(comm, torch.empty(2, 3, device="meta")), 3)
    assert all(len(parts) == 3 and parts[0].shape == (2, 3) and parts[0].is_meta
               for parts in result.results)
    assert result.bytes_sent_per_rank == [2 * 2 * 3 * 4] * 3


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 7), numel=st.integers(0, 30))
def test_reduce_scatter_property(n: int, numel: int) -> None:
    result = launch(lambda comm: reduce_scatter(comm, data(comm.rank, numel)), n)
    assert_close(torch.cat(result.results), oracle(n, numel))


# ---- byte patterns ------------------------------------------------------------------------

def _run_meta(n: int, numel: int, algo: str):
    fn = lambda comm: all_reduce(comm, torch.empty(numel, device="meta"), algo=algo)  # noqa
    return launch(fn, Cluster.uniform(n, alpha_s=1e-6, beta_Bps=1e9))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7])
def test_ring_sends_2_n_minus_1_over_n_of_the_tensor(n: int) -> None:
    numel = 12 * n  # divisible: exact
    size = numel * 4
    result = _run_meta(n, numel, "ring")
    assert result.bytes_sent_per_rank == [2 * (n - 1) * size // n] * n
    assert result.bytes_received_per_rank == [2 * (n - 1) * size // n] * n
    assert [s.messages_sent for s in result.stats] == [2 * (n - 1)] * n
    assert set(result.bytes_per_link()) == {(r, (r + 1) % n) for r in range(n)}  # a ring
    uneven = _run_meta(n, numel + 1, "ring")  # one chunk is an element longer
    for sent in uneven.bytes_sent_per_rank:
        assert 2 * (n - 1) * size // n <= sent <= 2 * (n - 1) * size // n + 2 * (n - 1) * 4


@pytest.mark.parametrize("n", [2, 3, 5, 7])
def test_naive_root_receives_and_sends_n_minus_1_tensors(n: int) -> None:
    size = 100 * 4
    result = _run_meta(n, 100, "naive")
    assert result.bytes_received_per_rank == [(n - 1) * size] + [size] * (n - 1)
    assert result.bytes_sent_per_rank == [(n - 1) * size] + [size] * (n - 1)


@pytest.mark.parametrize("n", [2, 3, 5, 7, 8])
def test_tree_root_sends_log2_n_tensors(n: int) -> None:
    size = 100 * 4
    result = _run_meta(n, 100, "tree")
    rounds = (n - 1).bit_length()
    assert result.bytes_sent_per_rank[0] == rounds * size
    assert result.bytes_received_per_rank[0] == rounds * size
    assert sum(result.bytes_sent_per_rank) == 2 * (n - 1) * size  # each tree edge twice
