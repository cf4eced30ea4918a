"""CUDA schedules: TVM's dlight GPU rules, each guarded.

:func:`schedule_pass` runs dlight's GPU rules in TVM's order, each guarded, so a rule that
crashes on a PrimFunc falls through to the next rule instead of aborting the build. The
pipeline that places it is ``tvm_costfuse.pipelines.build_pipeline``.

Seen in TVM 0.27: dlight's ``gpu.GEMV`` raises ``AssertionError`` (in
``analysis.gemv.normalize``) on a depthwise conv whose output is 1x1 (small MobileNetV2), which
makes TVM's own CUDA pipeline fail; guarded, ``gpu.Reduction`` schedules it.
"""

from __future__ import annotations

import logging

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

__all__ = ["GuardedRule", "gpu_rules", "schedule_pass"]

_log = logging.getLogger(__name__)


class GuardedRule(dl.ScheduleRule):
    """A dlight rule whose exceptions and ill-formed results mean "does not apply", with the
    reason kept.

    ``ApplyDefaultSchedule`` lets a rule's exception abort the whole build, and takes whatever
    schedule a rule returns; guarded, the next rule gets the function. A result must pass
    ``s_tir.analysis.verify_well_formed``: dlight's ``gpu.Matmul`` on a matmul read by several
    epilogue blocks (LSTM's per-step slices of one input projection) moves the output into a
    local cache for the first one and leaves the others reading the removed buffer, which
    lowering rejects ("... is used before its definition"). ``rejections`` lists
    ``(function name, reason)`` per rejection.
    """

    def __init__(self, rule: dl.ScheduleRule) -> None:
        self.rule = rule
        self.rejections: list[tuple[str, str]] = []

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        try:
            result = self.rule.apply(func, target, tunable)
        except Exception as err:  # noqa: BLE001 -- any failure of a heuristic rule = no match
            return self._reject(func, f"{type(err).__name__}: {err}")
        schedules = result if isinstance(result, list) else [result] if result is not None else []
        if any(not s_tir.analysis.verify_well_formed(s.mod["main"], False) for s in schedules):
            return self._reject(func, "the scheduled PrimFunc is not well formed")
        return result

    def _reject(self, func: tirx.PrimFunc, why: str) -> None:
        name = str(func.attrs.get("global_symbol", "?")) if func.attrs else "?"
        reason = f"{type(self.rule).__name__}: {why}".strip(": ")
        self.rejections.append((name, reason))
        _log.debug("dlight rule rejected %s: %s", name, reason)

    def __repr__(self) -> str:
        return f"GuardedRule({type(self.rule).__name__})"


def gpu_rules() -> list[dl.ScheduleRule]:
    """TVM's CUDA rules in TVM's order (``relax/backend/cuda/pipeline.py``; no LowBatchGEMV)."""
    return [
        dl.gpu.Matmul(),
        dl.gpu.GEMV(),
        dl.gpu.Reduction(),
        dl.gpu.GeneralReduction(),
        dl.gpu.Fallback(),
    ]


def schedule_pass(target: Target) -> tvm.transform.Pass:
    """``ApplyDefaultSchedule`` with :func:`gpu_rules`, each guarded; run after FuseTIR."""
    return dl.ApplyDefaultSchedule(*(GuardedRule(r) for r in gpu_rules()))
