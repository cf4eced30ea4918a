"""Group features: what a cost model sees of a candidate fused group.

Analytical and learned models read the same ``GroupFeatures`` (``FEATURE_NAMES`` fixes the
order of the learned model's input vector), computed from the OpGraph alone, so a plan can be
priced without building anything.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, fields

from ..graph import Node, OpGraph, OpPattern
from ..schedules.classes import ScheduleClass as SC

_log = logging.getLogger(__name__)
# Context fields already reported missing from a stored row (one warning per field).
_warned_missing: set[str] = set()

# A contraction does one multiply-add per reduction step and output element: FLOPs per output
# element near 2 x reduction extent. Softmax is pattern 4 too, but does a few FLOPs per step.
_MAC_RATIO = 1.5


@functools.lru_cache(maxsize=1 << 16)  # asked for every node of every candidate group
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


@functools.lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int:
    bits = "".join(c for c in dtype if c.isdigit())
    return max(1, int(bits or 32) // 8)


def _is_window(node: Node) -> bool:
    """A reduction that shrinks its input but reads it more than once (overlapping pooling
    windows); normalizations (softmax, layer norm) keep the input's shape and are not."""
    itemsize = _itemsize(node.outputs[0].dtype) if node.outputs else 4
    biggest_input = max(1, max(node.input_bytes, default=0) // itemsize)
    out = _elems(node)
    return out < biggest_input and out * node.reduction_extent > 1.5 * biggest_input


@functools.lru_cache(maxsize=1 << 16)
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
    prologue_ops: int = 0  # members that feed a contraction inside the group
    reshaping_ops: int = 0  # data-movement members (transpose, reshape, split) outside a prologue
    window_reductions: int = 0  # pooling: overlapping windows, not one pass over an axis
    math: float = 0.0  # exp, log, tanh, erf... in exp-equivalents (``schedules.math_calls.MATH_COST``)
    # Not part of the learned model's fixed-length vector: sizes of the tensors crossing the
    # boundary (where each is served from depends on its own size), extra tuple elements read
    # from multi-output members outside the prologue (a split fans one tensor out into
    # several; batch_norm's single used element does not), and prologue members that compute
    # rather than move data (what a contraction rule can take).
    boundary_sizes: tuple[int, ...] = ()
    tuple_items: int = 0
    prologue_compute: int = 0
    # Tensors the group hands to the rest of the program, and reordering data movement
    # (transposes) downstream of a reduction: what decides whether the CPU row-reduction rule
    # applies (``schedule_on``).
    n_outputs: int = 1
    moves_after_reduction: int = 0
    # Reshape-like members TVM turns into a view when they are left alone (``Node.view``).
    view_ops: int = 0
    # (is_contraction, FLOPs, output elements, in_prologue, math) per op: each op's loop keeps
    # its own parallelism inside a fused kernel, so compute time is summed per op, not over the
    # largest output; a prologue op runs in its own loop nest on CPU, not in the contraction's
    # tile.
    op_work: tuple[tuple, ...] = ()

    @property
    def is_view(self) -> bool:
        """One reshape alone: a VM view at run time, no kernel (``explain.is_view``)."""
        return self.n_ops == 1 and self.view_ops == 1

    def vector(self) -> list[float]:
        return [float(getattr(self, name)) for name in FEATURE_NAMES]

    def context(self) -> dict:
        """The fields outside :meth:`vector`, JSON-ready: stored beside the vector so that a
        measured row re-prices exactly as the planner priced the group."""
        return {name: getattr(self, name) for name in _NOT_LEARNED}

    @classmethod
    def from_row(cls, row: dict) -> GroupFeatures:
        """The features a stored row was measured with, matched by name (the schema may have
        grown since: a field the row lacks takes its default)."""
        by_name = dict(zip(row["feature_names"], row["features"], strict=True))
        context = row.get("context") or {}
        missing = ([n for n in _NOT_LEARNED if n not in context]
                   + [n for n in FEATURE_NAMES if n not in by_name])
        if missing and not _warned_missing.intersection(missing):
            _warned_missing.update(missing)
            _log.warning("a stored row predates the feature fields %s (defaults used; "
                         "`costfuse refeature` recomputes them)",
                         ", ".join(missing))
        values = {}
        for f in fields(cls):
            if f.name in context:
                v = context[f.name]
                values[f.name] = (tuple(tuple(x) if isinstance(x, list) else x for x in v)
                                  if isinstance(v, list) else v)
                if f.name == "op_work":  # older rows lack in_prologue and math: defaults
                    values[f.name] = tuple(w + (False, 0.0)[len(w) - 3:] if len(w) < 5 else w
                                           for w in values[f.name])
            elif f.name in by_name:
                values[f.name] = (float if f.type in ("float", float) else int)(by_name[f.name])
        return cls(**values)

    @property
    def schedule(self) -> SC:
        """Which schedule class the group lands in (CPU rules and dlight alike): one
        contraction with spatial producers/epilogue, reductions with epilogues, elementwise,
        or the fallback that leaves contractions unblocked and intermediates materialized."""
        if self.n_contractions == 0:
            if self.window_reductions and self.n_ops > 1:
                # Row-reduction rules schedule reductions over an axis; a pooling window
                # fused with other ops falls back (measured: resnet18 with maxpool fused into
                # BN + ReLU ran 1.25x slower on CPU).
                return SC.FALLBACK
            return SC.REDUCTION if self.n_reductions else SC.ELEMENTWISE
        # Contraction rules (ours on CPU, dlight's Matmul on CUDA) take one contraction with an
        # elementwise epilogue; reshaping epilogues and prologues: see ``schedule_on``.
        if self.n_contractions == 1 and self.n_reductions == 0:
            if self.prologue_ops:
                return SC.CONTRACTION_PROLOGUE
            return SC.CONTRACTION if not self.reshaping_ops else SC.CONTRACTION_RESHAPE
        return SC.FALLBACK

    def schedule_on(self, kind: str) -> SC:
        """The schedule class on a target kind.

        A contraction with data-movement or elementwise producers (a prologue) or with a
        reshaping epilogue is scheduled differently per target:

        - CUDA: dlight's Matmul rule inlines data-movement producers (transpose, reshape,
          split) into its operand loads and keeps its tiled kernel for reshape and transpose
          epilogues (ptxas: gpt2_block's projection matmul uses 64 registers and 6912 B of
          shared memory with and without its head-merging transpose prologue, full and small
          shapes; ``tests/test_transform.py`` compiles the zoo). Computing prologues would be
          re-evaluated per operand load (unmeasured on CUDA): fallback.
        - CPU: our rule keeps producers as one streamed packing pass (a conv's pad absorbs a
          BN + ReLU prologue; ``contraction+stream``: those intermediates still reach memory;
          measured fused/unfused 0.78-1.03 per kernel). A data-movement epilogue (transpose,
          reshape) falls back: per kernel it measured neutral, but inside bert_layer each of
          its three head-split/merge groups made the model slower (0.4, 1.1 and 2.2 ms of
          22.5; ablation in docs/benchmarks.md).
        - CPU: our row-reduction rule needs every block on the rows of the last one, so a
          reduction group that hands out a second tensor (an elementwise member read outside
          the group besides the reduced result) or transposes after its reduction falls back
          (a reshape keeps the rows): applying the rules
          to the 150 measured reduction groups of the zoo and the synthetic programs (49 fell
          back, 101 took the rule, no disagreement; synth-0's ``mul + mul1 + square1 + mean1``
          measured 2.6x slower fused than its parts); ``tests/test_features.py`` repeats the
          check on two small programs.
        - Both: a split epilogue (several elements of one tuple read after the contraction;
          ``tuple_items``) lands in the fallback: TVM 0.27 fails to lower it on CUDA
          ("matmul_intermediate_reindex is used before its definition") and our CPU rule
          declines a contraction with several consumers (measured 54x slower: gpt2_block's
          Q/K/V projection).
        """
        schedule = self.schedule
        if schedule == SC.REDUCTION and kind != "cuda" and (
                self.n_outputs > 1 or self.moves_after_reduction):
            return SC.FALLBACK
        if schedule not in (SC.CONTRACTION_RESHAPE, SC.CONTRACTION_PROLOGUE):
            return schedule
        if self.tuple_items:
            return SC.FALLBACK
        if kind == "cuda":
            return SC.FALLBACK if self.prologue_compute else SC.CONTRACTION
        return SC.CONTRACTION_STREAM if schedule == SC.CONTRACTION_PROLOGUE and not (
            self.reshaping_ops) else SC.FALLBACK


_NOT_LEARNED = ("boundary_sizes", "tuple_items", "prologue_compute",
                "n_outputs", "moves_after_reduction", "view_ops", "op_work")
FEATURE_NAMES = tuple(f.name for f in fields(GroupFeatures) if f.name not in _NOT_LEARNED)


def _is_move(node, cls: str) -> bool:
    """Data movement: an injective call_tir without arithmetic (transpose, reshape, split)."""
    return cls == "injective" and node.kind == "call_tir" and not node.flops


class _NodeFacts:
    """What ``group_features`` reads of one node, computed once per graph: the planner asks
    about tens of thousands of groups of one graph, most of a few ops, so per call only the
    group-dependent work is left and each fact is one attribute read."""

    __slots__ = (
        "computes",
        "consumers",
        "contraction",
        "dtype",
        "elems",
        "escapes_block",
        "flops",
        "index",
        "inputs",
        "is_call",
        "is_move",
        "math",
        "move_reorders",
        "name",
        "node",
        "producers",
        "reads",
        "reduction",
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
        self.escapes_block = node.name in graph.block_outputs
        self.is_move = _is_move(node, cls)
        self.move_reorders = self.is_move and not node.reshape_like
        self.elems = _elems(node)
        self.window = self.reduction and _is_window(node)
        gets = sum(graph[r].kind == "tuple_get_item" for r in self.consumers)
        self.tuple_extra = max(0, gets - 1) if len(node.outputs) > 1 else 0
        self.flops, self.math, self.written = node.flops, node.math, node.bytes_written
        self.dtype = node.outputs[0].dtype if node.outputs else None
        self.is_call, self.view = node.kind == "call_tir", node.view
        # ``op_work`` entries, outside a prologue and in one.
        self.work = tuple((self.contraction, node.flops, self.elems, p, node.math)
                          for p in (False, True))


def _facts(graph: OpGraph) -> dict[str, _NodeFacts]:
    table = graph.__dict__.get("_feature_facts")
    if table is None:
        table = {n.name: _NodeFacts(graph, n) for n in graph.nodes}
        object.__setattr__(graph, "_feature_facts", table)  # OpGraph is frozen: a cache only
    return table


def _index(f: _NodeFacts) -> int:
    return f.index


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
    internal_bytes = multi_use = reductions = windows = moves = moves_after = tuple_extra = 0
    for f in group:
        name = f.name
        for src, size in f.inputs:
            if src not in member and src not in ext_in:
                ext_in[src] = size
        inside = sum(map(member.__contains__, f.consumers))
        if f.escapes_block or inside < len(f.consumers):
            outputs.append(f)
        else:
            internal_bytes += f.written
            multi_use += inside > 1
        producers = f.producers
        depth[name] = 1 + max([depth.get(p, 0) for p in producers], default=0)
        if f.reduction:
            reductions += 1
            windows += f.window
            after_reduction.add(name)
            for src in f.reads:
                shared_reads[src] = shared_reads.get(src, 0) + 1
        elif producers and not after_reduction.isdisjoint(producers):
            after_reduction.add(name)
        if f.contraction:
            contractions.append(f)
        moves += f.is_move
        moves_after += f.move_reorders and name in after_reduction
        tuple_extra += f.tuple_extra

    prologue = _prologue(facts, member, contractions) if contractions else []
    in_prologue = {p.name for p in prologue}
    # Inlining an elementwise producer into a contraction would recompute it once per use of
    # each of its elements (N times for the A operand of an M x K x N matmul).
    recompute = 0.0
    for f in prologue:
        uses = sum(facts[r].flops / 2 / max(1, f.elems) for r in f.consumers
                   if r in member and facts[r].contraction)
        recompute += f.flops * max(0.0, uses - 1)
    # Data movement (transpose, reshape, split: injective, no arithmetic) after the contraction;
    # batch_norm is injective too (it returns a tuple) but computes, and inlines like an
    # elementwise epilogue.
    reshaping = moves - sum(p.is_move for p in prologue) if contractions else 0
    calls = [f for f in group if f.is_call]
    dtype = next((f.dtype for f in group if f.dtype is not None), "float32")
    written_out = [f.written for f in outputs]
    return GroupFeatures(
        n_ops=len(calls),
        n_contractions=len(contractions),
        n_reductions=reductions,
        flops=sum([f.flops for f in group]),
        contraction_flops=sum([f.flops for f in contractions]),
        recompute_flops=recompute,
        bytes_in=sum(ext_in.values()),
        bytes_out=sum(written_out),
        bytes_internal=internal_bytes,
        chain_length=max(depth.values(), default=0),
        out_elems=max([f.elems for f in outputs], default=0),
        n_args=len(ext_in) + len(outputs),
        live_values=len(ext_in) + multi_use,
        accumulators=max(shared_reads.values(), default=0),
        dtype_bytes=_itemsize(dtype),
        prologue_ops=len(prologue),
        boundary_sizes=(*ext_in.values(), *written_out),
        tuple_items=tuple_extra - sum(p.tuple_extra for p in prologue),
        prologue_compute=sum(p.computes for p in prologue),
        op_work=tuple([f.work[f.name in in_prologue] for f in calls]),
        window_reductions=windows,
        math=sum([f.math for f in group]),
        reshaping_ops=reshaping,
        n_outputs=len(outputs),
        moves_after_reduction=moves_after,
        view_ops=sum(f.view for f in calls),
    )
