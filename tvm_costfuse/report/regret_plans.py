"""The plans around CostFuse's for ``costfuse regret`` (:mod:`.regret`): its plan and FuseOps'
groups over one graph, the regions where they differ (``regions.differing_regions``), each
priced on one footing with the rule each side's kernels get, and a plan with some regions
flipped to FuseOps' grouping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import tvm

from ..config import FusionConfig
from ..cost.analytical import one_footing
from ..graph import OpGraph, build_graph
from ..partition import fuseops_groups
from ..pipelines import prepare
from ..planner import initial_units
from ..pricer import Pricer
from ..quotient import Quotient
from ..regions import differing_regions
from ..targets import TargetDesc, for_target
from ..transform import plan_module

__all__ = ["FUSEOPS", "Plans", "Region", "Units", "flip", "kernel_groups", "plans"]

Units = list[frozenset]

#: the variant built from FuseOps' groups (through ``ApplyPartition``, beside CostFuse's
#: frozen groups: the space's other end, not ``relax.transform.FuseOps`` itself)
FUSEOPS = "FuseOps' groups"


@dataclass(frozen=True)
class Region:
    """One place where CostFuse's and FuseOps' plans differ, decided inside the model."""

    ops: int
    where: str  # the region's costliest op: its PrimFunc and output shape
    ours: tuple[str, ...]  # the rule of each of CostFuse's kernels there
    theirs: tuple[str, ...]  # and of FuseOps'
    predicted_us: tuple[float, float]  # (ours, theirs), on one footing
    flipped_ms: float | None = None  # the model with this region as FuseOps groups it
    clear: bool = False
    unbuilt: str = ""  # why the flipped plan was not timed (a cycle, a build error, wrong)
    replicated: float | None = None  # flip / CostFuse again, on fresh builds of both


class Plans(NamedTuple):
    graph: OpGraph
    ours: Units
    theirs: Units
    pairs: list[tuple[Units, Units]]  # per region: (CostFuse's units, FuseOps' units)
    regions: list[Region]


def kernel_groups(units: Units) -> list[list[str]]:
    return [sorted(u) for u in units if len(u) > 1]


def _calls(graph: OpGraph, units: Units) -> set[frozenset]:
    """The kernels of ``units`` as sets of call_tir bindings (where a TupleGetItem rides
    does not make another kernel)."""
    kernels = {frozenset(n for n in u if graph[n].kind == "call_tir") for u in units}
    return {k for k in kernels if k}


def _rules(graph: OpGraph, price: Pricer, kind: str, units: Units) -> tuple[str, ...]:
    names = []
    for u in sorted(units, key=lambda u: min(graph[n].index for n in u)):
        price.estimate(u)
        names.append(price.features[u].card_on(kind).rule)
    return tuple(names)


def plans(mod: tvm.IRModule, target: tvm.target.Target, desc: TargetDesc | None = None) -> Plans:
    """CostFuse's and FuseOps' units of ``main`` for ``target`` (CostFuse priced for ``desc``,
    by default the target's description, as ``tvm.compile`` plans it) and their regions."""
    prepared = prepare(mod, target)
    graph = build_graph(prepared)
    desc = desc or for_target(target)
    config = FusionConfig()
    plan = plan_module(prepared, desc, config)
    # plan.groups holds the groups left to FuseOps too: each unit once
    frozen = list(dict.fromkeys(frozenset(g) for g in plan.left_to_fuseops))
    fusable = {n for u in initial_units(graph) for n in u}
    ours = initial_units(graph, list(dict.fromkeys([*frozen, *map(frozenset, plan.groups)])))
    theirs_groups = [frozenset(g) for g in fuseops_groups(prepared)
                     if len(g) > 1 and set(g) <= fusable and frozenset(g) not in frozen]
    theirs = initial_units(graph, [*frozen, *theirs_groups])
    price = Pricer(graph, desc, config, None)
    pairs, regions = [], []
    for mine, other in differing_regions(ours, theirs):
        if {n for u in mine for n in u} != {n for u in other for n in u}:
            continue  # an op one side leaves unfused: not a choice between the two groupings
        if _calls(graph, mine) == _calls(graph, other):
            continue  # the same kernels; only a TupleGetItem sits elsewhere
        seconds = one_footing([price.estimate(u) for u in (*mine, *other)])
        pairs.append((mine, other))
        calls = [graph[n] for u in mine for n in u if graph[n].kind == "call_tir"]
        top = max(calls, key=lambda n: (n.flops, -n.index))
        regions.append(Region(
            ops=len(calls), where=f"{top.prim_func} {'x'.join(map(str, top.outputs[0].shape))}",
            ours=_rules(graph, price, desc.kind, mine),
            theirs=_rules(graph, price, desc.kind, other),
            predicted_us=(sum(seconds[:len(mine)]) * 1e6, sum(seconds[len(mine):]) * 1e6)))
    return Plans(graph, ours, theirs, pairs, regions)


def flip(graph: OpGraph, units: Units, pairs) -> Units | None:
    """``units`` with each pair's CostFuse side swapped for FuseOps'; None when the kernels
    would form a cycle."""
    parts = set(units)
    for mine, other in pairs:
        parts = (parts - set(mine)) | set(other)
    return list(parts) if Quotient(graph, list(parts)).is_acyclic() else None
