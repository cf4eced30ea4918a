"""``group_features`` (``cost/extract.py``) is written for speed (one pass, per-node facts computed once per graph);
here it must equal the straightforward computation, feature by feature and bit for bit, on
every group the planner prices and on arbitrary member sets (convex or not)."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import prepared
from hypothesis import given
from hypothesis import strategies as st
from tvm_costfuse.schedules.math_calls import NESTED_CALL_FACTOR

from tvm_costfuse import FusionConfig, build_graph, plan_greedy, pricer
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.cost.features import (
    GroupFeatures,
    OpWork,
    _elems,
    _is_window,
    _itemsize,
    op_class,
)
from tvm_costfuse.graph import OpPattern
from tvm_costfuse.targets import preset
from tvm_costfuse.testing import branchy_dag, make_graph, random_dag


def reference_features(graph, members) -> GroupFeatures:
    """Each feature as its definition reads, from the OpGraph alone."""
    names = sorted(set(members), key=lambda n: graph[n].index)
    member = set(names)
    nodes = [graph[n] for n in names]
    cls = {n: op_class(graph[n]) for n in names}
    consumers = {n: graph.consumers.get(n, ()) for n in names}
    ext_in: dict[str, int] = {}
    for node in nodes:
        for src, size in zip(node.inputs, node.input_bytes, strict=True):
            if src not in member:
                ext_in.setdefault(src, size)
    outputs = [n for n in nodes
               if n.name in graph.block_outputs or any(r not in member for r in consumers[n.name])]
    internal = [n for n in nodes if n not in outputs]
    depth: dict[str, int] = {}
    for n in names:
        depth[n] = 1 + max((depth[p] for p in graph.producers(n) if p in member), default=0)
    prologue: set[str] = set()
    stack = [n for n in names if cls[n] == "contraction"]
    while stack:
        for p in graph.producers(stack.pop()):
            if p in member and p not in prologue and cls[p] != "contraction":
                prologue.add(p)
                stack.append(p)
    recompute = 0.0
    for p in sorted(prologue, key=lambda n: graph[n].index):
        uses = sum(graph[r].flops / 2 / max(1, _elems(graph[p])) for r in consumers[p]
                   if cls.get(r) == "contraction")
        recompute += graph[p].flops * max(0.0, uses - 1)

    def unit_reshape(n):  # only unit dims added or dropped: no data movement
        if not n.reshape_like or len(n.inputs) != 1 or n.inputs[0].startswith("%"):
            return False
        src = graph[n.inputs[0]]
        if len(src.outputs) != 1 or len(n.outputs) != 1:
            return False
        return ([d for d in src.outputs[0].shape if d != 1]
                == [d for d in n.outputs[0].shape if d != 1])

    def is_move(n):
        return (cls[n.name] == "injective" and n.kind == "call_tir" and not n.flops
                and not unit_reshape(n))

    shared: dict[str, int] = {}
    for n in nodes:
        if cls[n.name] == "reduction":
            for src in n.inputs:
                shared[src] = shared.get(src, 0) + 1
    after: set[str] = set()
    for n in names:
        if cls[n] == "reduction" or any(p in after for p in graph.producers(n)):
            after.add(n)
    # A math call whose input, after inlining, holds another math call stays a libm call:
    # values are inlined through one-consumer elementwise members, not through reductions,
    # contractions or members read twice inside the group.
    carries: set[str] = set()
    nested: set[str] = set()
    for n in nodes:
        from_call = any(p in carries for p in graph.producers(n.name) if p in member)
        if from_call and n.math:
            nested.add(n.name)
        inlinable = (cls[n.name] not in ("reduction", "contraction")
                     and sum(r in member for r in consumers[n.name]) <= 1)
        if (from_call or n.math) and inlinable:
            carries.add(n.name)

    def math(n) -> float:
        return n.math * (NESTED_CALL_FACTOR if n.name in nested else 1.0)

    calls = [n for n in nodes if n.kind == "call_tir"]
    has_contraction = "contraction" in cls.values()
    dtype = next((t.dtype for n in nodes for t in n.outputs), "float32")
    return GroupFeatures(
        n_ops=len(calls),
        n_contractions=sum(c == "contraction" for c in cls.values()),
        n_reductions=sum(c == "reduction" for c in cls.values()),
        flops=sum(n.flops for n in nodes),
        contraction_flops=sum(n.flops for n in nodes if cls[n.name] == "contraction"),
        recompute_flops=recompute,
        bytes_in=sum(ext_in.values()),
        bytes_out=sum(n.bytes_written for n in outputs),
        bytes_internal=sum(n.bytes_written for n in internal),
        chain_length=max(depth.values(), default=0),
        out_elems=max((_elems(n) for n in outputs), default=0),
        n_args=len(ext_in) + len(outputs),
        live_values=len(ext_in) + sum(
            1 for n in internal if sum(r in member for r in consumers[n.name]) > 1),
        accumulators=max(shared.values(), default=0),
        dtype_bytes=_itemsize(dtype),
        prologue_ops=len(prologue),
        boundary_sizes=tuple(ext_in.values()) + tuple(n.bytes_written for n in outputs),
        constant_sizes=tuple(v for k, v in ext_in.items() if k.startswith("%const")),
        module_constant_bytes=graph.constant_bytes,
        tuple_items=sum(max(0, sum(graph[r].kind == "tuple_get_item" for r in consumers[n.name])
                               - 1)
                        for n in nodes if n.name not in prologue and len(n.outputs) > 1),
        prologue_compute=sum(cls[p] != "injective" for p in prologue),
        op_work=tuple(OpWork(cls[n.name] == "contraction", n.flops, _elems(n),
                             n.name in prologue, math(n), n.geometry) for n in calls),
        window_reductions=sum(cls[n.name] == "reduction" and _is_window(n) for n in nodes),
        math=sum(math(n) for n in nodes),
        reshaping_ops=sum(is_move(n) and n.name not in prologue for n in nodes)
        if has_contraction else 0,
        n_outputs=len(outputs),
        moves_after_reduction=sum(n.name in after and is_move(n) and not n.reshape_like
                                  for n in nodes),
        view_ops=sum(n.view for n in calls),
        attention=reference_attention(graph, names, len(outputs)),
        gathered_elems=reference_gathered(graph, names),
        transposed_elems=_elems(graph[calls[0].name]) if len(calls) == 1
        and calls[0].tiles_alone else 0,
        ends_in_reduction=int(calls[-1].ends_in_reduction) if calls else 0,
    )


def reference_gathered(graph, names: list[str]) -> int:
    """Elements of the members that move the innermost axis, in a group of several calls,
    but for those from which another such member is reached through data movement (an
    injective call without arithmetic) inside the group, and that other one."""
    calls = [n for n in names if graph[n].kind == "call_tir"]
    if len(calls) < 2:
        return 0
    member = set(names)

    def moves_data(n) -> bool:
        return op_class(graph[n]) == "injective" and graph[n].kind == "call_tir" \
            and not graph[n].flops

    def reached(start) -> set[str]:
        seen, stack = set(), [c for c in graph.consumers.get(start, ()) if c in member]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if graph[n].moves_innermost:
                continue
            if moves_data(n):
                stack += [c for c in graph.consumers.get(n, ()) if c in member]
        return {n for n in seen if graph[n].moves_innermost and n != start}

    movers = [n for n in calls if graph[n].moves_innermost]
    undone = set()
    for n in movers:
        found = reached(n)
        if found:
            undone |= {n} | found
    return sum(_elems(graph[n]) for n in movers if n not in undone)


def reference_attention(graph, names: list[str], n_outputs: int) -> bool:
    """softmax(S) V as its definition reads (``extract._is_attention``): one output; the last of
    one or two contractions (P V) reads an operand P shaped ``[.., its rows, keys]``, computed in
    the group, from the scores, by members holding a row reduction over the keys and at least
    one math call per element of P, and every reduction of the group; no reordering move after
    the scores or a reduction on P's way; after P V only elementwise members."""
    from tvm_costfuse.schedules.attention import MAX_KEYS

    member = set(names)
    cls = {n: op_class(graph[n]) for n in names}
    contractions = [n for n in names if cls[n] == "contraction"]
    if n_outputs != 1 or not 1 <= len(contractions) <= 2:
        return False
    pv = graph[contractions[-1]]
    qk = contractions[0] if len(contractions) == 2 else None
    keys = pv.reduction_extent
    if keys > MAX_KEYS:
        return False

    def regroups(n) -> bool:
        node = graph[n]
        if not node.reshape_like:
            return False
        src = node.inputs[0] if len(node.inputs) == 1 else None
        if src is None or src.startswith("%") or len(graph[src].outputs) != 1:
            return True
        def squeeze(shape):
            return tuple(d for d in shape if d != 1)
        return squeeze(graph[src].outputs[0].shape) != squeeze(node.outputs[0].shape)

    def is_move(n) -> bool:
        return cls[n] == "injective" and graph[n].kind == "call_tir" and not graph[n].flops

    def softmax(operand: str) -> bool:
        chain, stack = set(), [operand]
        while stack:
            n = stack.pop()
            if n in chain or n not in member or n == qk:
                continue
            if cls[n] == "contraction":
                return False
            chain.add(n)
            stack.extend(graph.producers(n))
        if not any(cls[n] == "reduction" and graph[n].reduction_extent == keys for n in chain):
            return False
        if sum(graph[n].math for n in chain) < _elems(graph[operand]):
            return False
        if qk is not None and (_elems(graph[qk]) != _elems(graph[operand])
                               or not any(qk in graph.producers(n) for n in chain)):
            return False
        after = {qk} if qk else set()
        for n in sorted(chain, key=lambda n: graph[n].index):
            if cls[n] == "reduction" or any(p in after for p in graph.producers(n)):
                if (is_move(n) and not graph[n].reshape_like
                        and any(p in after for p in graph.producers(n))):
                    return False
                if regroups(n) and any(p in after for p in graph.producers(n)):
                    return False  # a reshape that splits or merges the scores' axes
                after.add(n)
        return all(n in chain for n in names if cls[n] == "reduction")

    out = pv.outputs[0].shape
    operands = [p for p in graph.producers(pv.name) if p in member and graph[p].outputs
                and len(graph[p].outputs[0].shape) >= 2
                and graph[p].outputs[0].shape[-1] == keys
                and graph[p].outputs[0].shape[-2] == out[-2]]
    if not any(softmax(p) for p in operands):
        return False
    downstream = {pv.name}
    for n in names:
        if graph[n].index > pv.index and any(p in downstream for p in graph.producers(n)):
            if is_move(n) or cls[n] in ("reduction", "contraction"):
                return False
            downstream.add(n)
    return True


def _priced_groups(monkeypatch, graph, target: str) -> list[frozenset]:
    """Every member set the greedy planner prices on ``graph``."""
    asked: list[frozenset] = []

    def recording(g, members):
        asked.append(frozenset(members))
        return group_features(g, members)

    monkeypatch.setattr(pricer, "group_features", recording)
    plan_greedy(graph, preset(target), FusionConfig())
    monkeypatch.undo()
    return asked


def _assert_equal(graph, groups) -> None:
    names = [f.name for f in dataclasses.fields(GroupFeatures)]
    wrong = [sorted(g) for g in groups if group_features(graph, g) != reference_features(graph, g)
             or any(n not in vars(group_features(graph, g)) for n in names)]  # no default
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("make", [lambda: random_dag(300, seed=1),
                                  lambda: branchy_dag(120, seed=3)], ids=["random", "branchy"])
@pytest.mark.parametrize("target", ["h100", "a100"])
def test_equal_on_every_group_the_planner_prices(monkeypatch, make, target):
    graph = make()
    _assert_equal(graph, _priced_groups(monkeypatch, graph, target))


@pytest.mark.parametrize("name", ["gpt2_block", "bert_layer", "conv_bn_relu", "mobilenetv2",
                                  "rmsnorm"])
def test_equal_on_zoo_groups(monkeypatch, name):
    # Contractions with prologues, split epilogues, TupleGetItems, reshapes and norms.
    graph = build_graph(prepared(name)[0])
    _assert_equal(graph, _priced_groups(monkeypatch, graph, "h100"))


@given(st.integers(0, 10_000), st.integers(2, 40), st.data())
def test_equal_on_arbitrary_member_sets(seed, n, data):
    graph = branchy_dag(n, seed=seed) if seed % 2 else random_dag(n, seed=seed)
    picked = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n))
    _assert_equal(graph, [frozenset(f"op{i}" for i in picked)])


@given(st.integers(0, 10_000), st.integers(2, 40), st.data())
def test_equal_with_gathering_transposes(seed, n, data):
    """The synthetic graphs with every data-movement node a transpose that moves the
    innermost axis (``Node.moves_innermost``), every other one tiled alone: chains and
    diamonds of them."""
    graph = branchy_dag(n, seed=seed) if seed % 2 else random_dag(n, seed=seed)
    moving = [node.kind == "call_tir" and node.pattern == OpPattern.INJECTIVE and not node.flops
              for node in graph.nodes]
    graph = make_graph([dataclasses.replace(node, moves_innermost=m, tiles_alone=m and i % 2 == 0)
                        for i, (node, m) in enumerate(zip(graph.nodes, moving))])
    picked = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n))
    _assert_equal(graph, [frozenset(f"op{i}" for i in picked)])


@pytest.mark.parametrize("past", [0, 128], ids=["at", "past"])
def test_equal_at_the_attention_key_limit(past):
    """Key rows of ``schedules.attention.MAX_KEYS`` are attention, longer ones not, in the
    features and in the reference alike (8 queries: the graph is what counts)."""
    from tvm_costfuse.schedules.attention import MAX_KEYS

    from tvm_costfuse.testing import attention_program

    graph = build_graph(attention_program(1, 1, MAX_KEYS + past, 16, "plain", rows=8)[0])
    names = [n.name for n in graph.nodes if n.kind == "call_tir"]
    assert group_features(graph, names).attention is (past == 0)
    _assert_equal(graph, [frozenset(names), frozenset(names[1:])])
