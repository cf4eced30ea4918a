"""Every pipeline CostFuse builds: TVM's backend pass sequence with the fusion step swappable.

TVM's backends run library dispatch, LegalizeOps, AnnotateTIROpPattern, FoldConstant,
**FuseOps**, FuseTIR, (on CUDA: dlight's ApplyDefaultSchedule,) dataflow lowering, finalize.
:func:`build_pipeline` keeps every step, puts a given fusion pass in FuseOps' place and a given
schedule pass after FuseTIR; which backend's steps it takes is the target kind's
record (:func:`~tvm_costfuse.schedules.backend`). Ahead of them all it folds weight-only work
(:mod:`.fold`: batch norms into convolutions, summed convolution branches into one), for every
fusion strategy alike, so that strategies still differ by fusion alone; CostFuse's pipelines
then combine sibling matmuls where its cost model says so (:mod:`.horizontal`), a fusion
decision that needs the high-level matmuls. :func:`prepare` runs what every pipeline runs
before the fusion slot (not the sibling step: ``costfuse explain`` runs it first), so the
OpGraph that plans fusion sees the module FuseOps would see.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .fold import FoldWeights
from .horizontal import CombineSiblings
from .layouts import ChannelsLast
from .schedules import backend as schedule_backend
from .targets import compile_target, for_pipeline
from .transform import CostFuse

_FUSION_STEPS = ("FuseOps", "FuseTIR")


def pre_fusion_passes(target: tvm.target.Target, fold: bool = True) -> list[tvm.transform.Pass]:
    """What runs before the fusion slot: our weight folding (``fold``), then what TVM runs
    before FuseOps: library dispatch, LegalizeOps, AnnotateTIROpPattern, FoldConstant
    (FoldConstant folds constant weight transposes, which FuseOps never sees)."""
    backend = schedule_backend(target).relax
    passes = []
    for p in backend.legalize_passes(target):
        if p.info.name in _FUSION_STEPS:
            break
        passes.append(p)
    return ([FoldWeights] if fold else []) + backend.library_dispatch_passes(target) + passes


def prepare(mod: tvm.IRModule, target: tvm.target.Target | str = "llvm",
            fold: bool = True) -> tvm.IRModule:
    """Run the pre-fusion passes: the module FuseOps (or CostFuse) takes as input."""
    target = compile_target(target)
    with target:
        return tvm.transform.Sequential(pre_fusion_passes(target, fold))(mod)


def fuse(mod: tvm.IRModule, target, fusion: tvm.transform.Pass,
         fold: bool = True) -> tvm.IRModule:
    """The module a schedule pass sees: pre-fusion passes, ``fusion``, ``FuseTIR``."""
    target = compile_target(target)
    mod = prepare(mod, target, fold)
    with target:
        return tvm.transform.Sequential([fusion, relax.transform.FuseTIR()])(mod)


def default_schedule(target: tvm.target.Target) -> tvm.transform.Pass:
    """Our schedules for ``target``: the LLVM-CPU rules, or dlight's GPU rules guarded."""
    return schedule_backend(target).schedule_pass(target)


def costfuse_passes(fusion) -> list[tvm.transform.Pass]:
    """Where ``fusion`` is CostFuse, its steps on the high-level ops, before LegalizeOps: the
    layout decision (:mod:`.layouts`), then the sibling matmuls (:mod:`.horizontal`). Other
    strategies: none."""
    if not isinstance(fusion, CostFuse):
        return []
    return [ChannelsLast(fusion), CombineSiblings(fusion)]


def build_pipeline(
    target: tvm.target.Target | str,
    fusion: tvm.transform.Pass | None = None,
    schedule: tvm.transform.Pass | None = None,
    fold: bool = True,
) -> tvm.transform.Pass:
    """TVM's pipeline for ``target`` with ``fusion`` in FuseOps' place (None: fuse nothing),
    ``schedule`` right after FuseTIR, and (``fold``) weight folding first; where ``fusion``
    is CostFuse, its layout and sibling-matmul steps follow the folding (:func:`costfuse_passes`).

    On llvm ``schedule=None`` leaves the kernels unscheduled; where a kernel cannot build
    without thread bindings (CUDA: the backend's ``needs_schedule``) it means
    :func:`default_schedule`. The pass list is
    taken from TVM's backend module and edited by pass name, so it follows TVM.
    """
    target = compile_target(target)
    record = schedule_backend(target)
    backend = record.relax
    if schedule is None and record.needs_schedule:
        schedule = record.schedule_pass(target)
    legalize = backend.legalize_passes(target)
    names = [p.info.name for p in legalize]
    if "FuseOps" not in names or "FuseTIR" not in names:
        # TVM changed its pipeline: fail loudly instead of silently not fusing.
        raise RuntimeError(f"TVM's {target.kind.name} legalize_passes no longer contain "
                           "FuseOps and FuseTIR")
    passes = ([FoldWeights] if fold else []) + costfuse_passes(fusion)
    passes += list(backend.library_dispatch_passes(target))
    for p in legalize:
        name = p.info.name
        if name == "FuseOps":
            passes += [fusion] if fusion is not None else []
        elif name == "ApplyDefaultSchedule":
            continue  # CUDA's dlight step: ``schedule`` takes its place after FuseTIR
        else:
            passes.append(p)
        if name == "FuseTIR" and schedule is not None:
            passes.append(schedule)
    passes += backend.dataflow_lower_passes(target) + backend.finalize_passes(target)

    @tvm.transform.module_pass(opt_level=0, name="CostFuseBuildPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def scheduled_pipeline(target: tvm.target.Target | str, fusion: tvm.transform.Pass | None,
                       fold: bool = True) -> tvm.transform.Pass:
    """:func:`build_pipeline` with our schedules (:func:`default_schedule`)."""
    target = compile_target(target)
    return build_pipeline(target, fusion, default_schedule(target), fold)


def pipeline(target: tvm.target.Target | str | None = None, fold: bool = True,
             **config) -> tvm.transform.Pass:
    """TVM's pipeline for ``target`` with CostFuse in FuseOps' place and our schedules after
    FuseTIR: LLVM-CPU rules on llvm, dlight's GPU rules on cuda.

    Use as ``tvm.compile(mod, target, relax_pipeline=tvm_costfuse.pipeline(target),
    tir_pipeline="costfuse")`` (the TIR pipeline: ``schedules/lowering.py``).
    ``config`` takes CostFuse's arguments (``max_chain_length=...``); PassContext
    ``costfuse.*`` keys apply to what is not given. ``target`` is anything
    :func:`~tvm_costfuse.targets.resolve` takes (``"h100"``, ``"host"``, a tvm Target, a
    description; a plain ``"llvm"`` is TVM's generic x86-64, as ``tvm.compile`` reads it:
    :func:`~tvm_costfuse.targets.for_pipeline`). With no target, the pipeline reads
    ``Target.current()`` when it runs (as the named pipeline ``"costfuse"`` does).
    ``fold=False`` leaves batch norms and convolution branches as the model wrote them.
    """
    def make(t) -> tvm.transform.Pass:
        resolved = for_pipeline(t)  # a preset name ("h100"), a tvm Target, a description...
        return scheduled_pipeline(resolved.tvm, CostFuse(target=resolved, **config), fold)

    if target is not None:
        return make(target)

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
