"""Test helpers: synthetic OpGraphs as plain data, so planner tests and timings need no TVM
build (the planner tests, the planning-speed benchmark and the greedy-vs-exact script share
them)."""

from __future__ import annotations

import random

from .graph import Node, OpGraph, OpPattern, TensorInfo

_KINDS = [
    # (pattern, flops per output element, reduction extent, name)
    (OpPattern.OUT_EWISE_FUSABLE, 2 * 256, 256, "matmul"),
    (OpPattern.BROADCAST, 1, 1, "add"),
    (OpPattern.ELEMWISE, 8, 1, "gelu"),
    (OpPattern.COMM_REDUCE, 1, 256, "sum"),
    (OpPattern.INJECTIVE, 0, 1, "transpose"),
]


def make_graph(nodes: list[Node]) -> OpGraph:
    consumers: dict[str, list[str]] = {}
    for n in nodes:
        for src in n.inputs:
            if not src.startswith("%"):
                consumers.setdefault(src, []).append(n.name)
    last = nodes[-1].name
    return OpGraph("main", tuple(nodes), {k: tuple(v) for k, v in consumers.items()},
                   frozenset([last]))


def op(index: int, name: str, pattern: OpPattern, inputs: list[str], elems: int = 4096,
       flops_per_elem: float = 1.0, reduction: int = 1, in_elems: list[int] | None = None) -> Node:
    sizes = [4 * e for e in (in_elems or [elems] * len(inputs))]
    return Node(name, index, "call_tir", name, pattern, tuple(inputs),
                (TensorInfo((elems,), "float32"),), tuple(sizes), flops_per_elem * elems,
                sum(sizes), 4 * elems, reduction)


def random_dag(n: int, seed: int = 0, fan_in: float = 0.3) -> OpGraph:
    """n ops; each reads its predecessor and, with probability ``fan_in``, an earlier op."""
    rng = random.Random(seed)
    nodes = [op(0, "op0", OpPattern.ELEMWISE, ["%x"])]
    for i in range(1, n):
        pattern, fpe, red, _base = _KINDS[rng.randrange(len(_KINDS))]
        inputs = [f"op{i - 1}"]
        if i > 2 and rng.random() < fan_in:
            inputs.append(f"op{rng.randrange(max(0, i - 20), i - 1)}")
        nodes.append(op(i, f"op{i}", pattern, inputs, flops_per_elem=fpe, reduction=red))
    return make_graph(nodes)


def branchy_dag(n: int, seed: int = 0) -> OpGraph:
    """n ops, each reading one or two random earlier ops (or the input), with sizes from 1K
    to 1M elements: diamonds, siblings and fan-in that a chain-like graph never shows."""
    rng = random.Random(seed * 1009 + n)
    nodes: list[Node] = []
    for i in range(n):
        pattern, fpe, red, _ = _KINDS[rng.randrange(len(_KINDS))]
        pool = ["%x"] + [f"op{j}" for j in range(i)]
        inputs = sorted(set(rng.sample(pool, k=min(len(pool), rng.choice((1, 2))))))
        elems = 1 << rng.randrange(10, 21)
        nodes.append(op(i, f"op{i}", pattern, inputs, elems=elems, flops_per_elem=fpe,
                        reduction=red))
    return make_graph(nodes)
