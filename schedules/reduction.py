"""Row-reduction rule: softmax, layer/RMS norm, mean and sum chains, parallel over rows."""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize
from tvm.sym.analyzer import Analyzer

from ._common import (
    MIN_PARALLEL_ITERS,
    inline_spatial,
    int_extent,
    is_spatial,
    map_block_bodies,
    root_blocks,
    selects_loads,
    simplify_indices,
    uses,
    vector_lanes,
    vector_tile,
)
from ._loops import PARTITION_HINT, SafeRule, loop_kinds, vectorize_with_tail
from .card import Card, untiled_contraction
from .classes import ScheduleClass
from .column_reduction import schedule_columns


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

    This is what makes merging the blocks' row loops into one legal (``merge`` itself checks
    no dependences): row r of a block never needs another row of an earlier block.
    """
    def by_row(region, lead) -> bool:
        dims = _row_dims(region)
        return len(dims) >= n and all(d.same_as(v) for d, v in zip(dims[:n], lead))

    written = {blk: [w.source for w in sch.get(blk).writes] for blk in blocks}
    for blk in blocks:
        stmt = sch.get(blk)
        lead = _lead_vars(sch, blk, n)
        if lead is None or not stmt.writes:
            return False
        if not all(by_row(w.region, lead) for w in stmt.writes):
            return False
        others = [buf for b in blocks if b != blk for buf in written[b]]
        for r in stmt.reads:
            if any(r.source.same_as(buf) for buf in others) and not by_row(r.region, lead):
                return False
    return True


def _binds_one_reduction(sch, block, loop) -> bool:
    """``loop`` is bound, as it is, to one reduction iter of ``block`` and to nothing else."""
    var = sch.get(loop).loop_var
    bound = [(iv, value) for iv, value in
             zip(sch.get(block).iter_vars, get_sblockrealize(sch, block).iter_values)
             if uses(value, var)]
    return (len(bound) == 1 and bound[0][0].iter_type == tirx.IterVar.CommReduce
            and bound[0][1].same_as(var))


# Shortest fused row worth a vector of partials: a 7 x 7 mean (672 channels, one thread,
# 16 lanes) took 5.0 us in its unrolled 7-long loops, 9.7 us fused.
_MIN_FUSED_ELEMENTS = 64


def _contiguous_reduction_loops(sch, block) -> list:
    """``block``'s innermost loops that reduce over the last dims of every buffer it reads,
    in order, each bound to one reduction iter: a mean over H and W reads ``x[n, c, h, w]``,
    one contiguous row of ``H * W`` per channel. Fused, they are one row to vectorize (the
    flattened address ``h * W + w`` of the fused index simplifies back to it)."""
    stmt = sch.get(block)
    out = []
    for lp in reversed(sch.get_loops(block)):
        if not _binds_one_reduction(sch, block, lp):
            break
        out.insert(0, lp)
    loop_vars = [sch.get(lp).loop_var for lp in out]
    values = dict(zip((iv.var for iv in stmt.iter_vars), get_sblockrealize(sch, block).iter_values))
    extents = [int_extent(sch, lp) for lp in out]
    for read in stmt.reads:
        n = len(read.region)
        tail = read.region[n - len(out):] if len(out) <= n else []
        shape = list(read.source.shape)[n - len(out):]
        if len(tail) != len(out) or read.source.strides or not all(
                isinstance(r.extent, tirx.IntImm) and r.extent.value == 1
                and values.get(r.min) is not None and values[r.min].same_as(v)
                for r, v in zip(tail, loop_vars)):
            return out[-1:]
        # every dim below the first spans its whole loop, or the rows are not contiguous
        if any(not isinstance(d, tirx.IntImm) or int(d) != e
               for d, e in zip(shape[1:], extents[1:])):
            return out[-1:]
    return out


def _vector_rfactor(sch, block, target):
    """Split an innermost reduction into ``lanes`` interleaved partial reductions (rfactor).

    The partial block reduces ``x[k*lanes + l]`` into slot ``l`` with ``l`` innermost and
    spatial, so it vectorizes; the original block then reduces the ``lanes`` slots. The sum
    order changes (float reassociation only); max/min stay exact. Tuple reducers (layer and
    group norm's sum and sum of squares in one block) get one slot vector per value. A row
    that is not a whole number of vectors keeps a guard on its last one, which the schedule
    peels off (see ``_loops.vectorize_with_tail``). Returns the partial block, or None where
    the row is shorter than two vectors or rfactor rejects the reducer.
    """
    stmt = sch.get(block)
    if is_spatial(stmt) or not stmt.writes:
        return None
    dtypes = {str(w.source.dtype) for w in stmt.writes}
    if len(dtypes) != 1:
        return None
    loops = sch.get_loops(block)
    lanes = vector_lanes(target, dtypes.pop())
    trailing = _contiguous_reduction_loops(sch, block)  # empty: the last loop is no reduction
    if not trailing:
        return None
    fused = 1
    for lp in trailing:
        fused *= int_extent(sch, lp) or 0
    # A short fused row (7 x 7) spends more on the final sum of the partial vector than it
    # saves: its constant 7-long loops unroll well as they are.
    if len(trailing) > 1 and fused >= _MIN_FUSED_ELEMENTS:
        loops = [*loops[:-len(trailing)], sch.fuse(*trailing)]
    ext = int_extent(sch, loops[-1])
    if ext is None or ext < 2 * lanes:
        return None
    _, inner = sch.split(loops[-1], factors=[None, lanes])
    try:
        return sch.rfactor(inner, factor_axis=len(stmt.writes[0].source.shape))
    except s_tir.ScheduleError:
        return None


def _first_reduction_loop(sch, block):
    """The outermost loop of ``block`` bound to a reduction iter (a mean over H and W
    reduces over two loops above the vector of partials: the init goes above both); None
    where every reduction has unit extent (no loop drives one)."""
    stmt, realize = sch.get(block), get_sblockrealize(sch, block)
    reduce_values = [value for iv, value in zip(stmt.iter_vars, realize.iter_values)
                     if iv.iter_type == tirx.IterVar.CommReduce]
    return next((lp for lp in sch.get_loops(block)
                 if any(uses(value, sch.get(lp).loop_var) for value in reduce_values)), None)


def _row_loop(sch, block, n):
    """The first ``n`` (row) loops of ``block``'s nest fused into one; (loop, its extent)."""
    loops = sch.get_loops(block)[:n]
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    return fused, sch.get(fused).extent



def _vector_partials(sch, blocks, target) -> None:
    """Every reduction of ``blocks`` into one vector of partial results (rfactor), the last
    vector of a ragged row partitioned off."""
    for blk in blocks:
        rf = _vector_rfactor(sch, blk, target)
        if rf is None:
            continue
        rf_loops = sch.get_loops(rf)  # lanes partial sums side by side: a vector accumulator
        guard = get_sblockrealize(sch, rf).predicate  # the last vector of a ragged row
        sch.vectorize(rf_loops[-1])
        if not (isinstance(guard, tirx.IntImm) and guard.value == 1):
            sch.annotate(rf_loops[-2], PARTITION_HINT, 1)
        sch.decompose_reduction(rf, _first_reduction_loop(sch, rf))


def _vectorize_rows(sch, blocks, target, min_loops: int) -> None:
    """The innermost loop of every spatial block of ``blocks`` (with at least ``min_loops``
    loops: a row loop above it) vectorized: whole vectors, a concat per row partitioned at its
    parts' bounds, a ragged row's tail peeled off."""
    for blk in blocks:
        stmt = sch.get(blk)
        blk_loops = sch.get_loops(blk)
        if not is_spatial(stmt) or len(blk_loops) < min_loops:
            continue
        ext = int_extent(sch, blk_loops[-1])
        if ext is None or ext < 2:
            continue
        lanes = vector_lanes(target, str(stmt.writes[0].source.dtype))
        if selects_loads(stmt.body) and ext % lanes == 0:
            # A concat per row: whole vectors, their loop partitioned at the parts'
            # bounds, so each part's vectors load it directly (no select of every part).
            outer, inner = sch.split(blk_loops[-1], [None, lanes])
            sch.annotate(outer, PARTITION_HINT, 1)
            sch.vectorize(inner)
            continue
        if ext % lanes and ext > 2 * lanes:
            vectorize_with_tail(sch, blk_loops[-1], lanes)
            continue
        tile = vector_tile(ext, lanes)
        inner = blk_loops[-1] if tile >= ext else sch.split(blk_loops[-1], [None, tile])[1]
        if tile >= 2:
            sch.vectorize(inner)


def _parallel_rows(sch):
    """``sch``'s function with its one root loop (the merged rows) parallel, on a new Schedule.

    ``merge`` makes a serial loop, and ``Schedule.parallel`` refuses it: after merge and
    decompose_reduction the partial blocks count as neither complete nor reduction blocks
    (the bindings of a guarded one read as not affine). The rows are independent --
    ``_rows_consistent`` proved that row r of every intermediate is written and read in
    iteration r -- so the loop kind is set on the IR directly.
    """
    func = sch.mod["main"]
    root = func.body.block.body
    if not isinstance(root, tirx.For):
        return None
    loop = tirx.For(root.loop_var, root.min, root.extent, tirx.ForKind.PARALLEL, root.body,
                    root.thread_binding, root.annotations)
    realize = func.body
    block = realize.block
    new_block = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, loop,
                             block.init, block.alloc_buffers, block.match_buffers,
                             block.annotations)
    new_realize = s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_block)
    return s_tir.Schedule(func.with_body(new_realize))


def reciprocal_divisions(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``a / b`` as ``a * (1 / b)`` in spatial blocks where ``b`` is constant along the row.

    Softmax divides every exp by its row's sum: a vector division costs ~10x a multiply, and
    LLVM keeps the division (the reciprocal rounds differently, within float tolerance).
    With ``1 / b`` loop-invariant, LLVM computes it once per row.
    """

    def reciprocal(block):
        if not block.iter_vars or not is_spatial(block):
            return block.body
        col = block.iter_vars[-1].var

        def div(node):
            if "float" not in str(node.ty) or not uses(node.a, col) or uses(node.b, col):
                return node
            one = tirx.FloatImm(str(node.ty), 1.0)
            return tirx.Mul(node.a, tirx.Div(one, node.b))

        return tvm_ffi.structural_map(block.body, (tirx.Div, div))

    return map_block_bodies(func, reciprocal)


def _claims_reduction(f, kind: str) -> bool:
    """Row reductions (softmax, norms, mean) with elementwise members, no contraction but an
    untiled one (below), no pooling window fused with other ops (row rules reduce over an
    axis: resnet18 with its maxpool fused into BN + ReLU ran 1.25x slower on CPU). On CPU
    every block must sit on the rows of the last one: a group that hands out a second tensor
    or transposes after its reduction falls back (a reshape keeps the rows). Applying the
    rules to the 150 measured reduction groups of the zoo and the synthetic programs: 49 fell
    back, 101 took the rule, no disagreement (synth-0's ``mul + mul1 + square1 + mean1``
    measured 2.6x slower fused than its parts). The last block must write the row: a kernel
    that ends in its reduction (a max pool or a sum alone) falls back."""
    if kind == "cpu" and untiled_contraction(f) and f.schedule in (
            ScheduleClass.CONTRACTION, ScheduleClass.CONTRACTION_PROLOGUE):
        # a contraction the contraction rule cannot tile (squeeze-excite's 1x1 convs on a
        # 1x1 image) and an epilogue after it: one dot product per output row; ending in the
        # contraction (alone, or after a prologue only), it is no row reduction the rule
        # takes, and the fallback runs it
        return f.n_outputs <= 1 and not f.ends_in_reduction
    if f.schedule != ScheduleClass.REDUCTION:
        return False
    return kind == "cuda" or (f.n_outputs <= 1 and not f.moves_after_reduction
                              and not f.ends_in_reduction)


# Vector rfactor partials, one row loop: TVM's FLOP count over the time of the math-free row
# reductions came to 0.22-0.31 of the 114 GFLOP/s one-core FMA-chain peak (LayerNorm 197x768
# and 128x768, wav2vec2's GroupNorm 512x3199; ``bench_kernels.py --classes reduction``,
# docs/log/2026-12-01a.md), where 0.05 had priced the scalar loops before them. Their math (exp)
# is priced apart (``cost/analytical.py``). CUDA: memory bound; ptxas gives ~16 registers.
REDUCTION_CARD = Card(ScheduleClass.REDUCTION, "RowReduction", _claims_reduction,
                      efficiency={"cpu": 0.25, "cuda": 0.10}, cuda_registers=16)


class RowReduction(SafeRule):
    """Softmax, layer norm, RMS norm, mean/sum + epilogue: parallel rows, vectorized inner.

    After inlining the spatial steps (exp, subtract-mean) into their consumers, every block's
    leading spatial (row) loops are fused and the row loops of all blocks merged into one, so
    a row stays in cache between the reduction passes and the final write. Innermost
    reductions at least two vectors long are rfactored into one vector of partial results
    (:func:`_vector_rfactor`; sums reassociate, within float tolerance), and a row that is
    not a whole number of vectors runs its last, partial vector as a scalar tail. A single
    row (a decode step's norm over its one token: every reduction reduces all it reads to one
    value) has no row loop to merge or run in parallel: its blocks keep their nests, serial,
    with the same vector partials and vectorized rows.
    """

    cards = (REDUCTION_CARD,)

    def _apply(self, sch, target):
        sch = s_tir.Schedule(reciprocal_divisions(simplify_indices(sch.mod["main"])))
        if normalize_prim_func(sch) is None:
            return None
        inline_spatial(sch)
        blocks = root_blocks(sch)
        if len(blocks) < 2 or not is_spatial(sch.get(blocks[-1])):
            return None
        reductions = [b for b in blocks if not is_spatial(sch.get(b))]
        if len(reductions) == 1 and schedule_columns(sch, reductions[0], target):
            return sch
        if all(is_spatial(sch.get(b)) for b in blocks):
            return None
        lead, single_row = [], True
        for blk in blocks:
            kinds = loop_kinds(sch, blk)
            if kinds is None:
                return None
            lead.append(len(kinds) - len("".join(kinds).lstrip("S")))
            wide = [k for k, lp in zip(kinds, sch.get_loops(blk)) if int_extent(sch, lp) != 1]
            single_row &= (len(wide) <= 1 if is_spatial(sch.get(blk)) else set(wide) <= {"R"})
        n = min(lead)
        # One row (a decode step's norm over its one token): every reduction reduces all it
        # reads to one value, every spatial block is one row; each block keeps its own nest,
        # in program order, serial.
        if not single_row and (n == 0 or not _rows_consistent(sch, blocks, n)):
            return None
        # A second output (an elementwise member read outside the group): the features price
        # such groups as the fallback (synth-0's measured 2.6x slower fused), so decline.
        func = sch.mod["main"]
        outputs = list(func.params)  # buffers, in TVM 0.27
        if any(w.source.same_as(o) for b in blocks[:-1] for w in sch.get(b).writes
               for o in outputs):
            return None
        if single_row:
            _vector_partials(sch, blocks, target)
            _vectorize_rows(sch, blocks, target, min_loops=1)
            return sch
        # Each block keeps its own nest at the root: its row loops fused (and parallel), its
        # reduction split into vector partials (rfactor: a nest of its own before it), its
        # inner loops vectorized; only then are the row loops of all nests merged into one,
        # in program order. The order is forced by TVM 0.27: compute_at would nest the
        # partials too, but it regenerates a block's loops from its iteration domain and drops
        # the guard of a ragged row's last vector (it then reads past the row); parallel must
        # precede decompose_reduction (the update block is no reduction block after it); and
        # parallel and vectorize refuse loops that merge made (see :func:`_parallel_rows`).
        nests = [_row_loop(sch, blk, n) for blk in blocks]
        extent = nests[-1][1]
        if any(not Analyzer().can_prove_equal(ext, extent) for _, ext in nests):
            return None
        rows = int_extent(sch, nests[-1][0]) or MIN_PARALLEL_ITERS  # symbolic: assume plenty
        per_row = 1
        for lp in sch.get_loops(blocks[-1])[1:]:
            per_row *= int_extent(sch, lp) or 1
        parallel = rows > 1 and rows * per_row >= MIN_PARALLEL_ITERS
        if parallel:
            for lp, _ in nests:
                sch.parallel(lp)
        _vector_partials(sch, blocks, target)
        _vectorize_rows(sch, blocks, target, min_loops=2)
        row_loops = []  # one per nest (a decomposed partial has two blocks in its nest)
        for blk in root_blocks(sch):
            top = sch.get_loops(blk)[0]
            if not any(sch.get(top).same_as(sch.get(lp)) for lp in row_loops):
                row_loops.append(top)
        if len(row_loops) > 1:
            sch.merge(*row_loops)
            if parallel:
                return _parallel_rows(sch)
        return sch
