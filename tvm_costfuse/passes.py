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
