"""Checks of exercise 7.1: the groups of a 2-level cluster, against
``collectives.hierarchical.node_groups`` and ``rail_groups``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpgpu_edu.collectives.hierarchical import node_groups, rail_groups
from mpgpu_edu.grading.checks._plain import type_name
from mpgpu_edu.grading.checks._support import examples, expect

Impl = Callable[..., Any]


def _groups_compute(impl: Impl, world_size: int, per_node: int) -> Any:
    return impl(world_size, per_node)


def _groups_agree(got: Any, world_size: int, per_node: int) -> None:
    expect(isinstance(got, (list, tuple)) and len(got) == 2,
           f"expected (nodes, rails), a pair of lists, got {type_name(got)}")
    nodes, rails = got
    want_nodes = node_groups(world_size // per_node, per_node)
    want_rails = rail_groups(world_size // per_node, per_node)
    expect(nodes == want_nodes, f"nodes should be {want_nodes}, got {nodes}")
    expect(rails == want_rails, f"rails should be {want_rails} (local rank i of every node), "
                                f"got {rails}")


def _groups_bad_compute(impl: Impl) -> list[str]:
    outcomes = []
    for world_size, per_node in [(6, 4), (4, 0), (0, 2), (5, 2)]:
        try:
            got = impl(world_size, per_node)
            outcomes.append(f"node_and_rail_groups({world_size}, {per_node}) returned "
                            f"{str(got)[:60]}")
        except ValueError:
            outcomes.append("ValueError")
        except NotImplementedError:
            raise  # a stub: not implemented, not a wrong answer
        except Exception as exc:  # noqa: BLE001 - the judge names what it raised instead
            outcomes.append(f"node_and_rail_groups({world_size}, {per_node}) raised "
                            f"{type(exc).__name__}")
    return outcomes


def _groups_bad_judge(outcomes: Any) -> None:
    bad = [o for o in outcomes if o != "ValueError"]
    expect(not bad, "sizes below 1, or ranks that do not fill whole nodes, must raise "
                    "ValueError, but " + ", ".join(bad))


def _groups_examples() -> list[dict[str, int]]:
    drawn = examples(12, 71, nodes=(1, 5), per_node=(1, 6))
    return [dict(world_size=e["nodes"] * e["per_node"], per_node=e["per_node"]) for e in drawn]
