"""The ranks of a data-parallel x pipeline-parallel mesh and their groups, as a grid."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from mpgpu_edu.viz.devicebox import ARROW_COLOR, LOGICAL_FACE, draw_box, draw_text
from mpgpu_edu.viz.palette import FONT_SIZE, OKABE_ITO, new_figure

def mesh_coords(mesh: Any) -> dict[int, tuple[int, int]]:
    """``{rank: (dp index, pp index)}`` of a mesh with ``dp`` and ``pp`` sizes. Uses the mesh's
    own ``coords(rank)`` when it has one; otherwise ranks run along the pipeline first
    (rank = dp index * pp + pp index), so one replica's stages are neighbours."""
    dp, pp = int(mesh.dp), int(mesh.pp)
    if dp < 1 or pp < 1:
        raise ValueError(f"a mesh needs dp >= 1 and pp >= 1, got dp={dp}, pp={pp}")
    if callable(getattr(mesh, "coords", None)):
        return {r: tuple(mesh.coords(r)) for r in range(dp * pp)}
    return {d * pp + p: (d, p) for d in range(dp) for p in range(pp)}


def plot_mesh(mesh: Any) -> Figure:
    """The ranks of a DP x PP mesh as a grid: a column per pipeline stage (pp index), a row per
    replica (dp index), each box "rank r / dp d, pp p". A pp group (one replica's pipeline,
    which passes activations along) is outlined along its row; a dp group (one stage's
    replicas, which all-reduce that stage's gradients) along its column."""
    coords = mesh_coords(mesh)
    dp, pp = int(mesh.dp), int(mesh.pp)
    ax = new_figure(1.6 * pp + 2.6, 0.95 * dp + 1.6).add_subplot()
    pp_colour, dp_colour = OKABE_ITO["vermillion"], OKABE_ITO["bluish_green"]
    for rank, (d, p) in coords.items():
        y = dp - 1 - d
        draw_box(ax, p + 0.12, y + 0.16, 0.76, 0.68, f"rank:{rank}", face=LOGICAL_FACE,
                 edge=ARROW_COLOR)
        draw_text(ax, p + 0.5, y + 0.6, f"rank {rank}", "rank-name", fontweight="bold")
        draw_text(ax, p + 0.5, y + 0.36, f"dp {d}, pp {p}", "rank-coords", size=FONT_SIZE - 2)
    for d in range(dp):
        ax.add_patch(Rectangle((0.05, dp - 1 - d + 0.1), pp - 0.1, 0.8, facecolor="none",
                               edgecolor=pp_colour, linewidth=1.6, gid=f"pp-group:{d}"))
        for p in range(pp - 1):
            ax.add_patch(FancyArrowPatch((p + 0.88, dp - 0.5 - d), (p + 1.12, dp - 0.5 - d),
                                         arrowstyle="-|>", mutation_scale=10, color=pp_colour))
    for p in range(pp):
        ax.add_patch(Rectangle((p + 0.08, 0.05), 0.84, dp - 0.1, facecolor="none",
                               edgecolor=dp_colour, linewidth=1.6, linestyle="--",
                               gid=f"dp-group:{p}"))
    ax.set_xlim(-0.05, pp + 0.05)
    ax.set_ylim(-0.05, dp + 0.05)
    ax.set_xticks([p + 0.5 for p in range(pp)], [f"stage {p}" for p in range(pp)])
    ax.set_yticks([dp - 0.5 - d for d in range(dp)], [f"replica {d}" for d in range(dp)])
    ax.tick_params(length=0, labelsize=FONT_SIZE - 1, top=True, labeltop=True, bottom=False,
                   labelbottom=False)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.legend(handles=[
        Patch(facecolor="none", edgecolor=pp_colour, linewidth=1.6,
              label="pp group: one replica's pipeline (sends activations, gradients)"),
        Patch(facecolor="none", edgecolor=dp_colour, linewidth=1.6, linestyle="--",
              label="dp group: one stage's replicas (all-reduce its gradients)")],
        loc="upper left", bbox_to_anchor=(0.0, 0.0), frameon=False, fontsize=FONT_SIZE - 1)
    ax.set_title(f"{dp} x {pp} mesh: {dp} data-parallel replicas of a {pp}-stage pipeline, "
                 f"{dp * pp} ranks", loc="left", fontsize=FONT_SIZE + 1, pad=16)
    return ax.figure
