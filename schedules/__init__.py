"""Schedules for fused PrimFuncs: LLVM-CPU rules here (``cpu``), CUDA in ``cuda``.

:func:`schedule_pass` runs right after ``FuseTIR``, when every kernel is final; the pipelines
that place it are ``tvm_costfuse.passes.build_pipeline`` (CPU) and ``cuda.cuda_pipeline``.
"""

from __future__ import annotations

import os

import tvm
from tvm.s_tir import dlight as dl
from tvm.target import Target

from .cpu import Contraction, Fallback, RowReduction, rules
from .prepack import mark_constant_weights, pack_constants

__all__ = [
    "Contraction",
    "Fallback",
    "RowReduction",
    "host_target",
    "rules",
    "schedule_pass",
]


def host_target(num_cores: int | None = None) -> Target:
    """LLVM target for this machine's CPU, with its real ISA.

    ``mcpu="native"`` silently becomes generic SSE2 in TVM 0.27, and string targets with flags
    are rejected, hence the dict form with the name LLVM detects.

    Parameters
    ----------
    num_cores : int, optional
        Threads the kernels may use; defaults to the cores this process may run on.
    """
    n = num_cores if num_cores is not None else len(os.sched_getaffinity(0))
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    return Target({"kind": "llvm", "mcpu": cpu, "num-cores": int(n)})


def schedule_pass(target: Target, prepack: bool = True) -> tvm.transform.Pass:
    """``ApplyDefaultSchedule`` with the CPU rules; run it after FuseTIR under ``with target``.

    Around it, constant contraction weights are marked and then packed tile-major at compile
    time (``prepack``). The marking comes after any tuned schedules were applied (they match
    their database records by the unmarked PrimFunc) and the rules skip scheduled PrimFuncs.
    ``prepack=False`` leaves every weight in its own layout (``scripts/prepack_effect.py``).
    """
    if not prepack:
        return dl.ApplyDefaultSchedule(*rules())
    return tvm.transform.Sequential(
        [mark_constant_weights, dl.ApplyDefaultSchedule(*rules()), pack_constants],
        name="CostFuseCPUSchedules")
