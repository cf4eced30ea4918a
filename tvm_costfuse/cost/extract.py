"""group_features: a candidate group's ``GroupFeatures``, computed from the OpGraph.

The planner prices tens of thousands of candidate groups per graph, most of a few ops, so the
per-call overhead is what costs: what each node contributes is prepared once per graph
(``_NodeFacts``), and one pass over the members in binding order does the rest.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from ..graph import OpGraph
from ..schedules.attention import MAX_KEYS
from ..schedules.math_calls import NESTED_CALL_FACTOR
from .features import GroupFeatures, OpWork, _elems, _is_window, _itemsize, op_class


def _is_move(node, cls: str) -> bool:
    """Data movement: an injective call_tir without arithmetic (transpose, reshape, split)."""
    return cls == "injective" and node.kind == "call_tir" and not node.flops


def _unit_reshape(graph: OpGraph, node) -> bool:
    """A reshape that only adds or drops unit dimensions (``(128, 3072) -> (1, 128, 3072)``,
    as the PyTorch importer wraps every Linear of a 3-D input): inlined, its indices are the
    producer's with a constant 0, so a kernel's epilogue or prologue through it is the same
    loop nest as without it. Other reshapes split or merge axes (div/mod indices)."""
    if not node.reshape_like or len(node.outputs) != 1 or len(node.inputs) != 1:
        return False
    source = node.inputs[0]
    if source.startswith("%") or len(graph[source].outputs) != 1:
        return False

    def squeezed(shape) -> tuple:
        return tuple(d for d in shape if d != 1)

    return squeezed(graph[source].outputs[0].shape) == squeezed(node.outputs[0].shape)


class _NodeFacts:
    """What ``group_features`` reads of one node, computed once per graph: the planner asks
    about tens of thousands of groups of one graph, most of a few ops, so per call only the
    group-dependent work is left and each fact is one attribute read."""

    __slots__ = (
        "computes",
        "consumers",
        "contraction",
        "elems",
        "ends_in_reduction",
        "escapes_block",
        "flops",
        "gathers",
        "index",
        "inputs",
        "is_call",
        "is_move",
        "itemsize",
        "math",
        "move_reorders",
        "moves_data",
        "moves_or_splits",
        "n_consumers",
        "name",
        "node",
        "producers",
        "reads",
        "reduction",
        "tiles_alone",
        "tuple_extra",
        "view",
        "window",
        "work",
        "written",
    )

    def __init__(self, graph: OpGraph, node) -> None:
        cls = op_class(node)
        self.node, self.name, self.index = node, node.name, node.index
        self.contraction, self.reduction = cls == "contraction", cls == "reduction"
        self.computes = cls != "injective"
        self.inputs = tuple(zip(node.inputs, node.input_bytes, strict=True))
        self.reads = node.inputs if self.reduction else ()  # counted by ``accumulators``
        self.producers = graph.producers(node.name)
        self.consumers = graph.consumers.get(node.name, ())
        self.n_consumers = len(self.consumers)
        self.escapes_block = node.name in graph.block_outputs
        self.is_move = _is_move(node, cls) and not _unit_reshape(graph, node)
        self.move_reorders = self.is_move and not node.reshape_like
        self.gathers = node.moves_innermost
        self.tiles_alone = node.tiles_alone
        self.moves_data = _is_move(node, cls)  # a unit reshape too
        self.elems = _elems(node)
        self.window = self.reduction and _is_window(node)
        gets = sum(graph[r].kind == "tuple_get_item" for r in self.consumers)
        self.tuple_extra = max(0, gets - 1) if len(node.outputs) > 1 else 0
        self.moves_or_splits = self.is_move or self.tuple_extra > 0
        self.flops, self.math, self.written = node.flops, node.math, node.bytes_written
        self.itemsize = _itemsize(node.outputs[0].dtype) if node.outputs else None
        self.is_call, self.view = node.kind == "call_tir", node.view
        self.ends_in_reduction = node.ends_in_reduction
        # ``op_work`` entries, outside a prologue and in one.
        self.work = tuple(OpWork(self.contraction, node.flops, self.elems, p, node.math,
                                 node.geometry) for p in (False, True))


def _facts(graph: OpGraph) -> dict[str, _NodeFacts]:
    table = graph.__dict__.get("_feature_facts")
    if table is None:
        table = {n.name: _NodeFacts(graph, n) for n in graph.nodes}
        object.__setattr__(graph, "_feature_facts", table)  # OpGraph is frozen: a cache only
    return table


def _built(values: dict) -> GroupFeatures:
    """GroupFeatures from every field's value. The frozen dataclass's ``__init__`` sets each
    of its fields through ``object.__setattr__`` (measured: 8.4 us of the 30 us a one-member
    group took)."""
    f = object.__new__(GroupFeatures)
    f.__dict__.update(values)
    return f


_ZEROS = itertools.repeat(0)  # depth of a producer outside the group


def _index(f: _NodeFacts) -> int:
    return f.index


def _work(f: _NodeFacts, in_prologue: bool, nested: set[str]) -> OpWork:
    """``f``'s ``op_work`` entry; a nested math call is priced as the libm call it stays."""
    if f.name not in nested:
        return f.work[in_prologue]
    return OpWork(f.contraction, f.flops, f.elems, in_prologue, f.math * NESTED_CALL_FACTOR,
                  f.node.geometry)


def _prologue(facts: dict[str, _NodeFacts], member, contractions: list) -> list[_NodeFacts]:
    """Members feeding a contraction inside the group, found backwards from it, in binding
    order (``recompute_flops`` is a float sum over them)."""
    found: dict[str, _NodeFacts] = {}
    stack = list(contractions)
    while stack:
        for p in stack.pop().producers:
            if p in member and p not in found and not facts[p].contraction:
                found[p] = facts[p]
                stack.append(facts[p])
    return sorted(found.values(), key=_index)


def regroups_scores(graph: OpGraph, f: _NodeFacts) -> bool:
    """A reshape on the scores' way to the softmax that splits or merges axes (swin's windows:
    ``(B * nW, heads, 49, 49) -> (B, nW, heads, 49, 49)`` to add the shifted-window mask, and
    back). Inlined into the fused kernel, every score read carries its div/mod indices:
    swin_t's windowed attention kernels ran 45 ms against FuseOps' 33 ms for the same heads
    split (``kernel_profile.py``, docs/log/2026-12-01b.md). A unit reshape is no such regrouping."""
    return f.node.reshape_like and not _unit_reshape(graph, f.node)


def _softmax_chain(graph: OpGraph, facts: dict[str, _NodeFacts], member, operand: str,
                   qk: _NodeFacts | None, keys: int) -> bool:
    """Whether the members ``operand`` is computed from (up to ``qk``) are a softmax over the
    keys: a row reduction over them, a math call per element, no reordering data movement
    after the scores or a reduction (reshapes keep the rows), and ``qk`` feeding it."""
    chain: dict[str, _NodeFacts] = {}
    stack = [operand]
    while stack:
        name = stack.pop()
        if name in chain or name not in member or (qk is not None and name == qk.name):
            continue
        if facts[name].contraction:
            return False
        chain[name] = facts[name]
        stack.extend(facts[name].producers)
    p_elems = facts[operand].elems
    if not any(f.reduction and f.node.reduction_extent == keys for f in chain.values()):
        return False
    if sum(f.math for f in chain.values()) < p_elems:
        return False
    if qk is not None and (qk.elems != p_elems
                           or not any(qk.name in f.producers for f in chain.values())):
        return False
    after = {qk.name} if qk is not None else set()
    for f in sorted(chain.values(), key=_index):
        if f.reduction or not after.isdisjoint(f.producers):
            if f.move_reorders and not after.isdisjoint(f.producers):
                return False
            if regroups_scores(graph, f) and not after.isdisjoint(f.producers):
                return False
            after.add(f.name)
    reductions = [f for f in (facts[n] for n in member) if f.reduction]
    return all(f.name in chain for f in reductions)


def _is_attention(graph: OpGraph, facts: dict[str, _NodeFacts], member,
                  contractions: list[_NodeFacts]) -> bool:
    """``softmax(S) V`` as the CPU attention rule takes it (``schedules/attention.py``).

    The last contraction's row operand ``P`` (``[.., rows, keys]``, keys its reduction extent)
    is computed in the group by a softmax over the keys (:func:`_softmax_chain`; a layer
    norm's per-row rsqrt feeding a Linear is no attention) from scores read from outside or
    computed by the group's other contraction (``Q K^T``, as many elements as ``P``); after
    P V only elementwise members. One query row per head (a decode step) is the rule's too
    (``schedules/attention_decode.py``).
    """
    if not 1 <= len(contractions) <= 2:
        return False
    pv, qk = contractions[-1], (contractions[0] if len(contractions) == 2 else None)
    node = pv.node
    keys = node.reduction_extent
    if not node.outputs or keys > MAX_KEYS:
        return False
    out = node.outputs[0].shape
    if len(out) < 2:
        return False
    candidates = [src for src in pv.producers if src in member and graph[src].outputs
                  and len(shape := graph[src].outputs[0].shape) >= 2
                  and shape[-1] == keys and shape[-2] == out[-2]]
    if not any(_softmax_chain(graph, facts, member, src, qk, keys) for src in candidates):
        return False
    # nothing outside the chain but the operands' producers and an elementwise epilogue
    downstream = {pv.name}
    for f in sorted((facts[n] for n in member), key=_index):
        if f.index > pv.index and not downstream.isdisjoint(f.producers):
            if f.is_move or f.reduction or f.contraction:
                return False
            downstream.add(f.name)
    return True


def _gathered(facts: dict[str, _NodeFacts], member, calls: list[_NodeFacts]) -> int:
    """Elements of the members that move the innermost axis and gather once inlined into the
    group's kernel. A transpose alone is the tile rule's copy (:func:`_transposed`: 0.13-0.14
    ns an element in L2 where the fused form took 1.0-1.5). Two such transposes
    joined through data movement only are taken to undo each other, a heuristic that fits
    the round trips the importers emit (segformer's image -> tokens -> image around its GELU
    ran 75 us, contiguous; counted, priced 958 us); a pair that composes into another
    gathering permutation is priced free."""
    movers = [f for f in calls if f.gathers] if len(calls) > 1 else []
    undone: set[str] = set()
    for f in movers:
        seen: set[str] = set()
        stack = [c for c in f.consumers if c in member]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            c = facts[name]
            if c.gathers:
                undone |= {f.name, name}
            elif c.moves_data:
                stack += [x for x in c.consumers if x in member]
    return sum([f.elems for f in movers if f.name not in undone])


def _transposed(calls: list[_NodeFacts]) -> int:
    """Elements of a permutation that moves the innermost axis, alone in its kernel (the only
    call: views around it move nothing) and run as register tiles there. One the tile rule
    declines runs the fallback's gathered rows, whose cost depends on the input row's
    stride (0.27-0.32 ns an element at 116 or 232 channels, 0.74-0.99 at 64 to 160 on a
    rocketlake core): such a kernel stays priced by its bytes alone, low where its rows are a
    multiple of 128 bytes."""
    return calls[0].elems if len(calls) == 1 and calls[0].tiles_alone else 0


def group_features(graph: OpGraph, members: Iterable[str]) -> GroupFeatures:
    """Features of fusing ``members`` (names of OpGraph nodes) into one kernel.

    One pass over the members in binding order (producers before consumers, so chain depth
    and what lies downstream of a reduction are known when a member is reached); float sums
    run in binding order so that a group's features do not depend on how it was named.
    """
    facts = _facts(graph)
    member = members if isinstance(members, (set, frozenset)) else set(members)
    group = sorted([facts[n] for n in member], key=_index)

    ext_in: dict[str, int] = {}
    outputs: list[_NodeFacts] = []
    contractions: list[_NodeFacts] = []
    depth: dict[str, int] = {}
    after_reduction: set[str] = set()
    shared_reads: dict[str, int] = {}
    inside_of, depth_of = member.__contains__, depth.get
    internal_bytes = multi_use = reductions = windows = moves = moves_after = tuple_extra = 0
    bytes_out = out_elems = chain = views = 0
    carries: set[str] = set()  # members whose inlined value holds a math call
    nested: set[str] = set()  # members whose math call takes one as input: scalar libm
    for f in group:
        name = f.name
        for src, size in f.inputs:
            if src not in member and src not in ext_in:
                ext_in[src] = size
        inside = sum(map(inside_of, f.consumers))
        if f.escapes_block or inside < f.n_consumers:
            outputs.append(f)
            bytes_out += f.written
            out_elems = max(out_elems, f.elems)
        else:
            internal_bytes += f.written
            multi_use += inside > 1
        producers = f.producers
        if carries and not carries.isdisjoint(producers):
            if f.math:
                nested.add(name)
            if not (f.reduction or f.contraction) and inside <= 1:
                carries.add(name)
        elif f.math and not (f.reduction or f.contraction) and inside <= 1:
            carries.add(name)
        d = depth[name] = 1 + max(map(depth_of, producers, _ZEROS), default=0)
        chain = max(chain, d)
        if f.reduction:
            reductions += 1
            windows += f.window
            after_reduction.add(name)
            for src in f.reads:
                shared_reads[src] = shared_reads.get(src, 0) + 1
        elif after_reduction and not after_reduction.isdisjoint(producers):
            after_reduction.add(name)
        if f.contraction:
            contractions.append(f)
        views += f.view
        if f.moves_or_splits:
            moves += f.is_move
            moves_after += f.move_reorders and name in after_reduction
            tuple_extra += f.tuple_extra

    calls = [f for f in group if f.is_call]
    if contractions:
        prologue = _prologue(facts, member, contractions)
        in_prologue = {p.name for p in prologue}
        # Data movement (transpose, reshape, split: injective, no arithmetic) after the
        # contraction; batch_norm is injective too (it returns a tuple) but computes, and
        # inlines like an elementwise epilogue.
        reshaping = moves - sum(p.is_move for p in prologue)
        tuple_extra -= sum(p.tuple_extra for p in prologue)
        op_work = tuple([_work(f, f.name in in_prologue, nested) for f in calls])
    else:
        prologue, reshaping = [], 0
        op_work = tuple([_work(f, False, nested) for f in calls])
    # Inlining an elementwise producer into a contraction would recompute it once per use of
    # each of its elements (N times for the A operand of an M x K x N matmul).
    recompute = 0.0
    for f in prologue:
        uses = sum(facts[r].flops / 2 / max(1, f.elems) for r in f.consumers
                   if r in member and facts[r].contraction)
        recompute += f.flops * max(0.0, uses - 1)
    itemsize = group[0].itemsize or next(
        (f.itemsize for f in group if f.itemsize), _itemsize("float32"))
    return _built({
        "n_ops": len(calls),
        "n_contractions": len(contractions),
        "n_reductions": reductions,
        "flops": sum([f.flops for f in group]),
        "contraction_flops": sum([f.flops for f in contractions]) if contractions else 0,
        "recompute_flops": recompute,
        "bytes_in": sum(ext_in.values()),
        "bytes_out": bytes_out,
        "bytes_internal": internal_bytes,
        "chain_length": chain,
        "out_elems": out_elems,
        "n_args": len(ext_in) + len(outputs),
        "live_values": len(ext_in) + multi_use,
        "accumulators": max(shared_reads.values()) if shared_reads else 0,
        "dtype_bytes": itemsize,
        "prologue_ops": len(prologue),
        "boundary_sizes": (*ext_in.values(), *[f.written for f in outputs]),
        "constant_sizes": tuple(v for k, v in ext_in.items() if k.startswith("%const")),
        "module_constant_bytes": graph.constant_bytes,
        "tuple_items": tuple_extra,
        "prologue_compute": sum([p.computes for p in prologue]) if prologue else 0,
        "op_work": op_work,
        "window_reductions": windows,
        "math": sum([f.math * (NESTED_CALL_FACTOR if f.name in nested else 1.0)
                     for f in group]),
        "reshaping_ops": reshaping,
        "n_outputs": len(outputs),
        "moves_after_reduction": moves_after,
        "ends_in_reduction": int(calls[-1].ends_in_reduction) if calls else 0,
        "view_ops": views,
        "gathered_elems": _gathered(facts, member, calls),
        "transposed_elems": _transposed(calls),
        "attention": len(outputs) == 1 and bool(contractions) and _is_attention(
            graph, facts, member, contractions),
    })
