"""CPU schedules for fused PrimFuncs, and the Relax pipeline that runs them after FuseTIR.

``cpu_pipeline(target, fusion_pass)`` is TVM's ``cpu_generic`` default pipeline with two
changes: the fusion pass is a parameter (so CostFuse's planner, or no fusion at all, can replace
``FuseOps``) and :func:`schedule_pass` runs right after ``FuseTIR``, when every kernel is final.
"""

from __future__ import annotations

import os

import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as _cpu_generic
from tvm.s_tir import dlight as dl
from tvm.target import Target

from .cpu import Contraction, Fallback, RowReduction, rules

__all__ = [
    "Contraction",
    "Fallback",
    "RowReduction",
    "cpu_pipeline",
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


def schedule_pass(target: Target) -> tvm.transform.Pass:
    """``ApplyDefaultSchedule`` with the CPU rules; run it after FuseTIR under ``with target``."""
    return dl.ApplyDefaultSchedule(*rules())


def cpu_pipeline(
    target: Target, fusion_pass: tvm.transform.Pass | None = None
) -> tvm.transform.Pass:
    """TVM's CPU default pipeline with a swappable fusion pass and our schedules after FuseTIR.

    Parameters
    ----------
    target : Target
        An LLVM target, e.g. :func:`host_target`.
    fusion_pass : Pass, optional
        Replaces ``relax.transform.FuseOps()``; None keeps FuseOps. A pass that marks nothing
        ``Primitive`` makes FuseTIR a no-op, i.e. one kernel per op.
    """
    fuse = fusion_pass if fusion_pass is not None else relax.transform.FuseOps()
    passes = (
        _cpu_generic.library_dispatch_passes(target)
        + [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            fuse,
            relax.transform.FuseTIR(),
            schedule_pass(target),
        ]
        + _cpu_generic.dataflow_lower_passes(target)
        + _cpu_generic.finalize_passes(target)
    )

    @tvm.transform.module_pass(opt_level=0, name="CostFuseCPUPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline
