"""Rules-only fusion: fixed pattern rules on the OpGraph, no cost model.

The comparison point for CostFuse and its fallback where no target description is trusted.
Like FuseOps it reads only op kinds and graph shape, but it works on the same plain-data
``OpGraph`` as the planner and adds the canonical groups FuseOps misses (a reduction with its
elementwise prologue). Units (one call_tir with its TupleGetItems, ``planner.initial_units``)
are visited in program order; each joins the group of one of its producers when a rule allows
it, else opens a group:

a. elementwise / broadcast / injective ops chain vertically into an elementwise group;
b. a contraction (matmul, conv) always opens a group and absorbs its epilogue: elementwise and
   broadcast ops, and injective ops that keep the shape of what they read (legalized inference
   batch norm, a cast). Conv + BN + ReLU is one group. No prologues: inlining a producer into a
   contraction recomputes it per use, a trade only a cost model can weigh;
c. a reduction (mean, sum, layer_norm, softmax) joins a group of elementwise ops (its
   prologue: rmsnorm's square), takes the same epilogue as a contraction, and joins another
   reduction of the same rows (reduce + reduce: a decomposed layernorm's two means);
d. attention: the canonical grouping is ``[Q K^T, scale, mask] [softmax] [P V]``. The scale and
   mask are the first matmul's epilogue (rule b, so the scores are written once), softmax opens
   its own reduction kernel, and the second matmul opens a third. Never two contractions, nor a
   contraction and a reduction, in one group: both need a schedule of their own, and the
   fallback schedule that takes such groups runs the contraction as a naive loop nest. (The
   CPU attention kernel, ``schedules/attention.py``, takes the whole chain as one group; it
   is CostFuse's planner that forms it, priced by the cost model, not a rule here.)

Convex by construction: a unit joins a group only if no other producer of it is reachable from
that group (which would close a cycle between groups). ``resolve_groups`` validates the result
anyway. The user's caps (``max_body_ops``, ``max_chain_length``) bound every group.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm

from .config import FusionConfig, register_config_keys
from .cost.features import op_class
from .graph import Node, OpGraph, build_graph
from .legality import within_caps
from .partition import apply_per_function, resolve_groups
from .planner import initial_units


@dataclass
class _Group:
    members: list[str]
    anchor: str | None  # "contraction", "reduction" or None (elementwise / injective only)
    block: int
    reductions: list[str]
    fusable: bool = True


def _keeps_shape(node: Node, producer: Node) -> bool:
    """An injective op fits an epilogue when it writes the shape it reads (no transpose)."""
    return bool(node.outputs) and bool(producer.outputs) and (
        node.outputs[0].shape == producer.outputs[0].shape
    )


def _rule(g: _Group, graph: OpGraph, node: Node, cls: str, producer: str) -> bool:
    """Whether ``node`` (of op class ``cls``) may join ``g`` through ``producer`` in ``g``."""
    if not g.fusable or g.block != node.block or cls == "contraction":
        return False  # rule b: a contraction opens its own group
    if cls == "elementwise":
        return True  # rules a, b, c: chains and epilogues
    if cls == "injective":
        return g.anchor is None or _keeps_shape(node, graph[producer])
    # cls == "reduction"
    if g.anchor is None:
        return True  # rule c: elementwise prologue
    if g.anchor == "reduction":  # rule c: reduce + reduce over the same rows
        return any(graph[r].outputs[:1] == node.outputs[:1] for r in g.reductions)
    return False  # rule d: never a contraction and a reduction together


def _reaches(succ: dict[int, set[int]], start: int, targets: set[int]) -> bool:
    stack, seen = [start], {start}
    while stack:
        for s in succ[stack.pop()]:
            if s in targets:
                return True
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return False


def rules_groups(graph: OpGraph, config: FusionConfig | None = None) -> list[list[str]]:
    """The rules-only partition of ``graph``: groups of binding names (more than one op each).

    Deterministic: units are visited in program order and each tries its producers' groups in
    argument order. The result passes ``partition.resolve_groups`` (convex, acyclic).
    """
    config = config or FusionConfig()
    unit_of = {n: u for u in initial_units(graph) for n in u}
    group_of: dict[str, int] = {}
    groups: dict[int, _Group] = {}
    succ: dict[int, set[int]] = {}
    depth: dict[str, int] = {}  # longest chain inside its group ending at this binding

    def add(gid: int, names, node: Node) -> None:
        g = groups[gid]
        for n in names:
            group_of[n] = gid
            g.members.append(n)
        for n in names:
            for p in graph.producers(n):
                h = group_of.get(p)
                if h is not None and h != gid:
                    succ[h].add(gid)
        inside = [depth[p] for p in graph.producers(node.name) if group_of.get(p) == gid]
        for n in names:  # TupleGetItems add no length to the chain
            depth[n] = 1 + max(inside, default=0)

    for node in graph.nodes:
        if node.name in group_of:
            continue
        unit = sorted(unit_of.get(node.name, {node.name}), key=lambda n: graph[n].index)
        cls = op_class(node)
        fusable = node.kind == "call_tir" and node.fusable
        chosen = None
        if fusable:
            sources = [p for n in unit for p in graph.producers(n) if p not in unit]
            outside = {group_of[p] for p in sources if p in group_of}
            for p in dict.fromkeys(sources):
                gid = group_of.get(p)
                if gid is None or not _rule(groups[gid], graph, node, cls, p):
                    continue
                g = groups[gid]
                ops = sum(1 for n in g.members if graph[n].kind == "call_tir") + 1
                chain = 1 + max(depth.get(q, 0) for q in graph.producers(node.name)
                                if group_of.get(q) == gid)
                if not within_caps(ops, chain, config):
                    continue
                if _reaches(succ, gid, outside - {gid}):
                    continue  # another input depends on this group: joining makes a cycle
                chosen = gid
                break
        if chosen is None:
            chosen = len(groups)
            anchor = cls if cls in ("contraction", "reduction") else None
            groups[chosen] = _Group([], anchor, node.block, [], fusable)
            succ[chosen] = set()
        elif cls == "reduction" and groups[chosen].anchor is None:
            groups[chosen].anchor = "reduction"
        if cls == "reduction":
            groups[chosen].reductions.append(node.name)
        add(chosen, unit, node)

    out = [g.members for g in groups.values() if g.fusable and len(g.members) > 1]
    return resolve_groups(graph, out)


@tvm.transform.module_pass(opt_level=0, name="RulesFuse")
@dataclass
class RulesFuse:
    """Rules-only fusion in FuseOps' place (after LegalizeOps + AnnotateTIROpPattern, before
    FuseTIR). Caps left as None come from the PassContext's ``costfuse.*`` keys."""

    max_chain_length: int | None = None
    max_body_ops: int | None = None

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        register_config_keys()
        config = FusionConfig.resolve(
            max_chain_length=self.max_chain_length, max_body_ops=self.max_body_ops
        )
        return apply_per_function(
            mod, lambda m, name: rules_groups(build_graph(m, name), config))
