"""TVM pass sequences around fusion, with the fusion step made swappable.

TVM's CPU pipeline (``relax.backend.cpu_generic``) is: library dispatch, LegalizeOps,
AnnotateTIROpPattern, FoldConstant, **FuseOps**, FuseTIR, dataflow lowering, finalize. CostFuse
keeps every step and replaces FuseOps; ``prepare`` runs exactly what TVM runs before FuseOps, so
the OpGraph that plans fusion sees the same module FuseOps would see.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic


def pre_fusion_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """What TVM runs before FuseOps: library dispatch, LegalizeOps, AnnotateTIROpPattern,
    FoldConstant (FoldConstant folds constant weight transposes, which FuseOps never sees)."""
    legalize = [
        p for p in cpu_generic.legalize_passes(target) if p.info.name not in ("FuseOps", "FuseTIR")
    ]
    return cpu_generic.library_dispatch_passes(target) + legalize


def prepare(mod: tvm.IRModule, target: tvm.target.Target | str = "llvm") -> tvm.IRModule:
    """Run the pre-fusion passes: the module FuseOps (or CostFuse) takes as input."""
    target = tvm.target.Target(target)
    with target:
        return tvm.transform.Sequential(pre_fusion_passes(target))(mod)


def fuse(mod: tvm.IRModule, target, fusion: tvm.transform.Pass) -> tvm.IRModule:
    """The module a schedule pass sees: pre-fusion passes, ``fusion``, ``FuseTIR``."""
    target = tvm.target.Target(target)
    mod = prepare(mod, target)
    with target:
        return tvm.transform.Sequential([fusion, relax.transform.FuseTIR()])(mod)


def build_pipeline(
    target: tvm.target.Target | str,
    fusion: tvm.transform.Pass | None = None,
    schedule: tvm.transform.Pass | None = None,
) -> tvm.transform.Pass:
    """TVM's CPU pipeline with ``fusion`` in place of FuseOps (None: fuse nothing) and an
    optional ``schedule`` pass right after FuseTIR."""
    target = tvm.target.Target(target)
    passes = pre_fusion_passes(target)
    passes += [fusion] if fusion is not None else []
    passes += [relax.transform.FuseTIR()]
    passes += [schedule] if schedule is not None else []
    passes += cpu_generic.dataflow_lower_passes(target) + cpu_generic.finalize_passes(target)

    @tvm.transform.module_pass(opt_level=0, name="CostFuseBuildPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def pipeline(target: tvm.target.Target | str | None = None, **config) -> tvm.transform.Pass:
    """TVM's pipeline for ``target`` with CostFuse in FuseOps' place and our schedules after
    FuseTIR: LLVM-CPU rules on llvm, dlight's GPU rules (plus ours) on cuda.

    Use as ``tvm.compile(mod, target, relax_pipeline=tvm_costfuse.pipeline(target))``.
    ``config`` takes CostFuse's arguments (``max_chain_length=...``); PassContext
    ``costfuse.*`` keys apply to what is not given. With no target, the pipeline reads
    ``Target.current()`` when it runs (as the named pipeline ``"costfuse"`` does).
    """
    # Imported here: schedules and the pass import this module.
    from .schedules import schedule_pass as cpu_schedule_pass
    from .schedules.cuda import cuda_pipeline
    from .transform import CostFuse

    def make(t: tvm.target.Target) -> tvm.transform.Pass:
        fusion = CostFuse(target=t, **config)
        if t.kind.name == "cuda":
            return cuda_pipeline(t, fusion)
        if t.kind.name != "llvm":
            raise ValueError(f"CostFuse supports llvm and cuda targets, not {t.kind.name!r}")
        return build_pipeline(t, fusion, cpu_schedule_pass(t))

    if target is not None:
        return make(tvm.target.Target(target))

    @tvm.transform.module_pass(opt_level=0, name="CostFusePipeline")
    def _deferred(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        current = tvm.target.Target.current()
        if current is None:
            raise ValueError("the costfuse pipeline needs a target: call it under `with target`")
        return make(current)(mod)

    return _deferred


def register_named_pipeline() -> None:
    """Register ``"costfuse"`` with ``relax.get_pipeline`` (idempotent)."""
    from tvm.relax.pipeline import PIPELINE_MAP

    if "costfuse" not in PIPELINE_MAP:
        relax.pipeline.register_pipeline("costfuse")(pipeline)
