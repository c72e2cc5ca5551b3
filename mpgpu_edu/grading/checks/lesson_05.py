"""Checks of lesson 05: column-parallel linear, ZeRO-1 Adam, the DP x PP mesh, Megatron's MLP.

Every case has a *compute* half (runs the learner's function on the simulator, returns plain
data) and a *judge* half (rebuilds the same inputs from the case's seed and compares).
Oracles: ``torch.nn.functional.linear`` and an unsplit MLP under autograd on the whole
weights, ``torch.optim.Adam`` on the whole parameter vector with the *mean* gradient (its
moments too: Adam's update hides a gradient's scale, its moments do not),
``mpgpu_edu.hybrid.Mesh`` for the groups. Structure: FLOPs per rank from the simulator's
compute events, bytes per rank, optimizer state per rank, bytes sent in the forward and in
the backward (an all-reduce of S bytes on N ranks sends 2 (N - 1) S in all, whatever its
algorithm).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from mpgpu_edu.grading.checks import Case, CheckFailure
from mpgpu_edu.grading.checks._plain import is_tensor, type_name
from mpgpu_edu.grading.checks._support import (bytes_of, compute_examples, examples, expect,
                                               expect_close, judge_examples, launch_facts,
                                               run_spmd, uniform)
from mpgpu_edu.hybrid import Mesh

Impl = Callable[..., Any]
Judge = Callable[[Any], None]


def _each(configs: list[dict[str, Any]], compute_one: Callable[..., Any],
          judge_one: Callable[..., None]) -> tuple[Impl, Judge]:
    """compute and judge halves over fixed examples (the first failure is reported)."""
    return (lambda impl: compute_examples(lambda **c: compute_one(impl, **c), configs),
            lambda records: judge_examples(records, judge_one))


def _hidden(count: int, seed: int, compute_one: Callable[..., Any],
            judge_one: Callable[..., None], **ranges: tuple[int, int]) -> tuple[Impl, Judge]:
    return _each(examples(count, seed, **ranges), compute_one, judge_one)


# ---- 5.1 column-parallel linear -------------------------------------------------------------

def _column_inputs(n: int, batch: int, d_in: int, k: int, bias: int, seed: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, d_in, generator=generator)
    weight = torch.randn(n * k, d_in, generator=generator)
    b = torch.randn(n * k, generator=generator) if bias else None
    return x, weight, b


def _column_compute(impl: Impl, n: int, batch: int, d_in: int, k: int, bias: int = 1,
                    seed: int = 0) -> dict[str, Any]:
    x, weight, b = _column_inputs(n, batch, d_in, k, bias, seed)

    def program(comm: Any) -> Any:
        rows = slice(comm.rank * k, (comm.rank + 1) * k)
        bias_shard = b[rows].clone() if b is not None else None
        with comm.compute("forward", "column-parallel linear"):
            return impl(comm, x.clone(), weight[rows].clone(), bias_shard)

    result = run_spmd(program, uniform(n))
    facts = launch_facts(result)
    facts["flops"] = [float(sum(e.flops for e in result.trace.on(r, "compute")))
                      for r in range(n)]
    return facts


def _column_values(facts: dict, n: int, batch: int, d_in: int, k: int, bias: int = 1,
                   seed: int = 0) -> None:
    x, weight, b = _column_inputs(n, batch, d_in, k, bias, seed)
    want = F.linear(x, weight, b)
    for rank, got in enumerate(facts["results"]):
        expect_close(got, want, f"N={n}, x {list(x.shape)}, W {list(weight.shape)}"
                                f"{'' if bias else ', no bias'}: rank {rank}'s output")


def _column_flops(facts: dict, n: int, batch: int, d_in: int, k: int, **_: Any) -> None:
    _column_values(facts, n, batch, d_in, k)
    share = 2 * batch * d_in * k
    for rank, flops in enumerate(facts["flops"]):
        expect(flops <= 1.5 * share,
               f"rank {rank} spent {flops:.0f} FLOPs; its slice of the layer is {share} "
               f"(1/{n} of {n * share})")


def _column_traffic(facts: dict, n: int, batch: int, d_in: int, k: int, **_: Any) -> None:
    _column_values(facts, n, batch, d_in, k)
    want = (n - 1) * bytes_of(batch * k)
    for rank, stats in enumerate(facts["stats"]):
        sent = stats["bytes_sent"]
        expect(sent <= want, f"rank {rank} sent {sent} bytes; all-gathering the output "
                             f"slices (N-1 of {bytes_of(batch * k)} bytes) takes {want}")


_COLUMN_SHAPES = [dict(n=4, batch=3, d_in=6, k=2), dict(n=2, batch=5, d_in=4, k=3),
                  dict(n=1, batch=2, d_in=3, k=4), dict(n=3, batch=2, d_in=5, k=2, bias=0)]
_COLUMN_BIG = [dict(n=4, batch=8, d_in=16, k=4)]


# ---- 5.2 ZeRO-1 ----------------------------------------------------------------------------------

LR = 0.01


def _zero1_inputs(n: int, shard: int, steps: int, seed: int
                  ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(n * shard, generator=generator)
    grads = [[torch.randn(n * shard, generator=generator) for _ in range(n)]
             for _ in range(steps)]
    return start, grads


def _zero1_compute(impl: Impl, n: int, shard: int, steps: int, seed: int = 0
                   ) -> dict[str, Any]:
    start, grads = _zero1_inputs(n, shard, steps, seed)

    def program(comm: Any) -> dict[str, Any]:
        params, state = start.clone(), {}
        for step in range(steps):
            impl(comm, params, grads[step][comm.rank].clone(), state, LR)
        return {"params": params, "state": state}

    return launch_facts(run_spmd(program, uniform(n)))


def _zero1_reference(n: int, shard: int, steps: int, seed: int) -> tuple[torch.Tensor, dict]:
    start, grads = _zero1_inputs(n, shard, steps, seed)
    reference = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([reference], lr=LR)
    for step in range(steps):
        reference.grad = torch.stack(grads[step]).mean(0)
        optimizer.step()
    return reference.detach(), optimizer.state[reference]


def _zero1_params(facts: dict, n: int, shard: int, steps: int, seed: int = 0) -> None:
    want, _ = _zero1_reference(n, shard, steps, seed)
    for rank, out in enumerate(facts["results"]):
        expect_close(out["params"], want, f"N={n}, {n * shard} parameters, {steps} steps: "
                                          f"rank {rank}'s parameters against "
                                          "torch.optim.Adam on the mean gradient")


def _zero1_moments(facts: dict, n: int, shard: int, steps: int, seed: int = 0) -> None:
    _, ref_state = _zero1_reference(n, shard, steps, seed)
    for rank, out in enumerate(facts["results"]):
        state = out["state"]
        expect(isinstance(state, dict), f"rank {rank}: state is a {type_name(state)}, not "
                                        "the dict it was given")
        for key, meaning in (("exp_avg", "first moment"), ("exp_avg_sq", "second moment")):
            expect(is_tensor(state.get(key)), f"rank {rank}'s state holds no tensor "
                                              f"{key!r} (Adam's {meaning}, as adam_update "
                                              "keeps it)")
            want = torch.tensor_split(ref_state[key], n)[rank]
            expect_close(state[key], want, f"N={n}, {steps} steps: rank {rank}'s {key} "
                                           f"against torch.optim.Adam's {key} of shard {rank} "
                                           "on the mean gradient")


def _zero1_state(facts: dict, n: int, shard: int, **_: Any) -> None:
    for rank, out in enumerate(facts["results"]):
        state = out["state"]
        expect(isinstance(state, dict), f"rank {rank}: state is a {type_name(state)}, not "
                                        "the dict it was given")
        held = sum(v.numel() for v in state.values() if is_tensor(v))
        expect(held == 2 * shard, f"rank {rank} keeps {held} numbers of optimizer state; "
                                  f"Adam's two moments for its shard of {shard} parameters are "
                                  f"{2 * shard} (1/{n} of the {2 * n * shard} plain Adam keeps)")


def _zero1_traffic(facts: dict, n: int, shard: int, steps: int, **_: Any) -> None:
    want = steps * 2 * (n - 1) * bytes_of(shard)
    for rank, stats in enumerate(facts["stats"]):
        sent = stats["bytes_sent"]
        expect(sent <= want, f"rank {rank} sent {sent} bytes in {steps} steps; a "
                             f"reduce-scatter and an all-gather per step send {want}")


def _zero1_all(facts: dict, **example: Any) -> None:
    _zero1_params(facts, **example)
    _zero1_moments(facts, **example)
    _zero1_state(facts, **example)


_ZERO1_VALUES = [dict(n=4, shard=3, steps=3), dict(n=1, shard=5, steps=2)]


# ---- 5.3 the mesh --------------------------------------------------------------------------------

def _groups_compute(impl: Impl, world_size: int, pp_size: int) -> Any:
    return impl(world_size, pp_size)


def _groups_agree(got: Any, world_size: int, pp_size: int) -> None:
    mesh = Mesh(world_size // pp_size, pp_size)
    want = [[mesh.replica_ranks(d) for d in range(mesh.dp)],
            [mesh.stage_ranks(s) for s in range(mesh.pp)]]
    expect(got == want, f"hybrid_groups({world_size}, {pp_size}) returned {got}, expected "
                        f"{want} (pipeline groups, data groups)")


def _groups_bad_compute(impl: Impl) -> list[Any]:
    outcomes = []
    for world_size, pp_size in [(6, 4), (4, 0)]:
        try:
            outcomes.append({"args": [world_size, pp_size], "returned": impl(world_size, pp_size)})
        except ValueError:
            outcomes.append({"args": [world_size, pp_size], "raised": "ValueError"})
    return outcomes


def _groups_bad_judge(outcomes: list[dict]) -> None:
    for outcome in outcomes:
        if outcome.get("raised") != "ValueError":
            world_size, pp_size = outcome["args"]
            raise CheckFailure(f"hybrid_groups({world_size}, {pp_size}) returned "
                               f"{outcome.get('returned')} instead of raising ValueError "
                               f"(pp_size {pp_size} does not divide world_size {world_size})")


def _groups_examples() -> list[dict[str, int]]:
    return [{"world_size": r * p, "pp_size": p}
            for r, p in ((e["replicas"], e["pp_size"])
                         for e in examples(20, 5, replicas=(1, 4), pp_size=(1, 4)))]


# ---- 5.4 Megatron's MLP ----------------------------------------------------------------------

def _mlp_inputs(n: int, batch: list[int], d_in: int, hidden: int, d_out: int, bias: int,
                seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    tensors = {"x": torch.randn(*batch, d_in, generator=generator),
               "w1": torch.randn(hidden, d_in, generator=generator) / d_in ** 0.5,
               "b1": torch.randn(hidden, generator=generator) if bias else None,
               "w2": torch.randn(d_out, hidden, generator=generator) / hidden ** 0.5,
               "b2": torch.randn(d_out, generator=generator) if bias else None,
               "dy": torch.randn(*batch, d_out, generator=generator)}
    return tensors


def _mlp_compute(impl: Impl, n: int, batch: list[int], d_in: int, hidden: int, d_out: int,
                 bias: int = 1, seed: int = 0) -> dict[str, Any]:
    t = _mlp_inputs(n, batch, d_in, hidden, d_out, bias, seed)

    def program(comm: Any) -> dict[str, Any]:
        mine = {"x": t["x"].clone(),
                "w1": torch.tensor_split(t["w1"], n, 0)[comm.rank].clone(),
                "b1": torch.tensor_split(t["b1"], n)[comm.rank].clone() if bias else None,
                "w2": torch.tensor_split(t["w2"], n, 1)[comm.rank].clone(),
                "b2": t["b2"].clone() if bias else None}
        for leaf in mine.values():
            if leaf is not None:
                leaf.requires_grad_(True)
        out = impl(comm, mine["x"], mine["w1"], mine["b1"], mine["w2"], mine["b2"])
        forward_sent = comm.stats.bytes_sent
        record: dict[str, Any] = {"out": out, "forward_sent": forward_sent}
        if not (isinstance(out, torch.Tensor) and out.requires_grad
                and out.shape == t["dy"].shape):
            record["no_backward"] = True
            return record
        out.backward(t["dy"].clone())
        record["backward_sent"] = comm.stats.bytes_sent - forward_sent
        record["grads"] = {name: (leaf.grad if leaf is not None else "no tensor")
                           for name, leaf in mine.items()}
        return record

    return launch_facts(run_spmd(program, uniform(n)))


def _mlp_reference(n: int, batch: list[int], d_in: int, hidden: int, d_out: int,
                   bias: int, seed: int) -> tuple[dict[str, Any], torch.Tensor, dict]:
    t = _mlp_inputs(n, batch, d_in, hidden, d_out, bias, seed)
    leaves = {k: v.clone().requires_grad_(True) for k, v in t.items()
              if k != "dy" and v is not None}
    out = F.linear(F.gelu(F.linear(leaves["x"], leaves["w1"], leaves.get("b1"))),
                   leaves["w2"], leaves.get("b2"))
    out.backward(t["dy"])
    return t, out.detach(), {k: v.grad for k, v in leaves.items()}


def _where(n: int, batch: list[int], d_in: int, hidden: int, d_out: int, bias: int) -> str:
    return (f"N={n}, x {[*batch, d_in]}, {hidden} hidden features, {d_out} outputs"
            f"{'' if bias else ', no biases'}")


def _mlp_forward(facts: dict, n: int, batch: list[int], d_in: int, hidden: int, d_out: int,
                 bias: int = 1, seed: int = 0) -> None:
    _, want, _ = _mlp_reference(n, batch, d_in, hidden, d_out, bias, seed)
    where = _where(n, batch, d_in, hidden, d_out, bias)
    for rank, record in enumerate(facts["results"]):
        expect_close(record["out"], want, f"{where}: rank {rank}'s output against the unsplit "
                                          "MLP", rtol=1e-4, atol=1e-5)


def _backward_ran(record: dict, rank: int, where: str) -> None:
    expect(not record.get("no_backward"),
           f"{where}: rank {rank}'s output is not attached to the autograd graph of its "
           "inputs, so no backward can reach x and the shards")


def _mlp_input_grad(facts: dict, n: int, batch: list[int], d_in: int, hidden: int,
                    d_out: int, bias: int = 1, seed: int = 0) -> None:
    _, _, grads = _mlp_reference(n, batch, d_in, hidden, d_out, bias, seed)
    where = _where(n, batch, d_in, hidden, d_out, bias)
    for rank, record in enumerate(facts["results"]):
        _backward_ran(record, rank, where)
        got = record["grads"]["x"]
        expect(is_tensor(got), f"{where}: after backward, rank {rank}'s x has no gradient")
        expect_close(got, grads["x"], f"{where}: rank {rank}'s x.grad against the unsplit "
                                      "MLP's input gradient", rtol=1e-4, atol=1e-5)


def _mlp_weight_grads(facts: dict, n: int, batch: list[int], d_in: int, hidden: int,
                      d_out: int, bias: int = 1, seed: int = 0) -> None:
    _, _, grads = _mlp_reference(n, batch, d_in, hidden, d_out, bias, seed)
    where = _where(n, batch, d_in, hidden, d_out, bias)
    for rank, record in enumerate(facts["results"]):
        _backward_ran(record, rank, where)
        wants = {"w1": torch.tensor_split(grads["w1"], n, 0)[rank],
                 "w2": torch.tensor_split(grads["w2"], n, 1)[rank]}
        if bias:
            wants["b1"] = torch.tensor_split(grads["b1"], n)[rank]
            wants["b2"] = grads["b2"]
        for name, want in wants.items():
            got = record["grads"][name]
            what = "the whole" if name == "b2" else f"shard {rank} of the"
            expect(is_tensor(got), f"{where}: after backward, rank {rank}'s {name} has no "
                                   f"gradient (expected {what} unsplit MLP's)")
            expect_close(got, want, f"{where}: rank {rank}'s {name}.grad against {what} "
                                    f"unsplit MLP's {name} gradient", rtol=1e-4, atol=1e-5)


def _one_all_reduce_each_way(facts: dict, n: int, batch: list[int], d_in: int, hidden: int,
                             d_out: int, bias: int = 1, seed: int = 0) -> None:
    _mlp_forward(facts, n, batch, d_in, hidden, d_out, bias, seed)
    where = _where(n, batch, d_in, hidden, d_out, bias)
    tokens = 1
    for size in batch:
        tokens *= size
    records = facts["results"]
    for phase, key, numel, what in (("forward", "forward_sent", tokens * d_out, "output"),
                                    ("backward", "backward_sent", tokens * d_in,
                                     "input's gradient")):
        if phase == "backward":
            for rank, record in enumerate(records):
                _backward_ran(record, rank, where)
        sent = sum(record[key] for record in records)
        one = 2 * (n - 1) * bytes_of(numel)
        if sent != one:
            count = f" ({sent / one:.2g} all-reduces' worth)" if one else ""
            raise CheckFailure(f"{where}: the {phase} sent {sent} bytes in all{count}; one "
                               f"all-reduce of the {bytes_of(numel)}-byte {what} sends "
                               f"2(N-1) x {bytes_of(numel)} = {one} on {n} ranks")


def _mlp_everything(facts: dict, **example: Any) -> None:
    _mlp_forward(facts, **example)
    _mlp_input_grad(facts, **example)
    _mlp_weight_grads(facts, **example)
    _one_all_reduce_each_way(facts, **example)


_MLP_MAIN = [dict(n=4, batch=[3], d_in=6, hidden=8, d_out=5),
             dict(n=2, batch=[4], d_in=3, hidden=6, d_out=2)]
_MLP_UNEVEN = [dict(n=4, batch=[2], d_in=5, hidden=7, d_out=3),
               dict(n=4, batch=[3], d_in=4, hidden=3, d_out=2),
               dict(n=3, batch=[2], d_in=3, hidden=4, d_out=3, bias=0)]


def _mlp_hidden_examples() -> list[dict[str, Any]]:
    drawn = examples(12, 54, n=(1, 5), b=(1, 3), t=(1, 3), d_in=(1, 6), hidden=(1, 12),
                     d_out=(1, 5), bias=(0, 1))
    return [dict(n=e["n"], batch=[e["b"], e["t"]] if e["t"] > 1 else [e["b"]],
                 d_in=e["d_in"], hidden=e["hidden"], d_out=e["d_out"], bias=e["bias"],
                 seed=i) for i, e in enumerate(drawn)]


def _case(name: str, points: int, halves: tuple[Impl, Judge], hidden: bool = False) -> Case:
    return Case(name, points, halves[0], halves[1], hidden=hidden)


CASES: dict[str, list[Case]] = {
    "5.1": [
        _case("the full output on every rank, with and without a bias", 1,
              _each(_COLUMN_SHAPES, _column_compute, _column_values)),
        _case("each rank computes 1/N of the FLOPs", 1,
              _each(_COLUMN_BIG, _column_compute, _column_flops)),
        _case("traffic: an all-gather of the output", 1,
              _each(_COLUMN_BIG, _column_compute, _column_traffic)),
        _case("hidden: random shapes", 1,
              _hidden(15, 51, _column_compute, _column_values, n=(1, 4), batch=(1, 4),
                      d_in=(1, 5), k=(1, 3), bias=(0, 1)), hidden=True),
    ],
    "5.2": [
        _case("matches torch.optim.Adam on the mean gradient", 1,
              _each(_ZERO1_VALUES, _zero1_compute, _zero1_params)),
        _case("Adam's moments are the mean gradient's, shard by shard", 2,
              _each(_ZERO1_VALUES, _zero1_compute, _zero1_moments)),
        _case("optimizer state per rank is 1/N", 1,
              _each([dict(n=4, shard=5, steps=2)], _zero1_compute, _zero1_state)),
        _case("traffic: a reduce-scatter and an all-gather", 1,
              _each([dict(n=4, shard=6, steps=2)], _zero1_compute, _zero1_traffic)),
        _case("hidden: random sizes", 1,
              _hidden(12, 52, _zero1_compute, _zero1_all, n=(1, 4), shard=(1, 4),
                      steps=(1, 3)), hidden=True),
    ],
    "5.3": [
        _case("the docstring's example; 2 x 4, 4 x 2, 1 stage, 1 replica", 1,
              _each([dict(world_size=w, pp_size=p)
                     for w, p in [(4, 2), (8, 4), (8, 2), (3, 1), (3, 3)]],
                    _groups_compute, _groups_agree)),
        Case("pp_size must divide world_size", 1, _groups_bad_compute, _groups_bad_judge),
        _case("hidden: random meshes", 1,
              _each(_groups_examples(), _groups_compute, _groups_agree), hidden=True),
    ],
    "5.4": [
        _case("forward: the unsplit MLP's output on every rank", 3,
              _each(_MLP_MAIN, _mlp_compute, _mlp_forward)),
        _case("backward: x.grad is the unsplit MLP's input gradient on every rank", 2,
              _each(_MLP_MAIN, _mlp_compute, _mlp_input_grad)),
        _case("backward: each rank's weight gradients are its shards of the unsplit MLP's; "
              "b2's is whole", 3,
              _each(_MLP_MAIN, _mlp_compute, _mlp_weight_grads)),
        _case("traffic: one all-reduce of the output forward, one of x's gradient backward", 2,
              _each(_MLP_MAIN, _mlp_compute, _one_all_reduce_each_way)),
        _case("hidden features not a multiple of N: 7 or 3 on 4 ranks, and 4 on 3 ranks "
              "without biases", 1,
              _each(_MLP_UNEVEN, _mlp_compute, _mlp_everything)),
        _case("hidden: other sizes, world sizes 1-5 and (B, T, d) inputs", 2,
              _each(_mlp_hidden_examples(), _mlp_compute, _mlp_everything), hidden=True),
    ],
}
