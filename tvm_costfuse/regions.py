"""Regions where a plan differs from another partition, and the cheaper of the two per region.

Greedy merging can miss a grouping that FuseOps' pattern rules find: on BERT it split a
``bitwise_and -> where`` pair FuseOps keeps in one kernel (predicted 24 against 14 us). After
planning, the two partitions are compared region by region (the ops of overlapping kernels
form one region) and a region takes FuseOps' grouping where the same cost model predicts it
cheaper, every group of it passes our legality checks, and the whole partition stays convex.
So a CostFuse plan is never predicted slower than FuseOps' anywhere, whatever the search
missed; what the cost model mispredicts is the evaluation's business, not this one's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .cost.analytical import one_footing
from .graph import OpGraph
from .planner import initial_units
from .pricer import Pricer
from .quotient import Quotient

Units = list[frozenset]


def differing_regions(ours: Units, theirs: Units) -> list[tuple[Units, Units]]:
    """(our units, their units) per region where the partitions differ: the connected sets
    of units that share an op, units both have left out."""
    shared = set(ours) & set(theirs)
    mine = [u for u in ours if u not in shared]
    other = [u for u in theirs if u not in shared]
    parent: dict[str, str] = {}

    def root(n: str) -> str:
        while parent.setdefault(n, n) != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for unit in (*mine, *other):
        first = next(iter(sorted(unit)))
        for n in unit:
            parent[root(n)] = root(first)
    regions: dict[str, tuple[Units, Units]] = {}
    for side, units in ((0, mine), (1, other)):
        for u in units:
            regions.setdefault(root(min(u)), ([], []))[side].append(u)
    return [r for r in regions.values() if r[0] and r[1]]


def cheaper_by_region(graph: OpGraph, price: Pricer, groups: Iterable[Sequence[str]],
                      alternative: Iterable[Sequence[str]],
                      frozen: Iterable[Sequence[str]] = ()) -> tuple[Units, int, float]:
    """Our partition (``groups``) with each region replaced by ``alternative``'s where that is
    predicted cheaper, legal and convex; returns (units, regions replaced, seconds saved)."""
    frozen = [frozenset(g) for g in frozen]
    fusable = {n for u in initial_units(graph) for n in u}
    ours = initial_units(graph, [*frozen, *(frozenset(g) for g in groups)])
    theirs = [frozenset(g) for g in alternative if len(g) > 1]
    theirs = initial_units(graph, [*frozen, *(g for g in theirs if g <= fusable)])
    parts, swapped, saved = set(ours), 0, 0.0
    regions = differing_regions(ours, theirs)
    regions.sort(key=lambda r: min(graph[n].index for u in r[0] for n in u))
    for mine, other in regions:
        if {n for u in mine for n in u} != {n for u in other for n in u}:
            continue  # not the same ops (an op one side leaves to FuseOps): not comparable
        # Both sides on one footing (``one_footing``): a decision, like a merge.
        seconds = one_footing([price.estimate(u) for u in (*mine, *other)])
        cost_mine, cost_other = sum(seconds[:len(mine)]), sum(seconds[len(mine):])
        if cost_other >= cost_mine or not all(price.verdict(u) for u in other if len(u) > 1):
            continue
        trial = (parts - set(mine)) | set(other)
        if Quotient(graph, list(trial)).is_acyclic():
            parts, swapped, saved = trial, swapped + 1, saved + cost_mine - cost_other
    return sorted(parts, key=lambda u: min(graph[n].index for n in u)), swapped, saved
