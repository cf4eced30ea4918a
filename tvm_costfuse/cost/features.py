"""Group features: what a cost model sees of a candidate fused group.

Analytical and learned models read the same ``GroupFeatures`` (``FEATURE_NAMES`` fixes the
order of the learned model's input vector), computed from the OpGraph alone, so a plan can be
priced without building anything.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, fields
from typing import NamedTuple

from ..graph import Node, OpPattern
from ..schedules import catalog
from ..schedules.card import Card
from ..schedules.classes import ScheduleClass as SC
from ..schedules.efficiency import Geometry

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
    if node.pool:  # an average pool's window sum and padding checks count as a multiply-add
        return "reduction"
    if node.reduction_extent > 1 and node.flops >= _MAC_RATIO * out * node.reduction_extent:
        return "contraction"
    if node.reduction_extent > 1 or node.pattern == OpPattern.COMM_REDUCE or node.reduces:
        return "reduction"  # over unit extents too: the rules see its init
    if node.pattern in (OpPattern.ELEMWISE, OpPattern.BROADCAST):
        return "elementwise"
    return "injective"


@functools.lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int:
    bits = "".join(c for c in dtype if c.isdigit())
    return max(1, int(bits or 32) // 8)


def _is_window(node: Node) -> bool:
    """A pooling window (``Node.pool``: read off the PrimFunc), or a reduction that shrinks
    its input but reads it more than once (overlapping windows, for graphs without
    PrimFuncs); normalizations (softmax, layer norm) keep the input's shape and are not."""
    if node.pool:
        return True
    itemsize = _itemsize(node.outputs[0].dtype) if node.outputs else 4
    biggest_input = max(1, max(node.input_bytes, default=0) // itemsize)
    out = _elems(node)
    return out < biggest_input and out * node.reduction_extent > 1.5 * biggest_input


@functools.lru_cache(maxsize=1 << 16)
def _elems(node: Node) -> int:
    return sum((t.nbytes or 0) // _itemsize(t.dtype) for t in node.outputs)


class OpWork(NamedTuple):
    """One member's work inside a group: each op's loop keeps its own parallelism inside a
    fused kernel, so compute time is summed per op, not over the largest output. A tuple,
    stored in JSON rows as a list (older rows lack the last fields: their defaults)."""

    contraction: bool
    flops: float
    elems: int  # output elements: the op's parallelism
    in_prologue: bool = False  # feeds a contraction: on CPU its own loop nest, not the tile
    math: float = 0.0  # exp-equivalents (``schedules.math_calls.MATH_COST``)
    geometry: Geometry | None = None  # a contraction's block (``schedules.efficiency``)

    @classmethod
    def of(cls, value) -> OpWork:
        """An entry from its stored form."""
        work = cls(*value)
        return work._replace(geometry=Geometry.of(work.geometry)) if work.geometry else work


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
    # Those of the boundary inputs that are constants (weights), and the bytes of all the
    # module's constants: where those pass half the last-level cache, every call of the model
    # streams each weight from DRAM again, whatever its own size.
    constant_sizes: tuple[int, ...] = ()
    module_constant_bytes: int = 0
    tuple_items: int = 0
    prologue_compute: int = 0
    # Tensors the group hands to the rest of the program, and reordering data movement
    # (transposes) downstream of a reduction: what decides whether the CPU row-reduction rule
    # applies (``schedules.reduction._claims_reduction``).
    n_outputs: int = 1
    moves_after_reduction: int = 0
    # The group's last member ends in a reducing block (``Node.ends_in_reduction``): a kernel
    # whose last block reduces is no row reduction to the CPU rule (a max pool alone).
    ends_in_reduction: int = 0
    # Reshape-like members TVM turns into a view when they are left alone (``Node.view``).
    view_ops: int = 0
    # Each member's work (:class:`OpWork`).
    op_work: tuple[OpWork, ...] = ()
    # softmax(...) V with the scores computed in the group or read, as the CPU attention rule
    # schedules it (``extract._is_attention``; ``schedules/attention.py``).
    attention: bool = False
    # Elements written by permutations that move the innermost axis and gather their loads,
    # fused with other members (``Node.moves_innermost``; ``extract._gathered``).
    gathered_elems: int = 0
    # Elements written by such a permutation alone in its kernel: the tile rule's copy, which
    # costs more than its stream (``extract._transposed``).
    transposed_elems: int = 0

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
                if f.name == "op_work":
                    values[f.name] = tuple(OpWork.of(w) for w in values[f.name])
            elif f.name in by_name:
                values[f.name] = (float if f.type in ("float", float) else int)(by_name[f.name])
        return cls(**values)

    @functools.cached_property  # asked several times per estimate; fields never change
    def schedule(self) -> SC:
        """The group's form before a target decides its kernel (the cards' claims read it):
        one contraction with an elementwise epilogue, with producers (a prologue) or with a
        reshaping epilogue; reductions with epilogues; elementwise; else the fallback."""
        if self.n_contractions == 0:
            if self.window_reductions and self.n_ops > 1:
                # Row-reduction rules schedule reductions over an axis; a pooling window
                # fused with other ops falls back (measured: resnet18 with maxpool fused into
                # BN + ReLU ran 1.25x slower on CPU). Alone, an average pool is the row
                # rule's (its sum and its divide); a max pool ends in its reduction, and
                # the row-reduction card leaves it to the fallback's (``ends_in_reduction``).
                return SC.FALLBACK
            return SC.REDUCTION if self.n_reductions else SC.ELEMENTWISE
        if self.n_contractions == 1 and self.n_reductions == 0:
            if self.prologue_ops:
                return SC.CONTRACTION_PROLOGUE
            return SC.CONTRACTION if not self.reshaping_ops else SC.CONTRACTION_RESHAPE
        return SC.FALLBACK

    def card_on(self, kind: str) -> Card:
        """The card of the kernel this group becomes on a target kind (``"cpu"``, ``"cuda"``):
        the first in ``schedules.catalog`` that claims it. Each card says why it claims what
        it claims, with the measurements behind it."""
        key = f"_card_{catalog.target_kind(kind)}"
        card = self.__dict__.get(key)
        if card is None:  # cached in the instance: asked once per estimate and per merge
            card = self.__dict__[key] = catalog.claim(self, kind)
        return card

    def priced_as(self, kind: str, card: Card) -> GroupFeatures:
        """These features with ``card`` as their kernel on a ``kind`` target, whatever the
        catalog claims (the plan's rule check found the kernel runs as that card's rule)."""
        self.__dict__[f"_card_{catalog.target_kind(kind)}"] = card
        return self

    def schedule_on(self, kind: str) -> SC:
        """The schedule class on a target kind (:meth:`card_on`'s)."""
        return self.card_on(kind).cls


_NOT_LEARNED = ("boundary_sizes", "constant_sizes", "module_constant_bytes", "tuple_items",
                "prologue_compute", "n_outputs", "moves_after_reduction", "view_ops", "op_work", "attention",
                "ends_in_reduction", "gathered_elems", "transposed_elems")
FEATURE_NAMES = tuple(f.name for f in fields(GroupFeatures) if f.name not in _NOT_LEARNED)
