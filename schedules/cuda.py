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
from tvm import tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

__all__ = ["GuardedRule", "gpu_rules", "schedule_pass"]

_log = logging.getLogger(__name__)


class GuardedRule(dl.ScheduleRule):
    """A dlight rule whose exceptions mean "does not apply", with the reason kept.

    ``ApplyDefaultSchedule`` lets a rule's exception abort the whole build; guarded, the next
    rule gets the function. ``rejections`` lists ``(function name, reason)`` per exception.
    """

    def __init__(self, rule: dl.ScheduleRule) -> None:
        self.rule = rule
        self.rejections: list[tuple[str, str]] = []

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        try:
            return self.rule.apply(func, target, tunable)
        except Exception as err:  # noqa: BLE001 -- any failure of a heuristic rule = no match
            name = str(func.attrs.get("global_symbol", "?")) if func.attrs else "?"
            reason = f"{type(self.rule).__name__}: {type(err).__name__}: {err}".strip(": ")
            self.rejections.append((name, reason))
            _log.debug("dlight rule rejected %s: %s", name, reason)
            return None

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
