"""Group features: what a cost model sees of a candidate fused group.

Analytical and learned models read the same ``GroupFeatures`` (``FEATURE_NAMES`` fixes the
order of the learned model's input vector), computed from the OpGraph alone, so a plan can be
priced without building anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import astuple, dataclass, fields

from ..graph import Node, OpGraph, OpPattern

# A contraction does one multiply-add per reduction step and output element: FLOPs per output
# element near 2 x reduction extent. Softmax is pattern 4 too, but does a few FLOPs per step.
_MAC_RATIO = 1.5


def op_class(node: Node) -> str:
    """contraction (matmul, conv), reduction (sum, mean, softmax...), elementwise, injective."""
    if node.kind != "call_tir":
        return "injective"  # TupleGetItem: no work of its own
    out = max((t.nbytes or 0) // max(1, _itemsize(t.dtype)) for t in node.outputs) or 1
    if node.reduction_extent > 1 and node.flops >= _MAC_RATIO * out * node.reduction_extent:
        return "contraction"
    if node.reduction_extent > 1 or node.pattern == OpPattern.COMM_REDUCE:
        return "reduction"
    if node.pattern in (OpPattern.ELEMWISE, OpPattern.BROADCAST):
        return "elementwise"
    return "injective"


def _itemsize(dtype: str) -> int:
    bits = "".join(c for c in dtype if c.isdigit())
    return max(1, int(bits or 32) // 8)


def _elems(node: Node) -> int:
    return sum((t.nbytes or 0) // _itemsize(t.dtype) for t in node.outputs)


@dataclass(frozen=True)
class GroupFeatures:
    """Plain numbers describing one group (a single op is a group of one)."""

    n_ops: int
    n_contractions: int
    n_reductions: int
    flops: float
    contraction_flops: float
    recompute_flops: float  # extra work when inlined producers are evaluated once per use
    bytes_in: int  # distinct tensors read from outside the group
    bytes_out: int  # tensors the group hands to the rest of the program
    bytes_internal: int  # intermediates that fusion keeps out of memory (if inlined)
    chain_length: int  # longest producer -> consumer path inside the group
    out_elems: int  # elements of the largest output: the parallelism the kernel exposes
    n_args: int
    live_values: int  # values one thread / vector body keeps at once
    accumulators: int  # reductions over one shared input, evaluated in one loop
    dtype_bytes: int

    def vector(self) -> list[float]:
        return [float(v) for v in astuple(self)]

    @property
    def schedule(self) -> str:
        """Which schedule class the group lands in (CPU rules and dlight alike): one
        contraction with spatial producers/epilogue, reductions with epilogues, elementwise,
        or the fallback that leaves contractions unblocked and intermediates materialized."""
        if self.n_contractions == 0:
            return "reduction" if self.n_reductions else "elementwise"
        if self.n_contractions == 1 and self.n_reductions == 0:
            return "contraction"
        return "fallback"


FEATURE_NAMES = tuple(f.name for f in fields(GroupFeatures))


def group_features(graph: OpGraph, members: Iterable[str]) -> GroupFeatures:
    """Features of fusing ``members`` (names of OpGraph nodes) into one kernel."""
    names = [n for n in sorted(set(members), key=lambda n: graph[n].index)]
    member = set(names)
    nodes = [graph[n] for n in names]
    classes = {n.name: op_class(n) for n in nodes}

    ext_in: dict[str, int] = {}
    for n in nodes:
        for src, size in zip(n.inputs, n.input_bytes, strict=True):
            if src not in member:
                ext_in.setdefault(src, size)
    outputs, internal = [], []
    for n in nodes:
        readers = graph.consumers.get(n.name, ())
        escapes = n.name in graph.block_outputs or any(r not in member for r in readers)
        (outputs if escapes else internal).append(n)

    depth: dict[str, int] = {}
    for n in nodes:
        depth[n.name] = 1 + max((depth[p] for p in graph.producers(n.name) if p in member),
                                default=0)

    # Inlining an elementwise producer into a contraction recomputes it once per use of each
    # of its elements (N times for the A operand of an M x K x N matmul); into several
    # consumers, once per consumer.
    recompute = 0.0
    for n in nodes:
        inside_readers = [r for r in graph.consumers.get(n.name, ()) if r in member]
        if classes[n.name] in ("contraction", "reduction") or not inside_readers:
            continue
        uses = 0.0
        for r in inside_readers:
            reader = graph[r]
            if classes[r] == "contraction":
                uses += reader.flops / 2 / max(1, _elems(n))
            else:
                uses += 1
        recompute += n.flops * max(0.0, uses - 1)

    shared_reads: dict[str, int] = {}
    for n in nodes:
        if classes[n.name] == "reduction":
            for src in n.inputs:
                shared_reads[src] = shared_reads.get(src, 0) + 1
    multi_use = sum(
        1 for n in internal if sum(r in member for r in graph.consumers.get(n.name, ())) > 1
    )
    dtype = next((t.dtype for n in nodes for t in n.outputs), "float32")
    return GroupFeatures(
        n_ops=sum(1 for n in nodes if n.kind == "call_tir"),
        n_contractions=sum(1 for c in classes.values() if c == "contraction"),
        n_reductions=sum(1 for c in classes.values() if c == "reduction"),
        flops=sum(n.flops for n in nodes),
        contraction_flops=sum(n.flops for n in nodes if classes[n.name] == "contraction"),
        recompute_flops=recompute,
        bytes_in=sum(ext_in.values()),
        bytes_out=sum(n.bytes_written for n in outputs),
        bytes_internal=sum(n.bytes_written for n in internal),
        chain_length=max(depth.values(), default=0),
        out_elems=max((_elems(n) for n in outputs), default=0),
        n_args=len(ext_in) + len(outputs),
        live_values=len(ext_in) + multi_use,
        accumulators=max(shared_reads.values(), default=0),
        dtype_bytes=_itemsize(dtype),
    )
