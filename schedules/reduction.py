"""Row-reduction rule: softmax, layer/RMS norm, mean and sum chains, parallel over rows."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize

from ._common import (
    MIN_PARALLEL_ITERS,
    inline_spatial,
    int_extent,
    is_spatial,
    root_blocks,
    vector_lanes,
    vector_tile,
)
from ._loops import SafeRule, loop_kinds, parallelize
from .classes import ScheduleClass


def _lead_vars(sch, block, n):
    """Block vars bound to the first ``n`` loops of ``block`` (None if not plain vars)."""
    stmt = sch.get(block)
    values = get_sblockrealize(sch, block).iter_values
    by_loop_var = {val: iv.var for iv, val in zip(stmt.iter_vars, values)}
    out = [by_loop_var.get(sch.get(lp).loop_var) for lp in sch.get_loops(block)[:n]]
    return None if any(v is None for v in out) else out


def _row_dims(region) -> list:
    """Index expressions of a region without the constant (unit) dims normalization pinned."""
    return [r.min for r in region if not isinstance(r.min, tirx.IntImm)]


def _rows_consistent(sch, blocks, n) -> bool:
    """Row r of every intermediate is produced and consumed by iteration r of the row loops.

    Without this, ``compute_at`` under a row loop stays legal but recomputes whole producers
    per row (quadratic time): the rule must not apply then.
    """
    for blk in blocks:
        stmt = sch.get(blk)
        lead = _lead_vars(sch, blk, n)
        if lead is None or len(stmt.writes) != 1:
            return False
        dims = _row_dims(stmt.writes[0].region)
        if len(dims) < n or any(not d.same_as(v) for d, v in zip(dims[:n], lead)):
            return False
        for r in stmt.reads:
            if any(r.source.same_as(sch.get(b).writes[0].source) for b in blocks if b != blk):
                dims = _row_dims(r.region)
                if len(dims) < n or any(not d.same_as(v) for d, v in zip(dims[:n], lead)):
                    return False
    return True


def _vector_rfactor(sch, block, target):
    """Split an innermost reduction into ``lanes`` interleaved partial reductions (rfactor).

    The partial block reduces ``x[k*lanes + l]`` into slot ``l`` with ``l`` innermost and
    spatial, so it vectorizes; the original block then reduces the ``lanes`` slots. The sum
    order changes (float reassociation only); max/min stay exact. Returns the partial block,
    or None where the loop is not a whole number of vectors or rfactor rejects the reducer.
    """
    stmt = sch.get(block)
    if is_spatial(stmt) or len(stmt.writes) != 1:
        return None
    kinds = loop_kinds(sch, block)
    loops = sch.get_loops(block)
    lanes = vector_lanes(target, str(stmt.writes[0].source.dtype))
    ext = int_extent(sch, loops[-1]) if loops else None
    if kinds is None or kinds[-1] != "R" or ext is None or ext % lanes or ext < 2 * lanes:
        return None
    _, inner = sch.split(loops[-1], factors=[None, lanes])
    try:
        rf = sch.rfactor(inner, factor_axis=len(stmt.writes[0].source.shape))
    except s_tir.ScheduleError:
        return None
    # compute_at regenerates loops in block-iter order; make the slot iter (the last write
    # index) the last iter so its loop comes out innermost, where it can be vectorized.
    rf_stmt = sch.get(rf)
    slot = rf_stmt.writes[0].region[-1].min
    order = [i for i, iv in enumerate(rf_stmt.iter_vars) if not iv.var.same_as(slot)]
    order += [i for i, iv in enumerate(rf_stmt.iter_vars) if iv.var.same_as(slot)]
    if order != list(range(len(order))):
        sch.reorder_block_iter_var(rf, order)
    return rf


class RowReduction(SafeRule):
    """Softmax, layer norm, RMS norm, mean/sum + epilogue: parallel rows, vectorized inner.

    After inlining the spatial steps (exp, subtract-mean) into their consumers, all blocks are
    computed under the fused leading spatial (row) loop of the last block, so a row stays in
    cache between the reduction passes and the final write. Innermost reductions whose length
    is a multiple of the vector width are rfactored into one vector of partial results
    (:func:`_vector_rfactor`; sums reassociate, within float tolerance).
    """

    classes = (ScheduleClass.REDUCTION,)

    def _apply(self, sch, target):
        if normalize_prim_func(sch) is None:
            return None
        inline_spatial(sch)
        blocks = root_blocks(sch)
        if len(blocks) < 2 or not is_spatial(sch.get(blocks[-1])):
            return None
        if all(is_spatial(sch.get(b)) for b in blocks):
            return None
        lead = []
        for blk in blocks:
            kinds = loop_kinds(sch, blk)
            if kinds is None:
                return None
            lead.append(len(kinds) - len("".join(kinds).lstrip("S")))
        n = min(lead)
        if n == 0 or not _rows_consistent(sch, blocks, n):
            return None
        partials = [rf for blk in blocks if (rf := _vector_rfactor(sch, blk, target))]
        blocks = root_blocks(sch)
        last = blocks[-1]
        loops = sch.get_loops(last)
        rows = 1
        for lp in loops[:n]:
            rows *= int_extent(sch, lp) or MIN_PARALLEL_ITERS
        per_row = 1
        for lp in loops[n:]:
            per_row *= int_extent(sch, lp) or 1
        row_loop = parallelize(sch, loops[:n], rows * per_row if rows > 1 else 1)
        for blk in reversed(blocks[:-1]):
            sch.compute_at(blk, row_loop, preserve_unit_loops=True)
        for blk in blocks:
            stmt = sch.get(blk)
            blk_loops = sch.get_loops(blk)
            if not is_spatial(stmt) or len(blk_loops) < 2:
                continue
            ext = int_extent(sch, blk_loops[-1])
            if ext is None or ext < 2:
                continue
            lanes = vector_lanes(target, str(stmt.writes[0].source.dtype))
            tile = vector_tile(ext, lanes)
            inner = blk_loops[-1] if tile >= ext else sch.split(blk_loops[-1], [None, tile])[1]
            if tile >= 2:
                sch.vectorize(inner)
        for rf in partials:  # lanes partial sums side by side: a vector accumulator
            rf_loops = sch.get_loops(rf)
            sch.vectorize(rf_loops[-1])
            sch.decompose_reduction(rf, rf_loops[-2])
        return sch
