"""CUDA compilation without a GPU: TVM's CUDA pipeline with a swappable fusion pass.

``cuda_pipeline(target, fusion_pass)`` is ``tvm.relax.backend.cuda.pipeline``'s default pipeline
with two changes: the fusion pass is a parameter, and :func:`schedule_pass` (TVM's dlight GPU
rules, in TVM's order) runs each rule guarded, so a rule that crashes on a PrimFunc falls through
to the next rule instead of aborting the build. Codegen to CUDA C needs no GPU (only the CUDA
toolkit's ``nvcc`` for register counts, see ``tvm_costfuse.registers``).

Seen in TVM 0.27: dlight's ``gpu.GEMV`` raises ``AssertionError`` (in
``analysis.gemv.normalize``) on a depthwise conv whose output is 1x1 (small MobileNetV2), which
makes TVM's own CUDA pipeline fail; guarded, ``gpu.Reduction`` schedules it.
"""

from __future__ import annotations

import logging
import re

import tvm
from tvm import relax, tirx
from tvm.relax.backend.cuda import pipeline as _cuda_backend
from tvm.s_tir import dlight as dl
from tvm.target import Target

__all__ = [
    "GuardedRule",
    "compile_cuda",
    "cuda_module",
    "cuda_pipeline",
    "cuda_source",
    "cuda_target",
    "gpu_rules",
    "kernel_sources",
    "schedule_pass",
]

_log = logging.getLogger(__name__)

# Per-block limits of every sm_70+ GPU (and of TVM's nvidia/nvidia-h100 tag). Static shared
# memory above 48 KiB needs an opt-in TVM does not emit, so 48 KiB is the usable limit; dlight
# warns and assumes the same when the attribute is missing.
_SM_LIMITS = {
    "max_num_threads": 1024,
    "max_threads_per_block": 1024,
    "max_shared_memory_per_block": 48 * 1024,
    "registers_per_block": 64 * 1024,
    "thread_warp_size": 32,
}


def cuda_target(arch: str = "sm_90") -> Target:
    """CUDA target for ``arch`` with explicit per-block limits (H100/H200 by default).

    ``Target({"kind": "cuda", "arch": ...})`` alone carries only ``max_num_threads`` (1024) and
    ``thread_warp_size`` (32); dlight's GEMV rules then warn about the missing shared-memory
    limit. There is no H200 tag in TVM 0.27; ``nvidia/nvidia-h100`` is ``sm_90a``.
    """
    return Target({"kind": "cuda", "arch": arch, **_SM_LIMITS})


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


def cuda_pipeline(
    target: Target, fusion_pass: tvm.transform.Pass | None = None
) -> tvm.transform.Pass:
    """TVM's CUDA default pipeline with ``fusion_pass`` in place of FuseOps and guarded rules.

    The pass list is taken from TVM's backend module and edited by pass name, so it follows
    TVM: library dispatch, LegalizeOps, AnnotateTIROpPattern, FoldConstant, *fusion*, FuseTIR,
    *schedule*, dataflow lowering, finalize.

    Parameters
    ----------
    target : Target
        A CUDA target, e.g. :func:`cuda_target`.
    fusion_pass : Pass, optional
        Replaces ``relax.transform.FuseOps()``; None keeps FuseOps.
    """
    fuse = fusion_pass if fusion_pass is not None else relax.transform.FuseOps()
    swap = {"FuseOps": fuse, "ApplyDefaultSchedule": schedule_pass(target)}
    legalize = _cuda_backend.legalize_passes(target)
    missing = set(swap) - {p.info.name for p in legalize}
    if missing:  # TVM changed its pipeline: fail loudly instead of silently not fusing
        raise RuntimeError(f"TVM's CUDA legalize_passes no longer contain {sorted(missing)}")
    passes = (
        _cuda_backend.library_dispatch_passes(target)
        + [swap.get(p.info.name, p) for p in legalize]
        + _cuda_backend.dataflow_lower_passes(target)
        + _cuda_backend.finalize_passes(target)
    )

    @tvm.transform.module_pass(opt_level=0, name="CostFuseCUDAPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def compile_cuda(
    mod: tvm.IRModule,
    target: Target | None = None,
    fusion_pass: tvm.transform.Pass | None = None,
):
    """Build a Relax module for CUDA (no GPU needed); returns the ``VMExecutable``.

    A module of PrimFuncs only (no Relax function) is built as TIR, unscheduled functions
    getting :func:`schedule_pass` first.
    """
    target = target if target is not None else cuda_target()
    if not any(isinstance(f, relax.Function) for f in mod.functions.values()):
        with target:
            mod = schedule_pass(target)(mod)
        return tvm.compile(mod, target=target)
    return tvm.compile(mod, target=target, relax_pipeline=cuda_pipeline(target, fusion_pass))


def cuda_module(ex) -> tvm.runtime.Module:
    """The ``cuda`` runtime module inside an executable's import tree.

    In TVM 0.27 a Relax ``VMExecutable``'s ``.mod`` imports the host ``llvm`` module, which
    imports the ``cuda`` one (``ex.mod.imports[0]`` is host code, not CUDA).
    """
    stack = [getattr(ex, "mod", ex)]
    while stack:
        m = stack.pop()
        if m.kind == "cuda":
            return m
        stack.extend(m.imports)
    raise ValueError("no CUDA module in this executable (no device kernels?)")


def cuda_source(ex) -> str:
    """All kernels' CUDA C as TVM emitted it: one translation unit."""
    return cuda_module(ex).inspect_source()


# TVM writes every kernel as `extern "C" __global__ void [__launch_bounds__(n)] name(...)`, first
# as a forward declaration (`;`) and then defined (`{` ... a `}` alone in column 0).
_KERNEL_HEAD = re.compile(
    r'^extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(.*\)\s*([;{])\s*$',
    re.MULTILINE,
)


def kernel_sources(ex_or_source) -> dict[str, str]:
    """CUDA C per kernel, each a self-contained unit: TVM's preamble plus that kernel.

    Parameters
    ----------
    ex_or_source : VMExecutable, Module or str
        A built executable, or the CUDA source of :func:`cuda_source`.

    Returns
    -------
    dict
        Kernel name (as ptxas reports it, e.g. ``fused_matmul_add_kernel``) -> source, in
        source order.
    """
    src = ex_or_source if isinstance(ex_or_source, str) else cuda_source(ex_or_source)
    heads = list(_KERNEL_HEAD.finditer(src))
    if not heads:
        return {}
    preamble = src[: heads[0].start()]
    out: dict[str, str] = {}
    for m in heads:
        if m.group(2) != "{":
            continue
        end = src.find("\n}", m.end() - 1)
        end = len(src) if end < 0 else end + 2
        out[m.group(1)] = preamble + src[m.start() : end] + "\n"
    return out
