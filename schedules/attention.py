"""Attention rule: scores -> scale/mask -> softmax -> P V in one kernel, per block of query rows.

A fused group ``P = softmax(mask(scale(Q K^T))); O = P V`` (or ``softmax(S) V`` with the scores
an input) is scheduled as

``parallel(batch.., query-row block) -> scores tile -> row max -> exp -> row sum -> P V tile``

Per (batch, head, block of ``rows`` query rows) the scores of those rows against every key are
computed into a local buffer (register tile ``rows x lanes`` over the keys, scale and mask
evaluated where the scores are read), then the row max and row sum (vector partials), the exp
(vectorized by ``fast_math``), ``P = exp * (1 / sum)`` (vectorized) and the ``rows x cols``
output tile of P V in registers, which broadcasts each P from the row block's buffer. Formed
as P V read it, P cost a scalar multiply and a register broadcast per row and key, two
FP-pipe slots per four FMAs: the kernel ran 1.05-1.11x slower on most prefill shapes at one
thread, 1.39x at head dim 80 (docs/log/2026-12-07d.md). Scores, exp, P and the row
statistics never reach memory; ``rows`` is the P V register tile's (up to
:data:`_MAX_SUBTILES` of them), cut down so the row block's buffers fit
:data:`ROW_BLOCK_BYTES`, a share of L2.

The row block holds the whole key row, not a running (online) max over key blocks: one exact
max saves the rescaling an online softmax pays per key block, and the buffers of a block of
register tiles fit L2 up to long rows (16 rows of 4096 keys: 768 KiB). K^T is streamed once
per row block (its panel reused from L1 across the block's register tiles), V once per
register tile, so the rows per block, not which cache holds the buffers, decide a long row's
speed: at 4096 keys 1-row blocks ran 2.0-2.1x slower than the split kernels, 16-row blocks
1.2-1.3x faster (docs/log/2026-12-01b.md, "Fused attention for long key rows"). Key rows longer
than :data:`MAX_KEYS` (where :data:`_MIN_ROWS` rows no longer fit) are declined, and the
features (``cost/extract.py``) do not call such a group attention either. A causal mask is
applied as the corpus spells it (a ``where`` or an added mask tensor); masked blocks are
computed, not skipped.

One query row per head (a decode step against a KV cache) is scheduled by
``attention_decode``: per head, with the cache's copies computed where they are read.

Recognized structurally, never by name: the last einsum-form contraction (P V) reduces over
the last index of its row operand P, which a chain of blocks containing a row reduction
produces, optionally from a first contraction (the scores). Every block of that chain must be
computable per row block (checked on the loop extents ``compute_at`` gives it); anything else,
or a step a primitive rejects, returns None and the next rule applies.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from . import gemm
from ._common import (
    MIN_PARALLEL_FMAS,
    inline_epilogue,
    inline_spatial,
    int_extent,
    is_spatial,
    largest_divisor,
    num_cores,
    root_blocks,
    simplify_indices,
    vector_lanes,
    vector_registers,
    vector_tile,
)
from ._loops import (
    PARTITION_HINT,
    SafeRule,
    schedule_rest,
    split_loops,
    under,
    vectorize_innermost,
    vectorize_row,
)
from .attention_decode import schedule_one_row
from .attention_roles import (
    einsum,
    last_index,
    loops_below,
    p_chain,
    reads_along,
    reduce_extent,
    reduces_last_axis,
    same_vars,
)
from .card import Card
from .classes import ScheduleClass
from .contraction import contraction_operands
from .ragged import whole_vector_rows
from .reduction import REDUCTION_CARD, _vector_rfactor, reciprocal_divisions

#: The row block's buffers: 1 MiB, the L2 of Skylake-SP and Zen 4 cores (newer Intel cores
#: have 2 MiB; on Haswell's 256 KiB they come from L3, still fewer bytes than re-reading K^T
#: and V for a smaller block). Measured at 4096 keys: 256 KiB (4-row blocks) ran at the split
#: kernels' speed, 1 MiB (16 rows) 1.2-1.3x faster, 2 MiB (32 rows) another 4-9% on a 2 MiB
#: L2; at 2048 keys 128 KiB-1 MiB ran alike; at 197-1280 keys 1 MiB ran 1.05-1.14x faster
#: than a 32 KiB (L1) share.
ROW_BLOCK_BYTES = 1024 * 1024
#: Row-block buffers of ``rows x keys`` elements (scores, exp and P).
_ROW_BUFFERS = 3
#: Fewest query rows a block must hold: K^T is read once per block (at 4096 keys 4-row
#: blocks ran at the split kernels' speed, 1-row blocks 2.0-2.1x slower; at 16384 causal keys
#: 4-row blocks ran 1.15x faster than the split kernels).
_MIN_ROWS = 4
#: Longest key row scheduled: :data:`_MIN_ROWS` rows of every buffer still fit.
MAX_KEYS = ROW_BLOCK_BYTES // (_ROW_BUFFERS * 4 * _MIN_ROWS) // 128 * 128  # 21760 float32 keys
#: Register tiles of rows per row block: K^T and V are read from L2 once per row block and
#: from L1 for its other tiles (measured: 4-row blocks ran 10% slower than the split kernels
#: on BERT's 128 x 64 heads, loading 64 KiB of K^T and V per 65K multiply-adds).
_MAX_SUBTILES = 4


def _claims_attention(f, kind: str) -> bool:
    """CPU: a softmax over the keys feeding P V, the scores computed in the group or read, one
    output (``cost/extract._is_attention`` reads it off the graph). dlight has no such rule."""
    return kind == "cpu" and f.attention


# The share of peak its two contractions reach inside the fused kernel; the softmax between
# them at the row-reduction rate, its exp as math. Measured against the split kernels ([K^T]
# [Q K^T, scale, mask] [softmax] [P V], our schedules) on the 2-core emeraldrapids host under
# another worker's load (rough), 1 and 2 threads: split / fused 1.02-1.09 on BERT's 12 x 128 x
# 64 heads (masked, causal) and ViT's 12 x 197 x 64, 1.19-1.29 on the small variants' 2 x 16 x
# 16; 0.55 prices them at 1.03-1.04 and 1.29-1.44 (docs/log/2026-12-01b.md, "attention kernel").
# Long key rows (1280-16384 keys, the row block in a share of L2) keep that share: the fused
# kernel's measured / predicted time there, 0.69-1.37 by form at 1280-4096 keys (1.95 at 16384
# causal), spans the 0.74-0.98 of 128-197 keys, while the split kernels' is 1.07-1.74 (2.35):
# the error is on the split side (docs/log/2026-12-01b.md, "Fused attention for long key rows").
# With the register tiles on the stack the per-head matmuls reach 0.69-0.90 of peak alone
# (znver4), and the share follows them, 0.85: priced with the split kernels at their share,
# 0.55 splits every prefill attention, which measured split / fused 0.98-1.00 at 1 thread and
# 1.00-1.03 at 2 (bert, vit_b_16, gpt2; docs/log/2026-12-06g.md). Since the host's exp is
# measured (``calibrate.math_seconds``; the constant before it was 7x high and over-priced the
# split softmax 2-3x) the card prices the fused kernel (P written per row block) at 0.95-1.02
# of what it runs alone where the key rows are whole vectors, 0.66-0.79 where they are ragged
# (eight prefill shapes, 1 thread). A card fitted to the kernel alone as it was before, with P
# formed per read (the GEMM rule's share for each contraction's geometry, a ragged key row's
# max and sum as scalar chains: 0.93-1.06), split the ragged heads, regrouped BERT's and
# GPT-2's as [Q K^T, scale, mask] [softmax, P V], and ran 0.990-1.018x this card's plans at
# 1 thread and 0.980-0.998x at 2 end to end (segformer, vit_b_16, bert, swin_t, gpt2; znver4,
# docs/log/2026-12-07d.md): in a model splitting gained less than it does alone, and lost at
# 2 threads, so the card is judged by the plans it makes, and stays.
# One query row per head (a decode step; ``attention_decode.py``) is priced at 0.55, which it
# does not reach either: per layer at 1 thread it ran 6.2-7.6x slower than this compute term
# on qwen2 (128 and 1024 past) and falcon, 8-9x with memory on opt and gpt2 (znver4,
# ``lab/kernel_profile.py``; docs/log/2026-12-03.md, "Decode steps"). Its alternative
# is priced further off: FuseOps' transposing copy of the keys (concat, rotary, GQA repeat,
# transpose: a gather per element) at 26x under its measured time, the value copy at 5x.
# Priced at its measured share (0.075), the fused kernel loses to that copy on paper and the
# planner keeps FuseOps' kernels, 1.45-1.88x slower as measured; so both stay as they are
# until transposing copies are priced per gather. The prefill kernels' 0.85 is further still
# from what the decode kernel reaches, with nothing measured for it: decode plans priced with
# it ran 0.96-1.02x those of 0.55 at 1 thread, within the 1.05-1.10x spread of three builds of
# one plan (docs/log/2026-12-06h.md). Two parallel nests: the row-block loop and the K^T packing pass
# the imported programs have (a transpose in the group or a copy).
_ONE_ROW_SHARE = 0.55


def _one_row_share(work, lanes: int, registers: int) -> float | None:
    """The share of a contraction with one query row per head (a decode step's scores and
    ``P V``, the one-row kernel of ``attention_decode.py``), None for the row-block kernel's
    (the card's 0.85): the one-row kernel reaches less than either (above), so it is not
    priced further from what it runs. A block read without a geometry (symbolic extents)
    keeps the card's share."""
    g = work.geometry
    return _ONE_ROW_SHARE if g is not None and g.gemm is not None and g.gemm.m == 1 else None


ATTENTION_CARD = Card(
    ScheduleClass.ATTENTION, "Attention", _claims_attention,
    efficiency={"cpu": REDUCTION_CARD.efficiency["cpu"]}, contraction_efficiency={"cpu": 0.85},
    register_tile=True, recomputes=False, nests=lambda f: 2, share=_one_row_share,
    # the imported per-head batch matmuls sit behind reshape views: no smaller merge reaches it
    through_views=frozenset({"cpu"}))


class Attention(SafeRule):
    """Fused attention (module docstring): one parallel loop over batch x row blocks."""

    cards = (ATTENTION_CARD,)

    def _apply(self, sch, target):
        sch = s_tir.Schedule(reciprocal_divisions(simplify_indices(sch.mod["main"])))
        if normalize_prim_func(sch) is None:
            return None
        einsums = [sch.get(b).name_hint for b in root_blocks(sch)
                   if einsum(sch.get(b)) is not None]
        if len(einsums) not in (1, 2):
            return None
        pv_name, qk_name = einsums[-1], (einsums[0] if len(einsums) == 2 else None)
        inline_spatial(sch, protect=set(einsums))
        pv = sch.get_sblock(pv_name)
        stmt = sch.get(pv)
        store, _, _ = contraction_operands(stmt)
        roles = einsum(stmt)
        if roles.row is None:  # one query row per head: a decode step
            return schedule_one_row(sch, qk_name, pv_name, target)
        if len(roles.reduce) != 1:
            return None
        key = roles.reduce[0]
        p_load = roles.other
        if not same_vars(p_load.indices, [*store.indices[:-1], key]):
            return None  # P[batch.., row, key] by plain vars, as the output's rows
        chain = p_chain(sch, p_load.source, qk_name)
        if not chain or all(is_spatial(sch.get(sch.get_sblock(n))) for n in chain):
            return None  # no row reduction between: not a softmax feeding P V
        root = sch.mod["main"].body.block
        local = list(root.alloc_buffers)
        if not all(reduces_last_axis(sch.get(sch.get_sblock(n)), local) for n in chain):
            return None  # a reduction across rows (softmax over the queries): no row blocks
        if not all(any(w.source.same_as(b) for b in local)
                   for n in chain for w in sch.get(sch.get_sblock(n)).writes):
            return None  # an intermediate is also an output: it would have to be stored
        if qk_name is not None:
            qk = sch.get(sch.get_sblock(qk_name))
            if not any(sch.get(c).name_hint in chain
                       for c in sch.get_consumers(sch.get_sblock(qk_name))):
                return None
            qk_roles = einsum(qk)
            if qk_roles.row is None or len(qk_roles.reduce) != 1:
                return None
            last_index(sch, qk_name, qk_roles.streamed, qk_roles.col)
        last_index(sch, pv_name, roles.streamed, roles.col)

        extents = {iv.var: iv.dom.extent for iv in sch.get(sch.get_sblock(pv_name)).iter_vars}
        if not all(isinstance(extents[v], tirx.IntImm) for v in (roles.col, roles.row, key)):
            return None
        cols, n_rows, keys = (int(extents[v]) for v in (roles.col, roles.row, key))
        if keys > MAX_KEYS:
            return None
        dtype = str(stmt.writes[0].source.dtype)
        lanes = vector_lanes(target, dtype)
        sch, whole = whole_vector_rows(sch, chain, keys, lanes)
        budget = gemm.accumulator_budget(vector_registers(target))
        tile = gemm.choose_tile(n_rows, cols, lanes, vector_registers(target),
                                cols_must_divide=True)
        if tile is None:  # a head dim that is no whole number of vectors: one partial one
            tile = gemm.Tile(min(n_rows, budget), 1, vector_tile(cols, lanes))
        itemsize = max(1, tvm.DataType(dtype).bits // 8)
        fits = max(1, ROW_BLOCK_BYTES // (_ROW_BUFFERS * itemsize * keys))
        sub = max(1, min(tile.rows, fits))
        even = largest_divisor(n_rows, sub)
        if 2 * even >= sub:
            sub = even  # no ragged last row block where a near tile divides the rows
        tiles = max(1, min(_MAX_SUBTILES, fits // sub, -(-n_rows // sub)))
        while tiles > 1 and n_rows % (sub * tiles) and n_rows % sub == 0:
            tiles -= 1  # a whole number of row blocks where the register tile divides
        rows = sub * tiles

        # P stays a block of the chain, written per row block, not inlined into P V as
        # ``attention_decode`` does: formed as P V reads it, each row's multiply and broadcast
        # took two FP-pipe slots per four FMAs (module docstring).
        pv = sch.get_sblock(pv_name)
        loops = split_loops(sch, pv, roles.col, roles.row)
        if loops is None:
            return None
        batch, reduce_loops, col_loop, row_loop = loops
        if col_loop is None or row_loop is None or len(reduce_loops) != 1:
            return None
        io, it, ii = sch.split(row_loop, factors=[None, tiles, sub])
        co, ci = sch.split(col_loop, factors=[None, tile.cols])
        sch.reorder(*batch, io, co, it, reduce_loops[0], ii, ci)
        heads = math.prod(int_extent(sch, lp) or 1 for lp in batch)
        if n_rows % rows and batch and heads >= 2 * num_cores(target):
            # A ragged last row block, and enough heads to keep the cores busy: parallel over
            # the heads, the row blocks serial, the last one peeled off (partition hint) so
            # the others run without the row guard (ViT's 197 rows ran 2.2x slower guarded).
            par, top = sch.fuse(*batch) if len(batch) > 1 else batch[0], io
            sch.annotate(io, PARTITION_HINT, 1)
        else:
            par = top = sch.fuse(*batch, io) if batch else io
        writeback = sch.cache_write(pv, 0, "local")
        inline_epilogue(sch, writeback)  # else a pass of its own (generic schedule)
        sch.reverse_compute_at(writeback, it, preserve_unit_loops=True)

        if whole:
            # Vector partials (rfactor) while each block still has a nest of its own: rfactor
            # refuses a block that is not the first in its outermost loop. A ragged row's
            # tail (``ragged.py``) is too short for partials and stays a scalar chain.
            for name in [n for n in chain if not is_spatial(sch.get(sch.get_sblock(n)))]:
                rf = _vector_rfactor(sch, sch.get_sblock(name), target)
                if rf is not None:
                    chain.insert(chain.index(name), sch.get(rf).name_hint)
        inner = [*chain, *([qk_name] if qk_name else [])]
        names = sorted(inner, key=[sch.get(b).name_hint for b in root_blocks(sch)].index)
        for name in reversed(names):
            blk = sch.get_sblock(name)
            for i in range(len(sch.get(blk).writes)):
                sch.set_scope(blk, i, "local")
            sch.compute_at(blk, top, preserve_unit_loops=True)
        d_qk = reduce_extent(sch, qk_name) if qk_name is not None else 1
        for name in names:  # each block of the chain computes one row block only
            below = loops_below(sch, sch.get_sblock(name), top)
            if below is None:
                return None
            work = math.prod(int_extent(sch, lp) or 1 << 30 for lp in below.values())
            if work > rows * keys * (d_qk if name == qk_name else 1):
                return None
        fmas = heads * n_rows * keys * cols
        if fmas >= MIN_PARALLEL_FMAS:
            sch.parallel(par)

        if qk_name is not None:
            vectors = key_tile_vectors(keys, lanes, sub, budget)
            self._scores(sch, qk_name, top, sub, lanes * vectors, lanes, keys)
        for name in chain:
            blk = sch.get_sblock(name)
            if is_spatial(sch.get(blk)):
                below = loops_below(sch, blk, top)
                if below:
                    vectorize_row(sch, list(below.values())[-1], lanes)
            else:
                _interleaved_rows(sch, blk, top)
        if int_extent(sch, ii) > 1:
            sch.unroll(ii)
        sch.vectorize(ci)
        init = sch.decompose_reduction(pv, reduce_loops[0])
        vectorize_innermost(sch, init, writeback)
        done = {*names, pv_name, sch.get(init).name_hint, sch.get(writeback).name_hint}
        done |= {sch.get(b).name_hint for b in root_blocks(sch)
                 if sch.get(b).name_hint not in done and under(sch, b, top)}
        for b in root_blocks(sch):
            if sch.get(b).name_hint not in done:
                reads_along(sch, b)
        schedule_rest(sch, target, done)
        return sch

    @staticmethod
    def _scores(sch, name: str, top, sub: int, cols: int, lanes: int, keys: int) -> None:
        """The scores of one row block in tiles of ``sub x cols`` accumulators (rows and the
        column's vectors unrolled), each accumulated over the head dim, every tile of rows
        for one tile of keys (whose K^T panel so stays in L1); a ragged last tile of keys runs
        apart (partition hint), its guarded lanes scalar."""
        blk = sch.get_sblock(name)
        roles = einsum(sch.get(blk))
        below = loops_below(sch, blk, top)
        lj, li, lk = below[roles.col], below[roles.row], below[roles.reduce[0]]
        lo, li = sch.split(li, factors=[None, sub])
        jo, jv, jl = sch.split(lj, factors=[None, cols // lanes, lanes])
        if keys % cols:
            sch.annotate(jo, PARTITION_HINT, 1)
        sch.reorder(jo, lo, lk, li, jv, jl)
        for loop in (li, jv):
            if (int_extent(sch, loop) or 0) > 1:
                sch.unroll(loop)
        sch.vectorize(jl)
        init = sch.decompose_reduction(blk, lk)
        init_loops = sch.get_loops(init)
        if (int_extent(sch, init_loops[-1]) or 0) > 1:
            sch.vectorize(init_loops[-1])


def key_tile_vectors(keys: int, lanes: int, rows: int, budget: int) -> int:
    """Vectors of keys per register tile of the scores (1, 2 or 4; ``rows`` x that many
    accumulators within ``budget``): the widest, unless the key row ends in a partial vector.
    Then the ragged last tile runs scalar as a whole, so the widest tile that leaves the
    fewest keys past the last whole tile: 49 keys in tiles of 32 left 17 (the kernel ran
    1.24x slower than in tiles of 16, which leave one; segformer's 3136 x 49 heads). A row of
    whole vectors keeps the widest tile: 48 keys ran alike in tiles of 32 and 16 (znver4,
    docs/log/2026-12-07c.md)."""
    widths = [1]
    while widths[-1] < 4 and 2 * widths[-1] * rows <= budget and 2 * widths[-1] * lanes <= keys:
        widths.append(2 * widths[-1])
    if keys % lanes == 0:
        return widths[-1]
    return min(widths, key=lambda v: (keys % (v * lanes), -v))


def _interleaved_rows(sch, block, top) -> None:
    """A row reduction of the row block with the rows innermost and unrolled: one chain per
    row, interleaved, instead of one row's chain after the other (max and add each wait on
    their last result: 4 cycles). The order of each row's sum is kept, so the result is
    exactly the unfused kernel's."""
    below = loops_below(sch, block, top)
    stmt = sch.get(block)
    spatial = [below[iv.var] for iv in stmt.iter_vars
               if iv.iter_type == tirx.IterVar.DataPar and iv.var in below
               and int_extent(sch, below[iv.var]) != 1]
    reduce = [below[iv.var] for iv in stmt.iter_vars
              if iv.iter_type == tirx.IterVar.CommReduce and iv.var in below]
    if len(reduce) != 1 or not 1 <= len(spatial) <= 2:
        return
    if len(spatial) == 2:  # a vector of partials per row (rfactor): its lanes index last
        lane = stmt.writes[0].region[-1].min
        lanes = [lp for lp in spatial if isinstance(lane, tirx.Var) and below.get(lane) is lp]
        if len(lanes) != 1:
            return
        spatial = [lp for lp in spatial if lp is not lanes[0]] + lanes
    sch.reorder(reduce[0], *spatial)
    if (int_extent(sch, spatial[0]) or 0) > 1:
        sch.unroll(spatial[0])
    if len(spatial) == 2:
        sch.vectorize(spatial[1])
    sch.decompose_reduction(block, reduce[0])
