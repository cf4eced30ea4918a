"""What CostFuse decided differently from FuseOps: the kernels the two partitions do not share.

A speed difference between two partitions comes from the kernels they disagree on, so ``costfuse
demo`` prints those next to its measured latencies, each with the time the cost model predicted
for both sides: a user sees which decisions the difference comes from and whether the model saw
it coming. Kernels that overlap (share an op) are shown together as one difference. Nothing here
changes IR.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tvm

from ..config import FusionConfig
from ..cost.analytical import estimate
from ..cost.extract import group_features
from ..graph import OpGraph, build_graph
from ..partition import fuseops_groups
from ..pipelines import prepare
from ..pre_fusion import costfuse_model
from ..regions import differing_regions
from ..targets import TargetDesc, resolve
from ..transform import plan_module
from .explain import kernels_of

Kernel = tuple[str, ...]


@dataclass(frozen=True)
class Difference:
    """One cluster of disagreement: FuseOps' kernels and CostFuse's over the same ops."""

    fuseops: tuple[Kernel, ...]
    costfuse: tuple[Kernel, ...]
    fuseops_s: float  # predicted seconds of ``fuseops``' kernels
    costfuse_s: float

    @property
    def verb(self) -> str:
        if len(self.costfuse) < len(self.fuseops):
            return "merged"
        return "split" if len(self.costfuse) > len(self.fuseops) else "regrouped"


def differences(graph: OpGraph, desc: TargetDesc, config: FusionConfig,
                fuseops: Sequence[Sequence[str]],
                costfuse: Sequence[Sequence[str]]) -> list[Difference]:
    """The clusters where the two partitions' kernels differ, in program order.

    Kernels are compared by their cores: without reshape-like ops, and without ops that are a
    view (no kernel) in either partition. A reshape fused into a kernel in one partition and
    left as a view in the other moves no computation, and would otherwise show as a
    difference in nearly every transformer layer. Each side is priced by its whole kernels,
    as the plan priced them."""
    theirs, ours = kernels_of(graph, fuseops), kernels_of(graph, costfuse)
    in_kernel = [{n for k in side for n in k} for side in (theirs, ours)]
    moved = in_kernel[0] ^ in_kernel[1]

    def cores(kernels: list[Kernel]) -> dict[frozenset, Kernel]:
        """Each kernel's core -> the whole kernel, which is what is priced: a fused
        attention stripped of its views is no attention to the cost model."""
        kept = ((frozenset(n for n in k if n not in moved and not graph[n].reshape_like), k)
                for k in kernels)
        return {core: k for core, k in kept if core}

    whole = {**cores(theirs), **cores(ours)}
    regions = differing_regions(list(cores(ours)), list(cores(theirs)))

    def kernels(units) -> tuple[Kernel, ...]:
        return tuple(sorted((tuple(sorted(whole[u], key=lambda n: graph[n].index))
                             for u in units), key=lambda k: graph[k[0]].index))

    def seconds(ks: tuple[Kernel, ...]) -> float:
        return sum(estimate(group_features(graph, k), desc, config.register_budget).seconds
                   for k in ks)

    out = [Difference(kernels(b), kernels(a), seconds(kernels(b)), seconds(kernels(a)))
           for a, b in regions]
    return sorted(out, key=lambda d: min(graph[k[0]].index for k in (*d.fuseops, *d.costfuse)))


def describe(graph: OpGraph, diff: Difference, max_ops: int = 6) -> str:
    """``merged [add exp] + [mul] -> [add exp mul]: predicted 12.0 -> 8.0 us`` (op kinds)."""
    def kernel(k: Kernel) -> str:
        kinds = [graph[n].prim_func or graph[n].name for n in k]
        more = f" +{len(kinds) - max_ops}" if len(kinds) > max_ops else ""
        return "[" + " ".join(kinds[:max_ops]) + more + "]"

    return (f"{diff.verb} {' + '.join(map(kernel, diff.fuseops))} -> "
            f"{' + '.join(map(kernel, diff.costfuse))}: predicted "
            f"{diff.fuseops_s * 1e6:.1f} -> {diff.costfuse_s * 1e6:.1f} us")


# Ratios closer to 1 than this are reported as ties, not as a win or a loss.
NOISE = 0.02


def summary(mod: tvm.IRModule, target, measured: float, shown: int = 8) -> list[str]:
    """What CostFuse decided differently from FuseOps, priced, and the headline: the measured
    ratio (FuseOps' time over CostFuse's) next to the predicted one, a loss named as one with
    where it comes from. The lines ``costfuse demo`` ends with."""
    prepared = prepare(mod, target)
    graph = build_graph(prepared)
    desc, config = resolve(target).desc, FusionConfig.resolve()
    plan = plan_module(prepared, desc, config)
    diffs = differences(graph, desc, config, fuseops_groups(prepared), plan.groups)
    _model, sets, layout = costfuse_model(mod, target)
    combined = [x for x in sets if x.combine]
    aside = ([(f"CostFuse also combined {len(combined)} set(s) of sibling matmuls into one "
              "matmul each (`costfuse explain` prices them; not in the regions below)")]
             if combined else [])
    if layout.chosen:
        aside.append(f"CostFuse also ran {layout.convolutions} convolutions channels-last "
                     f"({layout.why}; the regions below are planned as imported)")
    if not diffs:
        return aside + [("CostFuse chose FuseOps' kernels on this model: the latencies differ "
                        "by noise only")]
    theirs, ours = sum(d.fuseops_s for d in diffs), sum(d.costfuse_s for d in diffs)
    lines = aside + [f"CostFuse decided {len(diffs)} region(s) differently from FuseOps"
             + (f" (first {shown})" if len(diffs) > shown else "") + ":"]
    lines += [f"  {describe(graph, d)}" for d in diffs[:shown]]
    verdict = ("faster" if measured >= 1 + NOISE else "SLOWER" if measured <= 1 - NOISE
               else f"the same within {NOISE:.0%} noise")
    lines.append(f"CostFuse vs FuseOps, same schedules: {measured:.2f}x measured ({verdict}); "
                 f"the cost model predicted {theirs / ours:.2f}x on these regions "
                 f"({(theirs - ours) * 1e6:.1f} us saved)")
    if measured <= 1 - NOISE:
        lines.append("  a loss: the cost model priced these regions wrong on this host (its "
                     "description of the host, or a kernel it does not model); `costfuse "
                     "explain` shows each price, `costfuse calibrate` re-measures the host")
    return lines
