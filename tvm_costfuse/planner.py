"""The planner: which bindings share a kernel, decided by cost-model queries.

Greedy priority fusion (as XLA's priority fusion): start from one kernel per op, score every
candidate merge -- producer into consumer (vertical chains, reduce + epilogue, reduce + reduce,
matmul/conv with prologue and epilogue) and siblings reading one tensor (horizontal) -- by the
time the model says it saves, apply the best legal merge, rescore its neighbours, repeat until
no merge saves time. ``plan_exact`` enumerates every partition of a small graph (of a bigger one,
region by region around greedy's plan), to report how far greedy is from the optimum. Both are
deterministic: ties break on binding order.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .cost.analytical import Estimate, one_footing
from .graph import OpGraph
from .pricer import Model, Pricer
from .quotient import Quotient
from .schedules.catalog import target_kind

if TYPE_CHECKING:
    from .rule_check import Mismatch

# Siblings are paired only among the first few readers of a tensor: k readers give k^2 pairs.
_MAX_SIBLINGS = 8
# Free groups (views) a vertical merge may step through at once (``push_through_views``), into
# the kernel kinds whose card allows it on the target (``Card.through_views``). Walking views
# into any kind changed the CUDA plan of an LSTM into kernels of three recurrent steps
# (unmeasured: no GPU here; not taken).
_MAX_VIEWS = 4



@dataclass(frozen=True)
class Decision:
    """One merge the planner weighed, with its predicted gain and verdict."""

    kind: str  # "vertical" or "horizontal"
    left: tuple[str, ...]
    right: tuple[str, ...]
    gain_s: float
    accepted: bool
    reason: str


@dataclass(frozen=True)
class FusionPlan:
    """The groups to fuse (more than one binding each) and why."""

    groups: tuple[tuple[str, ...], ...]
    estimates: dict[tuple[str, ...], Estimate] = field(repr=False)
    decisions: tuple[Decision, ...] = ()
    left_to_fuseops: tuple[tuple[str, ...], ...] = ()
    notes: tuple[str, ...] = ()
    #: groups a search formed whose kernel the rule of their card declined, with what ran
    #: (``rule_check``); the plan was searched again with them priced as that
    mismatched: tuple[tuple[tuple[str, ...], str], ...] = ()

    @property
    def seconds(self) -> float:
        return sum(e.seconds for e in self.estimates.values())

    def kernels(self) -> int:
        return len(self.estimates)


def initial_units(graph: OpGraph, frozen: Iterable[Iterable[str]] = ()) -> list[frozenset]:
    """One unit per fusable call_tir (its TupleGetItems ride with it), plus frozen groups."""
    units: list[frozenset] = [frozenset(g) for g in frozen]
    taken = {n for u in units for n in u}
    rides: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.kind == "tuple_get_item" and node.name not in taken:
            src = graph.producers(node.name)
            if src and graph[src[0]].kind == "call_tir" and src[0] not in taken:
                rides.setdefault(src[0], []).append(node.name)
    for node in graph.nodes:
        if node.kind == "call_tir" and node.fusable and node.name not in taken:
            units.append(frozenset([node.name, *rides.get(node.name, ())]))
    return units


def _candidates(graph: OpGraph, q: Quotient, g: int) -> Iterable[tuple[str, int, int]]:
    """Merges of group ``g`` to weigh, each once, in a fixed order: its successors, its
    predecessors, then siblings reading one of its inputs (members in binding order)."""
    for s in q.succ[g]:
        yield "vertical", g, s
    for p in q.pred[g]:
        yield "vertical", p, g
    seen: set[int] = set()
    for name in _key(q, g):
        for src in graph[name].inputs:
            readers = graph.consumers.get(src, ()) if not src.startswith("%") else ()
            for r in readers[:_MAX_SIBLINGS]:
                h = q.group_of.get(r)
                if h is not None and h != g and h not in seen:
                    seen.add(h)
                    yield "horizontal", min(g, h), max(g, h)


def _other_path(q: Quotient, a: int, d: int, chain: set[int]) -> bool:
    """Whether ``a`` reaches ``d`` other than through ``chain`` (single-input, single-output
    groups between them): merging them all would then close a cycle."""
    return q.path_avoiding_direct(a, d, avoid=chain) is not None


def _key(q: Quotient, g: int) -> tuple[str, ...]:
    return tuple(sorted(q.members[g], key=q.index.__getitem__))


def _gain(parts: list[Estimate], union: Estimate) -> float:
    """Seconds a merge saves, its parts and union priced on one footing (``one_footing``)."""
    *apart, fused = one_footing([*parts, union])
    return sum(apart) - fused


def plan_greedy(
    graph: OpGraph,
    target,
    config,
    model: Model | None = None,
    frozen: Iterable[Iterable[str]] = (),
    mismatched: Mapping[frozenset, Mismatch] | None = None,
) -> FusionPlan:
    """Greedy priority fusion. ``frozen`` groups are fixed units the planner never merges
    (regions left to FuseOps); ``mismatched`` groups are priced as the kernel that runs
    (:class:`Pricer`)."""
    price = Pricer(graph, target, config, model, mismatched)
    frozen_units = [frozenset(g) for g in frozen]
    q = Quotient(graph, initial_units(graph, frozen_units))
    if len(q.rank) != len(q.members):
        raise ValueError("the frozen groups form a cycle with the other bindings")
    fixed = {i for i, u in q.members.items() if u in frozen_units} | q.pinned
    heap: list = []
    decisions: list[Decision] = []
    counter = itertools.count()

    def push(kind: str, a: int, b: int) -> None:
        if a in fixed or b in fixed:
            return
        ua, ub = q.members[a], q.members[b]
        gain = _gain([price.estimate(ua), price.estimate(ub)], price.estimate(ua | ub))
        order = min(q.lo[a], q.lo[b])
        heapq.heappush(heap, (-gain, order, next(counter), kind, a, b, ua, ub, ()))
        if kind == "vertical" and gain <= 0:
            push_through_views(a, b, order)

    def push_through_views(a: int, b: int, order: int) -> None:
        """The groups on both sides of a chain of free groups (views: no kernel, 0 s) after
        ``a`` or before ``b``, merged with it as one candidate: each step alone gains nothing
        (a view costs nothing kept apart), so greedy would never walk the chain (a softmax,
        the reshape views of a batch matmul's operand, the matmul)."""
        def views(start: int, edges: dict[int, set[int]]) -> tuple[list[int], int]:
            chain, nxt = [], start
            while (nxt not in fixed and len(q.pred[nxt]) == 1 and len(q.succ[nxt]) == 1
                   and len(chain) < _MAX_VIEWS
                   and price.estimate(q.members[nxt]).seconds == 0):
                chain.append(nxt)
                (nxt,) = edges[nxt]
            return chain, nxt

        after, last = views(b, q.succ)  # a, then views, then the group past them
        if after:
            first, chain = a, after
        else:  # views, then b: from the group before them
            before, first = views(a, q.pred)
            last, chain = b, before[::-1]
        if not chain or first in fixed or last in fixed or first == last or _other_path(
                q, first, last, set(chain)):
            return
        parts = [first, *chain, last]
        union = frozenset().union(*(q.members[g] for g in parts))
        gain = _gain([price.estimate(q.members[g]) for g in parts], price.estimate(union))
        card = price.features[union].card_on(target.kind)
        if gain > 0 and target_kind(target.kind) in card.through_views:
            via = tuple((g, q.members[g]) for g in parts[1:])
            heapq.heappush(heap, (-gain, order, next(counter), "vertical", first, last,
                                  q.members[first], q.members[last], via))

    for g in sorted(q.members):
        for kind, a, b in _candidates(graph, q, g):
            if a == g or kind == "horizontal":
                push(kind, a, b)
    seen_pairs: set = set()
    while heap:
        neg_gain, _, _, kind, a, b, ua, ub, via = heapq.heappop(heap)
        if q.members.get(a) is not ua or q.members.get(b) is not ub or any(
                q.members.get(g) is not u for g, u in via):
            continue  # stale: one side was merged since
        if via:
            ub = frozenset().union(*(u for _, u in via))
        if (ua, ub) in seen_pairs:
            continue
        seen_pairs.add((ua, ub))
        gain = -neg_gain
        left = _key(q, a)
        right = tuple(sorted(ub, key=q.index.__getitem__)) if via else _key(q, b)
        verdict = price.verdict(ua | ub)
        if not verdict:
            decisions.append(Decision(kind, left, right, gain, False, verdict.reason))
            continue
        if gain <= 0:
            decisions.append(Decision(kind, left, right, gain, False,
                                      f"model predicts no gain ({gain * 1e6:+.2f} us)"))
            continue
        blocker = None if via else q.blocker(a, b)  # a chain of views: checked when pushed
        if blocker is not None:
            decisions.append(Decision(kind, left, right, gain, False,
                                      f"not convex: a path runs through "
                                      f"{_key(q, blocker)[0]!r}"))
            continue
        decisions.append(Decision(kind, left, right, gain, True,
                                  f"model predicts {gain * 1e6:.2f} us saved"))
        g = a
        for step in [g2 for g2, _ in via] or [b]:
            g = q.merge(g, step)
        for kind2, x, y in _candidates(graph, q, g):
            push(kind2, x, y)

    estimates = {_key(q, g): price(u)[0] for g, u in q.members.items() if g not in q.pinned}
    groups = tuple(k for k in estimates if len(k) > 1)
    return FusionPlan(groups, estimates, tuple(decisions), tuple(map(tuple, frozen)))


def plan_cost(graph: OpGraph, target, config, groups, model: Model | None = None) -> float:
    """Predicted total seconds of a partition (ops in no group run alone), each group at its
    own model's answer (a report, not a decision: no footing)."""
    price = Pricer(graph, target, config, model)
    q = Quotient(graph, initial_units(graph, groups))
    return sum(price(u)[0].seconds for g, u in q.members.items() if g not in q.pinned)


def _exact_partition(graph: OpGraph, price: Pricer, units: list[frozenset],
                     others: list[frozenset]) -> list[frozenset]:
    """The cheapest legal partition of ``units`` with the groups ``others`` fixed around them
    (convexity is checked against the whole graph), by enumerating set partitions. A unit
    joining a part adds its own time less the merge's saving (``_gain``, on one footing), so
    the search decides each merge as greedy does."""
    best: tuple[float, list[frozenset]] = (float("inf"), [])

    def acyclic(parts: list[frozenset]) -> bool:
        return Quotient(graph, [*parts, *others]).is_acyclic()

    def search(i: int, parts: list[frozenset], cost: float) -> None:
        nonlocal best
        if cost >= best[0]:
            return
        if i == len(units):
            if acyclic(parts):
                best = (cost, list(parts))
            return
        u = units[i]
        for j, part in enumerate(parts):
            merged = part | u
            est, verdict = price(merged)
            if verdict:  # the merge's saving on one footing, as greedy weighs it
                new_cost = cost + price(u)[0].seconds - _gain([price(part)[0], price(u)[0]], est)
                search(i + 1, parts[:j] + [merged] + parts[j + 1:], new_cost)
        search(i + 1, parts + [u], cost + price(u)[0].seconds)

    search(0, [], 0.0)
    return best[1]


def _regions(size: list[int], max_units: int) -> list[list[int]]:
    """Consecutive greedy groups (in binding order) packed into regions of at most
    ``max_units`` units; a group bigger than that is a region of its own."""
    regions: list[list[int]] = []
    count = 0
    for i, n in enumerate(size):
        if not regions or count + n > max_units:
            regions.append([])
            count = 0
        regions[-1].append(i)
        count += n
    return regions


def plan_exact(graph: OpGraph, target, config, model: Model | None = None,
               max_units: int = 9, frozen: Iterable[Iterable[str]] = (),
               mismatched: Mapping[frozenset, Mismatch] | None = None) -> FusionPlan:
    """The cheapest legal partition, by enumerating set partitions of the units (Bell(9) =
    21,147 for 9 units).

    A graph of more than ``max_units`` units is planned greedily first; then each region of
    consecutive greedy groups holding at most ``max_units`` units is searched exactly with
    the rest fixed (greedy's own grouping of a region is one of the partitions enumerated, so
    the plan is never predicted slower than greedy's). Greedy groups bigger than a region stay
    as greedy made them; the plan's notes say how much was searched exactly. ``frozen``
    groups are fixed units (regions left to FuseOps); ``mismatched`` groups are priced as the
    kernel that runs.
    """
    price = Pricer(graph, target, config, model, mismatched)
    frozen_units = [frozenset(g) for g in frozen]
    units = [u for u in initial_units(graph, frozen_units) if u not in frozen_units]
    notes: tuple[str, ...] = ()
    if len(units) <= max_units:
        parts = _exact_partition(graph, price, units, frozen_units)
    else:
        greedy = plan_greedy(graph, target, config, model, frozen=frozen_units,
                             mismatched=mismatched)
        unit_of = {n: u for u in units for n in u}
        fixed = set(frozen_units)
        groups = sorted((frozenset(k) for k in greedy.estimates if frozenset(k) not in fixed),
                        key=lambda g: min(graph[n].index for n in g))
        grouped = [sorted({unit_of[n] for n in g if n in unit_of},
                          key=lambda u: min(graph[n].index for n in u)) for g in groups]
        parts = list(groups)
        exact_units = kept = 0
        for region in _regions([len(g) for g in grouped], max_units):
            region_units = [u for i in region for u in grouped[i]]
            if len(region_units) > max_units:
                kept += 1
                continue
            others = [p for i, p in enumerate(parts) if p and i not in region] + frozen_units
            found = _exact_partition(graph, price, region_units, others)
            for i in region:
                parts[i] = frozenset()
            parts.extend(found)
            exact_units += len(region_units)
        parts = [p for p in parts if p]
        notes = (f"exact search per region: {exact_units} of {len(units)} units searched "
                 f"exactly in regions of at most {max_units} units, greedy elsewhere"
                 + (f" ({kept} greedy groups of more than {max_units} units kept)"
                    if kept else ""),)
    estimates = {tuple(sorted(p, key=lambda n: graph[n].index)): price(p)[0]
                 for p in [*frozen_units, *parts]}
    return FusionPlan(tuple(k for k in estimates if len(k) > 1), estimates,
                      left_to_fuseops=tuple(map(tuple, frozen)), notes=notes)
