"""Group features: what a cost model sees of a candidate fused group.

Analytical and learned models read the same ``GroupFeatures`` (``FEATURE_NAMES`` fixes the
order of the learned model's input vector), computed from the OpGraph alone, so a plan can be
priced without building anything.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, fields

from ..graph import Node, OpPattern
from ..schedules.classes import ScheduleClass as SC

_log = logging.getLogger(__name__)
# Context fields already reported missing from a stored row (one warning per field).
_warned_missing: set[str] = set()

# A contraction does one multiply-add per reduction step and output element: FLOPs per output
# element near 2 x reduction extent. Softmax is pattern 4 too, but does a few FLOPs per step.
_MAC_RATIO = 1.5


def _tupled(value):
    """A JSON value with every list a tuple, nested ones too (features stay hashable)."""
    return tuple(_tupled(x) for x in value) if isinstance(value, list) else value


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
    # softmax(...) V with the scores computed in the group or read, as the CPU attention rule
    # schedules it (``extract._is_attention``; ``schedules/attention.py``).
    attention: bool = False

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
                values[f.name] = _tupled(v)
                if f.name == "op_work":  # older rows lack in_prologue, math, geometry
                    values[f.name] = tuple(w + (False, 0.0, None)[len(w) - 3:] if len(w) < 6
                                           else w for w in values[f.name])
            elif f.name in by_name:
                values[f.name] = (float if f.type in ("float", float) else int)(by_name[f.name])
        return cls(**values)

    @functools.cached_property  # asked several times per estimate; fields never change
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
        - CPU: attention (``attention``: a softmax over the keys feeding P V, the scores
          computed in the group or read; one output) gets its own rule, one parallel loop
          over batch x query-row blocks. Measured fused against the split kernels in
          ``cost/analytical.py``. On CUDA dlight has no such rule: the fallback, as before.
        - Both: a split epilogue (several elements of one tuple read after the contraction;
          ``tuple_items``) lands in the fallback: TVM 0.27 fails to lower it on CUDA
          ("matmul_intermediate_reindex is used before its definition") and our CPU rule
          declines a contraction with several consumers (measured 54x slower: gpt2_block's
          Q/K/V projection).
        """
        if self.attention and kind != "cuda":
            return SC.ATTENTION
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
                "n_outputs", "moves_after_reduction", "view_ops", "op_work", "attention")
FEATURE_NAMES = tuple(f.name for f in fields(GroupFeatures) if f.name not in _NOT_LEARNED)
