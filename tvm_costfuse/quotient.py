"""The quotient graph the planner merges in: one node per current group, kept acyclic.

A merge is legal only if every group stays convex (no path leaves a group and comes back),
which is the quotient staying acyclic; the planner asks ``blocker`` before each merge and
``merge`` keeps a topological order of the groups so that those path searches stay local.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection

from .graph import OpGraph


class Quotient:
    """The graph of current groups; merging must keep it acyclic (each group convex).

    Every binding of the graph is in it: the units the planner may merge, and each other
    binding (unfusable ones, a TupleGetItem of an unfusable producer) as a ``pinned`` group of
    its own, so that paths through those are seen too. ``rank`` is a topological order of the
    groups, kept through merges: a group reaches only groups ranked after it, which bounds the
    path searches (binding indices do not: a merged group may span any range of them).
    """

    def __init__(self, graph: OpGraph, units: list[frozenset]) -> None:
        self.graph = graph
        self.index = {n.name: n.index for n in graph.nodes}
        taken = {n for u in units for n in u}
        rest = [frozenset([n.name]) for n in graph.nodes if n.name not in taken]
        self.members = dict(enumerate([*units, *rest]))
        self.pinned = set(range(len(units), len(self.members)))
        self.group_of = {n: i for i, u in self.members.items() for n in u}
        self.succ: dict[int, set[int]] = {i: set() for i in self.members}
        self.pred: dict[int, set[int]] = {i: set() for i in self.members}
        for node in graph.nodes:
            for p in graph.producers(node.name):
                a, b = self.group_of.get(p), self.group_of.get(node.name)
                if a is not None and b is not None and a != b:
                    self.succ[a].add(b)
                    self.pred[b].add(a)
        self.lo = {i: min(graph[n].index for n in u) for i, u in self.members.items()}
        self.rank = self._topological_ranks()

    def _topological_ranks(self) -> dict[int, int]:
        """Kahn's order, ties by first binding; groups on a cycle get no rank."""
        indegree = {g: len(p) for g, p in self.pred.items()}
        ready = [(self.lo[g], g) for g, k in indegree.items() if k == 0]
        heapq.heapify(ready)
        rank: dict[int, int] = {}
        while ready:
            _, g = heapq.heappop(ready)
            rank[g] = len(rank)
            for s in self.succ[g]:
                indegree[s] -= 1
                if indegree[s] == 0:
                    heapq.heappush(ready, (self.lo[s], s))
        return rank

    def _reach(self, start: int, edges: dict[int, set[int]], keep) -> set[int]:
        """Groups reachable from ``start`` along ``edges`` through groups ``keep`` accepts."""
        stack, seen = [start], set()
        while stack:
            for s in edges[stack.pop()]:
                if s not in seen and keep(s):
                    seen.add(s)
                    stack.append(s)
        return seen

    def path_avoiding_direct(self, a: int, b: int, avoid: Collection[int] = ()) -> int | None:
        """A group on a path a -> ... -> b of two or more hops (merging a, b would make a
        cycle through it) that leaves ``a`` other than into ``avoid``, or None. Only groups
        ranked before b can lie on such a path."""
        rb = self.rank[b]
        stack = [s for s in self.succ[a] if s != b and s not in avoid and self.rank[s] < rb]
        seen = set(stack)
        while stack:
            g = stack.pop()
            if b in self.succ[g]:
                return g
            for s in self.succ[g]:
                if s not in seen and self.rank[s] < rb:
                    seen.add(s)
                    stack.append(s)
        return None

    def blocker(self, a: int, b: int) -> int | None:
        via = self.path_avoiding_direct(a, b)
        return via if via is not None else self.path_avoiding_direct(b, a)

    def is_acyclic(self) -> bool:
        return len(self._topological_ranks()) == len(self.members)

    def merge(self, a: int, b: int) -> int:
        """Merge b into a (no ``blocker`` between them); returns a.

        The ranks stay topological as in Pearce and Kelly's dynamic topological sort: of the
        groups ranked between the two, those the earlier one reaches move after the merged
        group and those reaching the later one move before it, into the same rank slots.
        """
        x, y = sorted((a, b), key=self.rank.__getitem__)
        lo, hi = self.rank[x], self.rank[y]
        after = self._reach(x, self.succ, lambda g: g != y and self.rank[g] < hi)
        before = self._reach(y, self.pred, lambda g: g != x and self.rank[g] > lo)
        slots = sorted(self.rank[g] for g in (*after, *before, x, y))
        moved = [*sorted(before, key=self.rank.__getitem__), a,
                 *sorted(after, key=self.rank.__getitem__)]
        del self.rank[b]
        self.rank.update(zip(moved, slots))
        self.members[a] = self.members[a] | self.members.pop(b)
        for n in self.members[a]:
            self.group_of[n] = a
        for s in self.succ.pop(b):
            self.pred[s].discard(b)
            if s != a:
                self.succ[a].add(s)
                self.pred[s].add(a)
        for p in self.pred.pop(b):
            self.succ[p].discard(b)
            if p != a:
                self.pred[a].add(p)
                self.succ[p].add(a)
        self.succ[a].discard(a)
        self.pred[a].discard(a)
        self.lo[a] = min(self.lo[a], self.lo.pop(b))
        return a
