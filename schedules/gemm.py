"""Register-blocked micro-kernel for einsum-form contractions (dense, matmul, batch matmul).

A block ``C[b.., i, j] += A[.., i, .., k] * B[.., k, .., j]`` whose every index is a plain block
var (any number of batch dims, broadcast or not; either operand transposed) is scheduled as

``parallel(batch, column tile, row tile) -> k -> rows (unrolled) -> columns (vectorized)``

with an output tile of ``rows x vectors * lanes`` accumulators sized from the target's vector
register count (:func:`choose_tile`), so LLVM keeps the tile in registers and the inner loop
is one broadcast per row, one load per vector and ``rows * vectors`` FMAs on full vectors.

Extents that the tile does not divide (a ViT's 197 tokens, 197 is prime) are padded with
``pad_einsum``: the padded operand is copied once (``rows`` or ``lanes`` multiples, a copy of
``M * K`` against ``M * N * K`` FMAs) and the output crop carries the epilogue. Without padding
such a kernel either degenerates to one scalar row (the tile must divide) or needs a guard in
the inner loop; both ran at naive-loop speed. The streamed operand (the one indexed by the
output's last axis) is stored as column panels ``(.., j / cols, k, cols)``: at compile time for
a constant weight (``prepack``), inside the kernel otherwise (free when it is padded anyway,
and a transposed ``B[j, k]`` needs it to load full vectors at all). Where the output and the
streamed operand share a contiguous axis before the columns (the pixel rows of an NCHW 1x1
convolution), the two merge into one column axis (``columns.py``) that is read in place.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from tvm import ir, s_tir, tirx

from . import columns
from ._common import (
    inline_epilogue,
    int_extent,
    vector_lanes,
    vector_registers,
)
from ._loops import read_bytes, schedule_rest, split_loops, tile_and_parallelize
from .gemm_tile import (  # noqa: F401 -- the tile model, public here as gemm.*
    Tile,
    accumulator_budget,
    choose_tile,
    pick_tile,
)
from .prepack import layout_free, pack_streamed_operand

_log = logging.getLogger(__name__)

# Up to this size the streamed operand is re-read from cache once per row tile, and the row
# tiles go outermost: the write-back then streams ``rows`` output rows instead of all ``m``
# (a 16 -> 96 channel 1x1 convolution at 112 x 112, 0.8 MB of input: 0.39 ms against 0.65 ms
# with the column tiles outermost, 1 thread). A larger one (a Linear's 2.4 MB weight) stays
# in the column tiles outermost, read once (re-reading it per row tile: 2x slower). Half
# the 2 MiB L2 of current server cores; on a smaller L2 the re-reads come from L3.
_CACHED_STREAM_BYTES = 1 << 20


@dataclass(frozen=True)
class Einsum:
    """The roles of the block vars of an einsum-form contraction."""

    col: tirx.Var  # the output's last index: vectorized
    row: tirx.Var | None  # an output index only the other operand reads: blocked into registers
    streamed: ir.TensorLoad  # the operand indexed by ``col``
    other: ir.TensorLoad
    reduce: tuple[tirx.Var, ...]


def _plain(indices) -> bool:
    return all(isinstance(i, tirx.Var | tirx.IntImm) for i in indices)


def _has(indices, var) -> bool:
    return any(isinstance(i, tirx.Var) and i.same_as(var) for i in indices)


def reuse(extents: dict, shape: Einsum) -> int:
    """The output rows each streamed element serves: the product of the block's extents
    (``var -> extent``; None counts 1) of the vars its own indices do not name."""
    return math.prod(e or 1 for v, e in extents.items() if not _has(shape.streamed.indices, v))


def analyze(block: s_tir.SBlock, store, lhs, rhs) -> Einsum | None:
    """Roles for ``store = store + lhs * rhs`` when every index is a var or a constant."""
    if not (_plain(store.indices) and _plain(lhs.indices) and _plain(rhs.indices)):
        return None
    col = store.indices[-1]
    if not isinstance(col, tirx.Var):
        return None
    streamed = [ld for ld in (lhs, rhs) if _has(ld.indices, col)]
    if len(streamed) != 1:
        return None
    streamed = streamed[0]
    other = rhs if streamed is lhs else lhs
    extents = {iv.var: iv.dom.extent for iv in block.iter_vars}
    reduce = tuple(iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce)
    rows = [v for v in store.indices[:-1] if isinstance(v, tirx.Var)
            and isinstance(extents[v], tirx.IntImm) and int(extents[v]) > 1
            and _has(other.indices, v) and not _has(streamed.indices, v)]
    return Einsum(col, rows[-1] if rows else None, streamed, other, reduce)


def _iter_extent(iv) -> int | None:
    ext = iv.dom.extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def _numel(buffer) -> int:
    n = 1
    for s in buffer.shape:
        n *= int(s) if isinstance(s, tirx.IntImm) else 1 << 20
    return n


def _panel_map(load: ir.TensorLoad, col: tirx.Var, k: tirx.Var, cols: int):
    """IndexMap of ``load``'s buffer to column panels: ``(rest.., col / cols, k, col % cols)``."""
    pos_c = next(i for i, x in enumerate(load.indices) if isinstance(x, tirx.Var)
                 and x.same_as(col))
    pos_k = next(i for i, x in enumerate(load.indices) if isinstance(x, tirx.Var)
                 and x.same_as(k))

    def mapping(*idx):
        rest = [x for i, x in enumerate(idx) if i not in (pos_c, pos_k)]
        return (*rest, idx[pos_c] // cols, idx[pos_k], idx[pos_c] % cols)

    return tirx.IndexMap.from_func(mapping, ndim=len(load.indices))


def _read_index(sch, block, buffer) -> int:
    return next(i for i, r in enumerate(sch.get(block).reads) if r.source.same_as(buffer))


def _pack_panels(sch: s_tir.Schedule, main, shape: Einsum, cols: int) -> s_tir.Schedule:
    """``sch`` with the streamed operand stored as column panels where that pays (module
    docstring); a constant weight is packed at compile time, on a copy that is dropped if
    packing fails."""
    load = shape.streamed
    buffer = load.source
    ks = [k for k in shape.reduce if _has(load.indices, k)]
    pos = next(i for i, x in enumerate(load.indices) if _has([x], shape.col))
    if len(ks) != 1 or not isinstance(buffer.shape[pos], tirx.IntImm) or (
            int(buffer.shape[pos]) % cols or int(buffer.shape[pos]) == cols):
        return sch  # several reduction axes, ragged or one panel wide: nothing to gain
    col_last = pos == len(load.indices) - 1
    if any(p.same_as(buffer) for p in sch.mod["main"].params):
        if any(p.same_as(buffer) for p in layout_free(sch)) and col_last:
            trial = sch.copy()
            try:
                if pack_streamed_operand(trial, main, buffer, cols):
                    return trial
            except (RuntimeError, ValueError) as err:  # ScheduleError is a RuntimeError
                _log.warning("weight left unpacked: %s", str(err).splitlines()[0])
            return sch
        if col_last:
            return sch  # already full vectors along the columns: a copy would not pay
        producer = sch.cache_read(main, _read_index(sch, main, buffer), "global")
    else:
        producer = next(p for p in sch.get_producers(main)
                        if sch.get(p).writes[0].source.same_as(buffer))
    # The panel map is a bijection (cols divides the extent); TVM 0.27 fails to prove it
    # when the column is not the last index ("Indirect return occurred in idx_2").
    sch.transform_layout(producer, ("write", 0), _panel_map(load, shape.col, ks[0], cols),
                         assume_injective_transform=True)
    return sch


def _try(step, *args) -> bool:
    """Run a schedule primitive; whether TVM accepted it."""
    try:
        step(*args)
        return True
    except s_tir.ScheduleError:
        return False


def _vectorize_inner(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Vectorize ``block``'s innermost loop (in ``lanes`` pieces if it has a tail)."""
    loops = sch.get_loops(block)
    ext = int_extent(sch, loops[-1]) if loops else None
    if not ext or ext <= 1 or len(loops) < 2:
        return
    if ext % lanes and ext > lanes:
        loops = sch.split(loops[-1], factors=[None, lanes])
    _try(sch.vectorize, loops[-1])


def schedule(sch: s_tir.Schedule, name: str, shape: Einsum, target) -> s_tir.Schedule | None:
    """Tile, pad and pack the contraction block ``name`` (module docstring); None where the
    micro-kernel does not fit (the caller then keeps its general tiling)."""
    main = sch.get_sblock(name)
    read = read_bytes(sch, main)  # before any padded copy: what the model prices
    stmt = sch.get(main)
    extents = {iv.var: _iter_extent(iv) for iv in stmt.iter_vars}
    lanes = vector_lanes(target, str(stmt.writes[0].source.dtype))
    n = extents[shape.col]
    m = extents[shape.row] if shape.row is not None else 1
    if n is None or m is None or n < lanes:
        return None  # narrower than one vector: the general tiling fits partial vectors
    weight = any(p.same_as(shape.streamed.source) for p in layout_free(sch))
    height = columns.mergeable(stmt, stmt.body, shape)
    tile, cols = pick_tile(m, n, lanes, vector_registers(target), weight, height,
                           reuse(extents, shape))
    merged = n if cols != n else None  # the image row's width, merged into the columns
    if tile is None:
        return None
    padding = [(1 if merged else tile.cols) if iv.var.same_as(shape.col)
               else tile.rows if shape.row is not None and iv.var.same_as(shape.row) else 1
               for iv in stmt.iter_vars]
    padded = any(e is not None and e % p for e, p in zip(extents.values(), padding))
    tail = None
    if padded:
        sch.pad_einsum(main, padding)
        main = sch.get_sblock(name)
        for pad in sch.get_producers(main):
            for producer in sch.get_producers(pad):  # a transpose feeding B: one packing pass
                _try(sch.compute_inline, producer)
        crops = sch.get_consumers(main)
        if len(crops) != 1:
            return None
        tail = crops[0]
        inline_epilogue(sch, tail)
    stmt = sch.get(main)
    store = stmt.body
    loads = [ld.value if isinstance(ld, tirx.Cast) else ld
             for ld in (store.value.b.a, store.value.b.b)]
    now = analyze(stmt, store, *loads)  # the operands are the padded copies now
    col, row = shape.col, shape.row
    if merged:  # the columns are contiguous in place: no panels
        columns.inline_copy(sch, main, shape.streamed.source)
        names = [iv.var for iv in stmt.iter_vars]
        pos = columns.merge_block(sch, main, merged)
        if pos is None:
            return None
        ivs = [iv.var for iv in sch.get(main).iter_vars]
        col = ivs[pos[1]]
        if row is not None:
            at = next(i for i, v in enumerate(names) if v.same_as(row))
            row = ivs[at - (at > pos[0])]
    elif now is not None:
        sch = _pack_panels(sch, main, now, tile.cols)
    loops = split_loops(sch, main, col, row)
    if loops is None:
        return None
    spatial, reduce_loops, col_loop, row_loop = loops
    if col_loop is None or not reduce_loops:
        return None
    co, ci = sch.split(col_loop, factors=[None, tile.cols])
    inner, outer = [ci], [co]
    if row_loop is not None:
        ro, ri = sch.split(row_loop, factors=[None, tile.rows])
        inner = [ri, ci]
        streamed = _numel(shape.streamed.source)
        cached = streamed * shape.streamed.source.dtype.bits // 8 <= _CACHED_STREAM_BYTES
        larger = streamed >= _numel(shape.other.source)
        outer = [co, ro] if larger and not cached else [ro, co]
    order = [*spatial, *outer]
    tile_loop = tile_and_parallelize(sch, order, reduce_loops, inner, read)

    writeback = sch.cache_write(main, 0, "local")
    if tail is not None:
        sch.compute_inline(writeback)  # the crop (with the epilogue) reads the registers
    else:
        tail = writeback
        inline_epilogue(sch, writeback)
    if merged:
        columns.merge_buffer(sch, main, merged)
        if columns.merge_block(sch, tail, merged) is None:
            return None
    sch.reverse_compute_at(tail, tile_loop, preserve_unit_loops=True)
    if len(inner) == 2 and tile.rows > 1:
        sch.unroll(inner[0])
    sch.vectorize(inner[-1])  # before decompose: the update block alone is no reduction
    init = sch.decompose_reduction(main, reduce_loops[0])
    for blk in (init, tail):
        _vectorize_inner(sch, blk, lanes)
    done = {sch.get(b).name_hint for b in (main, init, tail)}
    schedule_rest(sch, target, done)
    _log.debug("%s: %d x %d tile%s", name, tile.rows, tile.cols, ", padded" if padded else "")
    return sch
