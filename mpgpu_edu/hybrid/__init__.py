"""Hybrid parallelism: data parallel x pipeline (DP x PP) on a 2-D device mesh.

- ``mesh``: ``Mesh(dp, pp)``, which rank is which replica and stage, and its process groups.
- ``train``: each replica runs the pipeline on its shard of the batch, then each stage's
  gradients are summed across replicas (``hybrid_train_step``, ``train_hybrid``).
- ``runner``: ``mpgpu-edu run hybrid``, checked against single-device training.
"""

from mpgpu_edu.hybrid.mesh import Mesh, MeshGroups, make_groups
from mpgpu_edu.hybrid.train import all_reduce_gradients, hybrid_train_step, train_hybrid

__all__ = ["Mesh", "MeshGroups", "all_reduce_gradients", "hybrid_train_step", "make_groups",
           "train_hybrid"]
