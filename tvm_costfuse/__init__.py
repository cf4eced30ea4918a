"""CostFuse: cost-model-driven operator fusion for Apache TVM (Relax).

Stages, in the order a module flows through them:

- ``zoo``       -- example models (Relax, built with ``relax.frontend.nn``) and frontends.
- ``passes``    -- TVM's pass sequence with the fusion step swappable; ``prepare`` runs the
                   passes before fusion.
- ``graph``     -- ``OpGraph``: a read-only view of the bindings a fusion plan groups.
- ``targets``   -- target descriptions (H100, H200, A100, this host); ``calibrate`` measures it.
- ``cost``      -- group features and the analytical cost model.
- ``legality``  -- ``can_fuse``: may a group share a kernel under the config's caps.
- ``planner``   -- greedy priority fusion (and exact search on small graphs) over the model.
- ``partition`` -- ``apply_partition``: any legal grouping -> FuseOps-style grouped functions.
- ``transform`` -- the ``CostFuse`` pass in FuseOps' place; ``config`` holds its knobs.
- ``schedules`` -- LLVM-CPU and CUDA schedules for the fused kernels (``schedules/``).
- ``measure``   -- build and run on the Relax VM, numerics and timings; ``registers``:
                   ptxas / x86 spill ground truth.
- ``cli``       -- the ``costfuse`` command.

Importing the package registers the ``costfuse.*`` PassContext keys and the named pipeline
``"costfuse"``.
"""

from .config import FusionConfig, register_config_keys
from .graph import OpGraph, build_graph
from .partition import ApplyPartition, PartitionError, apply_partition, fuseops_groups
from .pipelines import pipeline, register_named_pipeline
from .planner import FusionPlan, plan_exact, plan_greedy
from .transform import CostFuse

register_config_keys()
register_named_pipeline()

__all__ = [
    "ApplyPartition",
    "CostFuse",
    "FusionConfig",
    "FusionPlan",
    "OpGraph",
    "PartitionError",
    "apply_partition",
    "build_graph",
    "fuseops_groups",
    "pipeline",
    "plan_exact",
    "plan_greedy",
]
