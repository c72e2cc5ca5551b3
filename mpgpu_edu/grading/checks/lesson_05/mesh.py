"""Checks of exercise 5.3: the DP x PP mesh's groups, against ``mpgpu_edu.hybrid.Mesh``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpgpu_edu.grading.checks import CheckFailure
from mpgpu_edu.grading.checks._support import examples, expect
from mpgpu_edu.hybrid import Mesh

Impl = Callable[..., Any]


def _groups_compute(impl: Impl, world_size: int, pp_size: int) -> Any:
    return impl(world_size, pp_size)


def _groups_agree(got: Any, world_size: int, pp_size: int) -> None:
    mesh = Mesh(world_size // pp_size, pp_size)
    want = [[mesh.replica_ranks(d) for d in range(mesh.dp)],
            [mesh.stage_ranks(s) for s in range(mesh.pp)]]
    expect(got == want, f"hybrid_groups({world_size}, {pp_size}) returned {got}, expected "
                        f"{want} (pipeline groups, data groups)")


_BAD_INPUTS = [(6, 4), (4, 0), (0, 1), (-4, 2), (4, -2)]


def _groups_bad_compute(impl: Impl) -> list[Any]:
    """What ``impl`` did with each input it should refuse: raised ValueError, raised another
    exception (its type's name), or returned (what it returned)."""
    outcomes = []
    for world_size, pp_size in _BAD_INPUTS:
        outcome: dict[str, Any] = {"args": [world_size, pp_size]}
        try:
            outcome["returned"] = impl(world_size, pp_size)
        except (NotImplementedError, CheckFailure):  # a stub; a blocked reference
            raise
        except ValueError:
            outcome["raised"] = "ValueError"
        except Exception as exc:  # noqa: BLE001 - reported as what it is, with its input
            outcome["raised"] = type(exc).__name__
        outcomes.append(outcome)
    return outcomes


def _groups_bad_judge(outcomes: list[dict]) -> None:
    for outcome in outcomes:
        world_size, pp_size = outcome["args"]
        if outcome.get("raised") == "ValueError":
            continue
        why = (f"pp_size {pp_size} does not divide world_size {world_size}"
               if world_size >= 1 and pp_size >= 1 else "both must be at least 1")
        did = (f"raised {outcome['raised']}" if "raised" in outcome
               else f"returned {outcome.get('returned')}")
        raise CheckFailure(f"hybrid_groups({world_size}, {pp_size}) {did}; it must raise "
                           f"ValueError ({why})")


def _groups_examples() -> list[dict[str, int]]:
    return [{"world_size": r * p, "pp_size": p}
            for r, p in ((e["replicas"], e["pp_size"])
                         for e in examples(20, 5, replicas=(1, 4), pp_size=(1, 4)))]
