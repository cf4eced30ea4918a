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
and a transposed ``B[j, k]`` needs it to load full vectors at all).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tvm import ir, s_tir, tirx

from ._common import (
    covers_output,
    int_extent,
    vector_lanes,
    vector_registers,
)
from ._loops import schedule_rest, split_loops, tile_and_parallelize
from .prepack import layout_free, pack_streamed_operand

_log = logging.getLogger(__name__)

# Vectors per tile row: a power of two (LLVM legalizes 3- or 6-register vectors badly, see
# ``_common.vector_tile``).
_VECTOR_COUNTS = (1, 2, 4)

# Cycles from one FMA to the next on the same accumulator (4 on Skylake and Zen 4, 5 on
# Haswell: the larger, so an AVX2 tile keeps 10+ chains): a tile of fewer than twice this many
# accumulators (2 FMA ports) waits on its own chains.
_FMA_LATENCY = 5

# Vector loads and broadcasts issued per cycle. Two load ports in theory; measured on an
# AVX-512 host (emeraldrapids, ViT's 12 x 197 x 64 x 197 scores), a 22 x 1 tile (23 loads per
# 22 FMAs) ran 1.5x slower per FMA than 12 x 2 (14 per 24): about 1.5 per cycle.
_LOADS_PER_CYCLE = 1.5


@dataclass(frozen=True)
class Tile:
    """An output tile of ``rows x vectors`` registers of ``lanes`` lanes."""

    rows: int
    vectors: int
    lanes: int

    @property
    def cols(self) -> int:
        return self.vectors * self.lanes


def accumulator_budget(registers: int) -> int:
    """Vector registers a tile may hold: three quarters (24 of 32 zmm, 12 of 16 ymm); the rest
    hold the streamed vectors, the broadcast row value and spill-free address arithmetic."""
    return registers * 3 // 4


def _tile_cycles(tile: Tile, m: int, n: int) -> float:
    """Relative time of the padded ``m x n`` output in ``tile``s, per reduction step.

    Per step a tile issues ``rows * vectors`` FMAs (2 per cycle) and ``rows + vectors`` loads
    (:data:`_LOADS_PER_CYCLE`), and takes at least one FMA latency.
    """
    fmas = tile.rows * tile.vectors
    per_tile = max(fmas / 2, (tile.rows + tile.vectors) / _LOADS_PER_CYCLE, _FMA_LATENCY)
    return -(-m // tile.rows) * -(-n // tile.cols) * per_tile


def choose_tile(m: int, n: int, lanes: int, registers: int,
                cols_must_divide: bool = False) -> Tile | None:
    """The tile with the least estimated time for an ``m x n`` output (ties: more
    accumulators). ``cols_must_divide``: the columns may not be padded (a constant weight that
    is packed at compile time with exactly its own width)."""
    budget = accumulator_budget(registers)
    best, best_key = None, None
    for vectors in _VECTOR_COUNTS:
        cols = vectors * lanes
        if cols_must_divide and n % cols:
            continue
        if vectors > 1 and cols > n + lanes - 1:
            continue  # a whole extra padded vector
        for rows in range(1, budget // vectors + 1):
            if rows > m:
                break
            tile = Tile(rows, vectors, lanes)
            key = (_tile_cycles(tile, m, n), -rows * vectors, -vectors)
            if best_key is None or key < best_key:
                best, best_key = tile, key
    return best


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
    stmt = sch.get(main)
    extents = {iv.var: _iter_extent(iv) for iv in stmt.iter_vars}
    lanes = vector_lanes(target, str(stmt.writes[0].source.dtype))
    n = extents[shape.col]
    m = extents[shape.row] if shape.row is not None else 1
    if n is None or m is None or n < lanes:
        return None  # narrower than one vector: the general tiling fits partial vectors
    weight = any(p.same_as(shape.streamed.source) for p in layout_free(sch))
    tile = choose_tile(m, n, lanes, vector_registers(target), cols_must_divide=weight)
    if tile is None:
        return None
    padding = [tile.cols if iv.var.same_as(shape.col)
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
        for epilogue in sch.get_consumers(tail):
            if covers_output(sch.get(epilogue), sch.get(tail)):
                _try(sch.reverse_compute_inline, epilogue)
    stmt = sch.get(main)
    store = stmt.body
    loads = [ld.value if isinstance(ld, tirx.Cast) else ld
             for ld in (store.value.b.a, store.value.b.b)]
    now = analyze(stmt, store, *loads)  # the operands are the padded copies now
    if now is not None:
        sch = _pack_panels(sch, main, now, tile.cols)
    loops = split_loops(sch, main, shape.col, shape.row)
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
        larger = _numel(shape.streamed.source) >= _numel(shape.other.source)
        outer = [co, ro] if larger else [ro, co]
    order = [*spatial, *outer]
    tile_loop = tile_and_parallelize(sch, order, reduce_loops, inner)

    writeback = sch.cache_write(main, 0, "local")
    if tail is not None:
        sch.compute_inline(writeback)  # the crop (with the epilogue) reads the registers
    else:
        tail = writeback
        for epilogue in sch.get_consumers(writeback):
            if covers_output(sch.get(epilogue), sch.get(writeback)):
                _try(sch.reverse_compute_inline, epilogue)
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
