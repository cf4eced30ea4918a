"""CostFuse: cost-model-driven operator fusion for Apache TVM (Relax).

Stages, in the order a module flows through them:

- ``zoo``       -- example models (Relax, built with ``relax.frontend.nn``) and frontends.
- ``passes``    -- TVM's pass sequence with the fusion step swappable; ``prepare`` runs the
                   passes before fusion.
- ``graph``     -- ``OpGraph``: a read-only view of the bindings a fusion plan groups.
- ``partition`` -- ``apply_partition``: any legal grouping -> FuseOps-style grouped functions.
- ``measure``   -- build and run on the Relax VM, numerics and timings.
- ``cli``       -- the ``costfuse`` command.
"""

from .graph import OpGraph, build_graph
from .partition import ApplyPartition, PartitionError, apply_partition, fuseops_groups

__all__ = [
    "ApplyPartition",
    "OpGraph",
    "PartitionError",
    "apply_partition",
    "build_graph",
    "fuseops_groups",
]
