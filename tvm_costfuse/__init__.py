"""CostFuse: cost-model-driven operator fusion for Apache TVM (Relax).

Stages, in the order a module flows through them:

- ``models``     -- every workload by name: the zoo, synthetic programs, PyTorch/ONNX files.
- ``pipelines``  -- TVM's backend pass sequence with the fusion step swappable (llvm and cuda);
                    ``prepare`` runs the passes before fusion.
- ``graph``      -- ``OpGraph``: a read-only view of the bindings a fusion plan groups.
- ``targets``    -- one resolver: a preset name, a tvm Target or a description -> ``Target``
                    (what to compile for and what to price with).
- ``cost``       -- group features, the analytical, learned and measured cost models.
- ``legality``   -- ``can_fuse``: may a group share a kernel under the config's caps.
- ``planner``    -- greedy priority fusion (and exact search on small graphs) over the model
                    (``pricer`` memoizes its questions); ``quotient`` is the graph of its
                    groups, kept acyclic (each group convex); ``regions`` takes FuseOps'
                    grouping where it is predicted cheaper; ``rule_check`` builds the plan's
                    kernels and hands them to the rules: one that runs as another kernel
                    than priced is priced again as what runs.
- ``partition``  -- ``apply_partition``: any legal grouping -> FuseOps-style grouped functions
                    (the rewrite itself in ``fusor``).
- ``transform``  -- the ``CostFuse`` pass in FuseOps' place; ``config`` holds its knobs.
- ``strategies`` -- none / FuseOps / pattern rules / CostFuse as whole pipelines.
- ``schedules``  -- LLVM-CPU and CUDA schedule rules for the fused kernels (``schedules/``).
- ``measurement``, ``tuning``, ``report`` -- ground truth, the feedback loop, explain/compare.
- ``records``    -- the tuning database those write and the learned model reads.
- ``cli``        -- the ``costfuse`` command.

Where a newcomer adds things: a cost term goes in ``cost/analytical.py`` and the shared feature
schema (``cost/features.py``), which the learned model reads; a kernel kind is a schedule rule
in ``schedules/`` with its card beside it (``schedules/card.py``: which groups it claims, the
numbers it is priced with), its class in ``schedules/classes.py`` and one line in
``schedules/catalog.py``; a target is a preset in ``targets/desc.py``, a new target kind one
record per layer (``schedules/backends.py``, ``cost/analytical.py``, ``tuning/runners.py``,
``report/cells.py``; ``docs/architecture.md``); a model or a frontend goes in ``models/``.

Importing the package registers the ``costfuse.*`` PassContext keys, the named relax pipeline
``"costfuse"`` and the TIR pipeline of that name (``tir_pipeline=``: the kernels' register
tiles on the stack, ``schedules/lowering.py``), registers the host calibration measured on
first use (``targets.calibration``), and sizes TVM's runtime thread pool like the targets it
compiles for (below).
"""

import os

# TVM's runtime thread pool defaults to half the logical CPUs on x86 (it assumes SMT pairs):
# one thread on a 2-vCPU machine, however many cores the kernels were compiled to split work
# over (``host_target`` counts the CPUs this process may run on), and
# ``runtime.config_threadpool`` cannot raise it past that. Measured on a 2-vCPU host: bert
# (full) 31 ms under the default, 16 ms with the pool at 2. The pool reads this when it
# starts, so it is set before any kernel runs; a user's TVM_NUM_THREADS wins.
os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

from . import huge_pages, models
from .config import FusionConfig, register_config_keys
from .graph import OpGraph, build_graph
from .measurement import calibrate as _calibrate  # noqa: F401  (registers first-use calibration)
from .models import load_exported, load_onnx, load_torch
from .partition import ApplyPartition, PartitionError, apply_partition, fuseops_groups
from .pipelines import build_pipeline, pipeline, prepare, register_named_pipeline
from .planner import FusionPlan, plan_exact, plan_greedy
from .schedules.lowering import register_tir_pipeline
from .strategies import strategy_pipeline, tir_pipeline
from .targets import Target, host_target, resolve
from .transform import CostFuse

register_config_keys()
register_named_pipeline()
register_tir_pipeline()

__all__ = [
    "ApplyPartition",
    "CostFuse",
    "FusionConfig",
    "FusionPlan",
    "OpGraph",
    "PartitionError",
    "Target",
    "apply_partition",
    "build_graph",
    "build_pipeline",
    "fuseops_groups",
    "host_target",
    "huge_pages",
    "load_exported",
    "load_onnx",
    "load_torch",
    "models",
    "pipeline",
    "plan_exact",
    "plan_greedy",
    "prepare",
    "resolve",
    "strategy_pipeline",
    "tir_pipeline",
]
