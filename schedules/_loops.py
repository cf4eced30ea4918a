"""Loop-level building blocks of the CPU rules: classify, parallelize, vectorize, fall back.

``SafeRule`` is the base of every rule here: it runs the rule on a fresh schedule and turns any
failed precondition or rejected primitive into "does not apply" (None), so a rule can only
return a schedule whose every step TVM's own legality checks accepted.
"""

from __future__ import annotations

import logging

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target import Target

from ._common import (
    MIN_PARALLEL_FMAS,
    MIN_PARALLEL_ITERS,
    PARALLEL_CHUNKS_PER_CORE,
    contraction_parallel,
    int_extent,
    largest_divisor,
    num_cores,
    root_blocks,
    vector_lanes,
)
from .classes import ScheduleClass

_log = logging.getLogger(__name__)


def loop_kinds(sch: s_tir.Schedule, block: SBlockRV) -> list[str] | None:
    """Per loop of ``block`` (outer to inner): "S" or "R" for the iter it binds, else None.

    Only trivial bindings (each iter is one loop var) are classified; anything else returns None
    so callers don't guess.
    """
    stmt = sch.get(block)
    values = get_sblockrealize(sch, block).iter_values
    loops = sch.get_loops(block)
    var_kind = {}
    for iv, val in zip(stmt.iter_vars, values):
        if not isinstance(val, tirx.Var):
            if isinstance(val, tirx.IntImm):
                continue
            return None
        var_kind[val] = "S" if iv.iter_type == tirx.IterVar.DataPar else "R"
    kinds = []
    for loop in loops:
        var = sch.get(loop).loop_var
        kinds.append(var_kind.get(var, "S" if int_extent(sch, loop) == 1 else None))
    if any(k is None for k in kinds):
        return None
    return kinds


def parallelize(
    sch: s_tir.Schedule, loops: list[LoopRV], work: int, threshold: int = MIN_PARALLEL_ITERS
) -> LoopRV | None:
    """Fuse ``loops`` (outer, spatial); mark the result parallel when ``work >= threshold``.

    ``work`` is whatever unit ``threshold`` is in (elements by default, FMAs for contractions):
    below it, waking the thread pool costs more than the loop.
    """
    if not loops:
        return None
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if work >= threshold:
        sch.parallel(fused)
    return fused


def _product(extents: list[int | None]) -> int | None:
    out = 1
    for e in extents:
        if e is None:
            return None
        out *= e
    return out


# Loop annotation TIR's LoopPartition pass acts on: it peels the iterations where a condition
# (here the tail guard of a non-dividing split) is not provably true into their own loop.
PARTITION_HINT = "pragma_loop_partition_hint"


def _int32_hinted_loop(loop: tirx.For) -> tirx.For:
    """``loop`` over an int32 variable (its body reads it through an int64 cast) if it carries
    the partition hint over an int64 variable; otherwise ``loop`` as it is.

    TIR lowering narrows int64 loop variables to int32 (``NarrowDataType``) after it turned
    the hint into an attribute of the old variable, so LoopPartition no longer finds the
    loop and the guarded vectors stay scalar. A loop that is int32 already is left alone.
    """
    if PARTITION_HINT not in loop.annotations or str(loop.loop_var.ty) != "int64":
        return loop
    if not all(isinstance(e, tirx.IntImm) for e in (loop.min, loop.extent)):
        return loop
    old = loop.loop_var
    new = tirx.Var(old.name, "int32")
    wide = tirx.Cast("int64", new)
    body = tvm_ffi.structural_map(loop.body, (tirx.Var, lambda v: wide if v.same_as(old) else v))
    return tirx.For(new, tirx.IntImm("int32", int(loop.min)),
                    tirx.IntImm("int32", int(loop.extent)), loop.kind, body,
                    loop.thread_binding, loop.annotations)


@tirx.transform.prim_func_pass(opt_level=0, name="CostFuseInt32PartitionLoops")
def int32_partition_loops(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
    """Every loop with the partition hint over an int32 variable (:func:`_int32_hinted_loop`).

    Runs after the schedule rules, so that the loops the rules split into whole vectors and
    a tail do get partitioned."""
    body = tvm_ffi.structural_map(func.body, (tirx.For, _int32_hinted_loop))
    return func if body.same_as(func.body) else func.with_body(body)


def vectorize_with_tail(sch: s_tir.Schedule, loop: LoopRV, lanes: int) -> LoopRV:
    """Split ``loop`` into whole vectors of ``lanes`` plus a scalar tail; returns the outer loop.

    A non-dividing split guards every element with ``i * lanes + l < extent``, which LLVM
    cannot vectorize; the partition hint makes TIR peel the last, partial vector off, so all
    full vectors run unguarded (a 3199-long row: 199 vectors of 16 and a 15-element tail,
    instead of 457 vectors of 7 lanes).
    """
    outer, inner = sch.split(loop, factors=[None, lanes])
    sch.annotate(outer, PARTITION_HINT, 1)
    sch.vectorize(inner)
    return outer


def _injective_tile(extent: int, lanes: int) -> int | None:
    """Vector tile for a copy-like loop (no accumulators, so no register-pressure limit).

    A whole row up to 8 registers wide is one vector statement even at odd widths (a 114-wide
    padded row beats 19 six-lane pieces); longer rows take lanes-multiples that divide, and
    None means whole vectors with a peeled tail (:func:`vectorize_with_tail`).
    """
    for k in (4, 2, 1):
        if extent % (k * lanes) == 0:
            return k * lanes
    if extent <= 8 * lanes:
        return extent
    return None


def _broadcast_loops(sch: s_tir.Schedule, block: SBlockRV, loops: list[LoopRV]) -> list[LoopRV]:
    """The loops of a spatial ``block`` whose iterations store the same value: no load or
    condition of the stored expression depends on them (a ``broadcast_to``, or the head axis
    of a grouped-query key repeat). Innermost above the vector loop, LLVM hoists the value out
    of them and each repeat is one store; outermost, the whole expression (gathers of a
    transposed read included) is evaluated once per repeat."""
    stmt = sch.get(block)
    if not isinstance(stmt.body, tirx.BufferStore):
        return []
    used = set()
    tvm_ffi.structural_walk(stmt.body.value, (tirx.Var, lambda v: used.add(v)), order="post")
    values = get_sblockrealize(sch, block).iter_values
    var_of = {val: iv.var for iv, val in zip(stmt.iter_vars, values) if isinstance(val, tirx.Var)}
    out = []
    for loop in loops:
        var = var_of.get(sch.get(loop).loop_var)
        if var is not None and var not in used and (int_extent(sch, loop) or 0) > 1:
            out.append(loop)
    return out


def schedule_root_block(sch: s_tir.Schedule, block: SBlockRV, target: Target) -> None:
    """Generic CPU schedule for one block at the root: parallel outer S loops, vector inner.

    Spatial blocks: the innermost loop is split at the vector width and vectorized, all loops
    above are fused and parallelized. Reduction blocks: the leading spatial loops are fused and
    parallelized; reduction loops stay serial (vectorizing them needs reassociation).
    """
    kinds = loop_kinds(sch, block)
    loops = sch.get_loops(block)
    if kinds is None or not loops:
        return
    stmt = sch.get(block)
    if not stmt.writes:
        return
    dtype = str(stmt.writes[0].source.dtype)
    lanes = vector_lanes(target, dtype)
    extents = [int_extent(sch, lp) for lp in loops]
    if all(k == "S" for k in kinds):
        inner, ext, outer = loops[-1], extents[-1], list(loops[:-1])
        repeats = _broadcast_loops(sch, block, outer)
        kept = [lp for lp in outer if lp not in repeats]
        kept_rows = _product([int_extent(sch, lp) for lp in kept])
        moved = bool(repeats) and kept_rows is not None and kept_rows >= (
            PARALLEL_CHUNKS_PER_CORE * num_cores(target))
        if ext is not None and ext > 1:
            rows = _product(extents[:-1])
            few_rows = rows is not None and rows < PARALLEL_CHUNKS_PER_CORE * num_cores(target)
            tile = _injective_tile(ext, lanes)
            if tile is None and few_rows:  # the vector loop must divide to join the parallel one
                tile = largest_divisor(ext, lanes)
            if tile is None:
                vectorize_with_tail(sch, inner, lanes)
            elif tile >= 2:
                if tile < ext:
                    lo, inner = sch.split(inner, factors=[None, tile])
                    if few_rows:
                        outer.append(lo)  # too few rows to keep every core busy
                sch.vectorize(inner)
        if moved:  # the repeats serial right above the vector loop, inside the parallel one
            cur = sch.get_loops(block)
            varying = [lp for lp in cur[:-1]
                       if not any(sch.get(lp).same_as(sch.get(r)) for r in repeats)]
            sch.reorder(*varying, *repeats, cur[-1])
            outer = kept
        total = _product(extents)
        parallelize(sch, outer, total if total is not None else MIN_PARALLEL_ITERS)
        return
    lead = []
    work = 1
    for loop, kind, ext in zip(loops, kinds, extents):
        if kind != "S":
            break
        lead.append(loop)
    for ext in extents:
        work = work * ext if (ext is not None and work is not None) else None
    if _window_rows(sch, block, lead, loops, kinds, extents, target):
        lead = lead[:-1]
    if lead:
        parallelize(sch, lead, work if work is not None else MIN_PARALLEL_ITERS)


# A reduction this short per output (a pooling window: 3 x 3, 7 x 7) is unrolled, and its
# last spatial loop (the output column in NCHW) is kept serial below the parallel one.
_WINDOW_ITERS = 64


def _window_rows(sch, block, lead, loops, kinds, extents, target) -> bool:
    """Whether ``block`` reduces a short window per output (at most :data:`_WINDOW_ITERS`
    iterations, all inner) with enough outer rows to keep every core busy; then its window is
    unrolled and its last spatial loop stays serial, out of the fused parallel loop.

    Fused into one parallel loop, every output recomputes its coordinates with 64-bit
    divisions and runs a rolled 3 x 3 loop: a 3 x 3 stride-2 max pool over 64 x 111 x 111
    took 787 us at 1 thread, 88 us with the last loop serial and the window unrolled (znver4;
    0.10-0.46x the time on four pool shapes, ``docs/log/2026-12-06e.md``). Too few rows
    above that loop for the cores, and the outputs stay one fused parallel loop."""
    window = extents[len(lead):]
    if len(lead) < 2 or not window or any(k != "R" for k in kinds[len(lead):]):
        return False
    iters, rows = _product(window), _product(extents[:len(lead) - 1])
    if iters is None or rows is None or iters > _WINDOW_ITERS:
        return False
    if rows < PARALLEL_CHUNKS_PER_CORE * num_cores(target):
        return False
    for loop, ext in zip(loops[len(lead):], window):
        if ext > 1:
            sch.unroll(loop)
    return True


def split_loops(sch: s_tir.Schedule, block: SBlockRV, col: tirx.Var, row: tirx.Var | None):
    """``block``'s loops as (spatial, reduction, the loop binding ``col``, the one binding
    ``row``), outer to inner, the last two None if no loop binds them; None where a binding is
    not trivial (see :func:`loop_kinds`). A contraction tiles ``col`` into vectors and ``row``
    into registers, and keeps the rest in order."""
    stmt = sch.get(block)
    var_of_loop = {val: iv.var for iv, val in
                   zip(stmt.iter_vars, get_sblockrealize(sch, block).iter_values)}
    kinds = loop_kinds(sch, block)
    if kinds is None:
        return None
    spatial, reduce_loops, col_loop, row_loop = [], [], None, None
    for loop, kind in zip(sch.get_loops(block), kinds):
        var = var_of_loop.get(sch.get(loop).loop_var)
        if kind == "R":
            reduce_loops.append(loop)
        elif var is not None and var.same_as(col):
            col_loop = loop
        elif var is not None and row is not None and var.same_as(row):
            row_loop = loop
        else:
            spatial.append(loop)
    return spatial, reduce_loops, col_loop, row_loop


def read_bytes(sch: s_tir.Schedule, block: SBlockRV) -> int:
    """Bytes of the whole buffers ``block`` reads (each once; a symbolic one counts as large):
    what a contraction rule asks :func:`contraction_parallel` with, taken before it pads or
    packs an operand."""
    total = 0
    for buffer in {r.source for r in sch.get(block).reads}:
        elems = 1
        for dim in buffer.shape:
            elems *= int(dim) if isinstance(dim, tirx.IntImm) else MIN_PARALLEL_FMAS
        total += elems * max(1, buffer.dtype.bits // 8)
    return total


def tile_and_parallelize(sch: s_tir.Schedule, order: list, reduce_loops: list, inner: list,
                         read: int):
    """Reorder a contraction's loops to ``order -> reduce_loops -> inner`` and parallelize the
    outer ones where that pays (:func:`contraction_parallel`: the multiply-adds, or ``read``,
    the bytes of the operands as the block first read them, before any padded copy) and there
    are two tiles or more to share; returns the loop the tile's write-back goes under."""
    sch.reorder(*order, *reduce_loops, *inner)
    fmas = 1
    for lp in [*order, *reduce_loops, *inner]:
        fmas *= int_extent(sch, lp) or MIN_PARALLEL_FMAS  # symbolic: assume plenty
    tiles = 1
    for lp in order:
        tiles *= int_extent(sch, lp) or 2
    return parallelize(sch, order, int(tiles > 1 and contraction_parallel(fmas, read)), 1)


class SafeRule(CPUScheduleRule):
    """Runs ``_apply`` on a fresh schedule; any error means "does not apply" (returns None).

    ``cards``: the kernel kinds this rule builds (``card.py``), ``classes`` their schedule
    classes.
    """

    cards: tuple = ()
    classes: tuple[ScheduleClass, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.classes = tuple(card.cls for card in cls.cards)

    def apply(self, func, target: Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        return self.guarded(func, target, self._apply)

    @staticmethod
    def guarded(func: tirx.PrimFunc, target: Target, schedule) -> s_tir.Schedule | None:
        """``schedule(fresh Schedule(func), target)``, or None if any step raises.

        A schedule primitive that rejects a step raises ``ScheduleError`` (a RuntimeError) or
        a ValueError: the rule does not apply, which is routine. Any other exception is more
        likely a bug in the rule itself; the kernel still gets the next rule, but the error is
        logged as a warning (the test suite fails on it) instead of hiding as "did not apply".
        """
        try:
            return schedule(s_tir.Schedule(func), target)
        except (RuntimeError, ValueError):
            return None
        except Exception as err:  # noqa: BLE001 -- reported, and the next rule still runs
            name = getattr(schedule, "__qualname__", repr(schedule))
            _log.warning("schedule rule %s raised %s: %s", name, type(err).__name__, err)
            return None

    def _apply(self, sch: s_tir.Schedule, target: Target) -> s_tir.Schedule | None:
        raise NotImplementedError


def schedule_rest(sch: s_tir.Schedule, target: Target, done: set[str]) -> None:
    """Generic schedule for every root block a rule did not handle itself."""
    for block in root_blocks(sch):
        if sch.get(block).name_hint not in done:
            schedule_root_block(sch, block, target)


def vectorize_innermost(sch: s_tir.Schedule, *blocks: SBlockRV) -> None:
    """The innermost loop of each of ``blocks`` vectorized where it is longer than one (an
    accumulator's init and write-back)."""
    for blk in blocks:
        loops = sch.get_loops(blk)
        if (int_extent(sch, loops[-1]) or 0) > 1:
            sch.vectorize(loops[-1])


def vectorize_row(sch, loop, lanes: int) -> None:
    """Vectorize a row loop: whole vectors (a ragged row's last one peeled off), or the row
    as one partial vector when it is shorter than that."""
    ext = int_extent(sch, loop) or 0
    if ext > lanes and ext % lanes:
        vectorize_with_tail(sch, loop, lanes)
    elif ext > lanes:
        sch.vectorize(sch.split(loop, factors=[None, lanes])[1])
    elif ext > 1:
        sch.vectorize(loop)


def under(sch, block, loop) -> bool:
    """Whether ``loop`` is one of the loops ``block`` sits in."""
    return any(sch.get(lp).same_as(sch.get(loop)) for lp in sch.get_loops(block))
