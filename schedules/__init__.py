"""Schedules for fused PrimFuncs: LLVM-CPU rules here (``cpu``), CUDA in ``cuda``.

:func:`schedule_pass` (CPU) and ``cuda.schedule_pass`` run right after ``FuseTIR``, when every
kernel is final; ``tvm_costfuse.pipelines.default_schedule`` picks one per target kind.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import dlight as dl
from tvm.target import Target

from ._loops import int32_partition_loops
from .cpu import Attention, Contraction, Fallback, RowReduction, first_rule, rules
from .fast_math import fast_math_pass
from .math_calls import scalar_math_loops
from .prepack import mark_constant_weights, pack_constants

__all__ = [
    "Attention",
    "Contraction",
    "Fallback",
    "RowReduction",
    "finish_pass",
    "first_rule",
    "rules",
    "schedule_pass",
]

def schedule_pass(target: Target, prepack: bool = True,
                  fast_math: bool = True) -> tvm.transform.Pass:
    """``ApplyDefaultSchedule`` with the CPU rules; run it after FuseTIR under ``with target``.

    Around it, constant contraction weights are marked and then packed tile-major at compile
    time (``prepack``). The marking comes after any tuned schedules were applied (they match
    their database records by the unmarked PrimFunc) and the rules skip scheduled PrimFuncs.
    ``prepack=False`` leaves every weight in its own layout (``scripts/research/prepack_effect.py``).
    Last, float32 exp/log/tanh/sigmoid/erf calls in every kernel become vectorizable
    expressions (``fast_math``; ``fast_math=False`` keeps the scalar libm calls, for
    comparisons).
    """
    passes = [dl.ApplyDefaultSchedule(*rules())]
    if prepack:
        passes = [mark_constant_weights, *passes, pack_constants]
    passes.append(finish_pass(fast_math))
    return tvm.transform.Sequential(passes, name="CostFuseCPUSchedules")


def finish_pass(fast_math: bool = True) -> tvm.transform.Pass:
    """What every CPU kernel goes through after the rules scheduled it: the loops the rules
    hinted for partitioning (whole vectors and a tail) get int32 variables, so that TVM's
    loop partitioning peels their tails when the kernel is lowered, then the float32 math calls
    become vectorizable expressions. Anything that times a kernel alone (the feedback loop)
    applies it too, or it times scalar libm calls and guarded vector loops the model's build
    never runs. Last, a vectorized loop calling a math function LLVM cannot widen (sinh,
    cosh) becomes serial again."""
    passes = [int32_partition_loops] + ([fast_math_pass] if fast_math else [])
    passes.append(scalar_math_loops)  # what has no vector form stays a scalar loop
    return tvm.transform.Sequential(passes, name="CostFuseCPUFinish")
