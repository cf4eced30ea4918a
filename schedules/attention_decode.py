"""Attention for one query row per head (a decode step): the KV cache read where it lies.

A decode step attends one new token to ``keys`` cached ones. Imported from PyTorch, its
keys and values reach the two contractions through copies: the cache concatenated with the
new token's (rotated) key or value, repeated across the query heads that share it (GQA) and,
for the keys, transposed. Materialized, those copies write and re-read the whole cache every
step (on qwen2's 1024-token step, 31% of the step: a transposing copy gathers every element);
FuseOps cannot fuse them into a contraction.

Here they are computed where the contractions read them, per head:

``parallel(batch.., head) -> q -> scores[key] -> max -> exp -> sum -> out[d] += p[key] v[key, d]``

- the scores reduce over the head dim ``d``, which is the cache's contiguous axis: vectors
  run along ``d`` into one vector of partial sums per key (rfactor), so the key producer (the
  concat's select on the key index, the repeat's index division) is read as whole rows of
  the cache, never gathered across keys;
- the query's producer (its rotary embedding) runs once per head into a local row;
- ``P V`` accumulates ``d`` in vector registers over the keys, reading each value row once;
  ``P = exp * (1 / sum)`` is formed as it is read.

Scores, exp and the query row stay in a per-head local buffer (``keys`` floats). The key
loops carry a partition hint, so the concat's bound splits them into a cache part that loads
directly and the new token's part.

Recognized structurally (einsum roles, ``attention_roles``), never by name; the caller, the
attention rule, hands over a group whose two contractions have no row axis. Anything else, or
a step a primitive rejects, returns None.
"""

from __future__ import annotations

import math

from tvm import s_tir

from ._common import (
    MIN_PARALLEL_FMAS,
    int_extent,
    is_spatial,
    root_blocks,
    vector_lanes,
    vector_tile,
)
from ._loops import (
    PARTITION_HINT,
    schedule_rest,
    split_loops,
    under,
    vectorize_innermost,
    vectorize_row,
)
from .attention_roles import (
    einsum,
    inline_probabilities,
    loops_below,
    p_chain,
    producer_of,
    reduce_extent,
)
from .ragged import whole_vector_rows
from .reduction import _first_reduction_loop, _vector_rfactor

#: Accumulator vectors of ``out[d]`` kept in registers over the key loop (d = 128 in eight
#: AVX-512 vectors); a longer head dim is tiled.
_MAX_ACC_VECTORS = 8


def _inline_operand(sch, block_name: str, load) -> None:
    """Inline the producer of ``load`` (the K or V copy) into ``block_name``: computed where
    the contraction reads it, so the cache is read in place."""
    producer = producer_of(sch, load.source)
    if producer is None or not is_spatial(sch.get(producer)):
        return
    consumers = sch.get_consumers(producer)
    if len(consumers) != 1 or sch.get(consumers[0]).name_hint != block_name:
        return
    try:
        sch.compute_inline(producer)
    except s_tir.ScheduleError:
        pass


def schedule_one_row(sch: s_tir.Schedule, qk_name: str | None, pv_name: str, target):
    """The module docstring's schedule on ``sch`` (spatial blocks already inlined between
    the contractions; ``qk_name`` None where the scores are read from outside), or None where
    the group is not this shape."""
    qk_roles = einsum(sch.get(sch.get_sblock(qk_name))) if qk_name else None
    pv_roles = einsum(sch.get(sch.get_sblock(pv_name)))
    if pv_roles is None or len(pv_roles.reduce) != 1:
        return None
    if qk_name and (qk_roles is None or qk_roles.row is not None or len(qk_roles.reduce) != 1):
        return None
    chain = p_chain(sch, pv_roles.other.source, qk_name)
    if not chain or all(is_spatial(sch.get(sch.get_sblock(n))) for n in chain):
        return None
    scores = [qk_name] if qk_name else []
    params = list(sch.mod["main"].params)
    if any(w.source.same_as(o) for n in [*scores, *chain]
           for w in sch.get(sch.get_sblock(n)).writes for o in params):
        return None  # an intermediate is also an output

    if qk_roles is not None:
        _inline_operand(sch, qk_name, qk_roles.streamed)
    _inline_operand(sch, pv_name, pv_roles.streamed)
    inline_probabilities(sch, pv_roles.other.source, chain)
    q_block = producer_of(sch, qk_roles.other.source) if qk_roles is not None else None
    q_name = None
    if q_block is not None and is_spatial(sch.get(q_block)) and len(
            sch.get_consumers(q_block)) == 1:
        q_name = sch.get(q_block).name_hint

    pv = sch.get_sblock(pv_name)
    stmt = sch.get(pv)
    extents = {iv.var: iv.dom.extent for iv in stmt.iter_vars}
    cols, keys = _int_extent_of(extents, pv_roles.col), _int_extent_of(extents,
                                                                      pv_roles.reduce[0])
    if cols is None or keys is None:
        return None
    lanes = vector_lanes(target, str(stmt.writes[0].source.dtype))
    # a cache of past + 1 keys is ragged: the row max and sum over whole vectors and a tail
    sch, _ = whole_vector_rows(sch, chain, keys, lanes)
    pv = sch.get_sblock(pv_name)
    stmt = sch.get(pv)
    loops = split_loops(sch, pv, pv_roles.col, None)
    if loops is None:
        return None
    batch, reduce_loops, col_loop, _ = loops
    if col_loop is None or len(reduce_loops) != 1:
        return None
    tile = vector_tile(cols, lanes, _MAX_ACC_VECTORS)
    co, ci = sch.split(col_loop, factors=[None, tile])
    sch.reorder(*batch, co, reduce_loops[0], ci)
    # one loop over the heads (a unit one for a single head) that the chain is computed under
    par = sch.fuse(*batch) if len(batch) > 1 else batch[0] if batch else sch.add_unit_loop(co)
    heads = int_extent(sch, par) or 1
    writeback = sch.cache_write(pv, 0, "local")
    sch.reverse_compute_at(writeback, co, preserve_unit_loops=True)

    # Vector partials while each block still has a nest of its own (rfactor refuses a block
    # that is not the first in its outermost loop). A ragged row whose head could not be split
    # off keeps scalar chains: compute_at drops the guard of a ragged partial's last vector
    # (it would read past the row).
    partials = []
    for name in [*scores, *chain]:
        blk = sch.get_sblock(name)
        if is_spatial(sch.get(blk)) or reduce_extent(sch, name) % lanes:
            continue
        rf = _vector_rfactor(sch, blk, target)
        if rf is not None:
            partials.append(sch.get(rf).name_hint)
    inner = [*([q_name] if q_name else []), *scores, *chain, *partials]
    order = [sch.get(b).name_hint for b in root_blocks(sch)]
    names = sorted(inner, key=order.index)
    for name in reversed(names):
        blk = sch.get_sblock(name)
        for i in range(len(sch.get(blk).writes)):
            sch.set_scope(blk, i, "local")
        sch.compute_at(blk, par, preserve_unit_loops=True)
    for name in names:  # each block computes this head's row only
        below = loops_below(sch, sch.get_sblock(name), par)
        if below is None:
            return None
        work = math.prod(int_extent(sch, lp) or 1 << 30 for lp in below.values())
        if work > keys * max(cols, lanes) * max(1, reduce_extent(sch, qk_name) if qk_name
                                                else 1):
            return None
    if heads >= 2 and heads * keys * cols >= MIN_PARALLEL_FMAS:
        sch.parallel(par)
    for name in names:
        _vectorize_inner(sch, sch.get_sblock(name), par, lanes, name in partials)
    sch.annotate(reduce_loops[0], PARTITION_HINT, 1)
    if int_extent(sch, ci) and int_extent(sch, ci) > lanes:
        _, lane = sch.split(ci, factors=[None, lanes])
        sch.vectorize(lane)
    elif (int_extent(sch, ci) or 0) > 1:
        sch.vectorize(ci)
    init = sch.decompose_reduction(pv, reduce_loops[0])
    vectorize_innermost(sch, init, writeback)
    # everything under the heads loop is this rule's; only an epilogue outside it is not
    done = {sch.get(b).name_hint for b in root_blocks(sch) if under(sch, b, par)}
    schedule_rest(sch, target, done)
    return sch


def _int_extent_of(extents: dict, var) -> int | None:
    """The constant extent of block var ``var`` (None where symbolic)."""
    ext = extents.get(var)
    return int(ext) if ext is not None and hasattr(ext, "value") else None


def _vectorize_inner(sch, block, top, lanes: int, partial: bool) -> None:
    """A block of the head's chain: a vector partial's lanes (the innermost loop) vectorized,
    its key loop partitioned at the concat's bound; a spatial row vectorized along the keys;
    a reduction over the vector partials (or a short row) left to LLVM."""
    below = loops_below(sch, block, top)
    if not below:
        return
    stmt = sch.get(block)
    if partial:
        lane_var = stmt.writes[0].region[-1].min
        lane = below.get(lane_var)
        reduce = [below[iv.var] for iv in stmt.iter_vars
                  if iv.iter_type == iv.CommReduce and iv.var in below]
        spatial = [lp for var, lp in below.items() if lp is not lane
                   and all(lp is not r for r in reduce) and int_extent(sch, lp) != 1]
        if lane is None or len(reduce) != 1:
            return
        sch.reorder(*spatial, reduce[0], lane)
        for lp in spatial:
            sch.annotate(lp, PARTITION_HINT, 1)
        sch.vectorize(lane)
        sch.decompose_reduction(block, reduce[0])
        return
    if is_spatial(stmt):
        vectorize_row(sch, sch.get_loops(block)[-1], lanes)
        return
    first = _first_reduction_loop(sch, block)
    if first is not None:  # a reduction over one key (a cache of one): its init stays inline
        sch.decompose_reduction(block, first)
