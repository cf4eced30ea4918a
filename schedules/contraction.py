"""Contraction rule: matmul, batch matmul, conv2d (1x1, depthwise) with producers/epilogue."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from . import conv, depthwise, depthwise_nhwc, gemm
from ._common import (
    inline_epilogue,
    inline_spatial,
    int_extent,
    is_spatial,
    largest_divisor,
    root_blocks,
    vector_lanes,
    vector_registers,
    vector_tile,
)
from ._loops import SafeRule, read_bytes, schedule_rest, split_loops, tile_and_parallelize
from .card import Card, untiled_contraction
from .classes import ScheduleClass as SC
from .prepack import pack_streamed_operand
from .reduction import reciprocal_divisions

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _ContractionShape:
    """What the contraction tiling needs to know about ``C[s...] += A[...] * B[...]``."""

    vec: tirx.Var  # block var of the output's last index: the vectorized axis
    row: tirx.Var | None  # block var blocked into registers (not read by the streamed operand)
    streamed_larger: bool  # the operand indexed by `vec` holds more elements than the other
    streamed: object  # the buffer whose last index is exactly `vec`, or None


def _load(expr):
    """The BufferLoad under an optional Cast, else None."""
    if isinstance(expr, tirx.Cast):
        expr = expr.value
    return expr if isinstance(expr, ir.TensorLoad) else None


def _uses(exprs, var: tirx.Var) -> bool:
    """Whether any expression in ``exprs`` mentions ``var`` (identity, not ``==``: on TIR
    expressions ``==`` builds an ``EQ`` node instead of comparing)."""
    found = []
    for expr in exprs:
        tvm_ffi.structural_walk(expr, (tirx.Var, found.append), order="post")
    return any(v.same_as(var) for v in found)


def contraction_operands(block: s_tir.SBlock):
    """``(C, A, B)`` of ``C[..] = C[..] + A[..] * B[..]`` (loads under an optional Cast)."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
        return None
    if not store.indices:
        return None  # a 0-d output (a dot product): no axis to vectorize, a plain reduction
    acc, prod = store.value.a, store.value.b
    if not (isinstance(acc, ir.TensorLoad) and acc.source.same_as(store.buffer)):
        return None
    if not isinstance(prod, tirx.Mul):
        return None
    lhs, rhs = _load(prod.a), _load(prod.b)
    if lhs is None or rhs is None:
        return None
    return store, lhs, rhs


def _analyze_contraction(block: s_tir.SBlock) -> _ContractionShape | None:
    """Match ``C[v...] = C[v...] + A[..] * B[..]`` with ``v`` plain spatial block vars."""
    operands = contraction_operands(block)
    if operands is None:
        return None
    store, lhs, rhs = operands
    kinds = {iv.var: iv.iter_type for iv in block.iter_vars}
    extents = {iv.var: iv.dom.extent for iv in block.iter_vars}
    if not all(
        isinstance(i, tirx.IntImm)
        or (isinstance(i, tirx.Var) and kinds.get(i) == tirx.IterVar.DataPar)
        for i in store.indices
    ) or not isinstance(store.indices[-1], tirx.Var):
        return None  # constant indices: unit dims that normalize_prim_func bound to 0
    if not isinstance(extents[store.indices[-1]], tirx.IntImm):
        return None  # the vector tile must divide a known extent
    vec = store.indices[-1]
    streamed = [ld for ld in (lhs, rhs) if _uses([ld.indices[-1]], vec)]
    if len(streamed) != 1:
        return None
    streamed = streamed[0]
    other = rhs if streamed is lhs else lhs
    cands = [
        v
        for v in store.indices
        if isinstance(v, tirx.Var)
        and not v.same_as(vec)
        and isinstance(extents[v], tirx.IntImm)
        and int(extents[v]) > 1
    ]  # a symbolic extent (dynamic batch) stays an outer loop
    cands.sort(key=lambda v: (_uses(streamed.indices, v), -int(extents[v])))
    row = cands[0] if cands else None

    def _numel(ld):
        n = 1
        for s in ld.source.shape:
            n *= int(s) if isinstance(s, tirx.IntImm) else 1 << 20
        return n

    return _ContractionShape(vec, row, _numel(streamed) >= _numel(other),
                             streamed.source if streamed.indices[-1].same_as(vec) else None)


def _claims_contraction(f, kind: str) -> bool:
    """One contraction and an elementwise epilogue, on any target. On CUDA also with
    data-movement producers (dlight's Matmul rule inlines a transpose, reshape or split into its
    operand loads) and reshaping epilogues (it keeps its tiled kernel: ptxas gave gpt2_block's
    projection matmul 64 registers and 6912 B of shared memory with and without its
    head-merging transpose prologue), but not with computing producers (re-evaluated per
    operand load; unmeasured on CUDA) nor a split epilogue (several elements of one tuple read
    after it: TVM 0.27 fails to lower it, "matmul_intermediate_reindex is used before its
    definition")."""
    if f.attention and kind == "cpu":  # the attention rule's (its softmax is a reduction, so
        return False  # the form is never a lone contraction; said here, not left to order)
    if kind == "cpu" and untiled_contraction(f):
        return False  # the row-reduction rule's
    form = f.schedule
    if form == SC.CONTRACTION:
        return True
    return (kind == "cuda" and form in (SC.CONTRACTION_PROLOGUE, SC.CONTRACTION_RESHAPE)
            and not f.tuple_items and not f.prologue_compute)


def _claims_stream(f, kind: str) -> bool:
    """CPU: one contraction with producers, which stay one streamed packing pass (a conv's
    pad absorbs a BN + ReLU prologue; measured fused/unfused 0.78-1.03 per kernel). Not with a
    data-movement epilogue as well: per kernel it measured neutral, but inside bert_layer each
    of its three head-split/merge groups made the model slower (0.4, 1.1 and 2.2 ms of 22.5;
    docs/log/2026-11-29a.md). Not with a split epilogue: the rule declines a contraction with
    several consumers (measured 54x slower: gpt2_block's Q/K/V projection)."""
    return (kind == "cpu" and f.schedule == SC.CONTRACTION_PROLOGUE and not f.reshaping_ops
            and not f.tuple_items and not f.attention and not untiled_contraction(f))


# CPU: the register-blocked micro-kernel (``gemm.py``) reached 0.49-0.63 of the FMA-chain peak
# (geomean over the 8 kernels of ``scripts/bench_kernels.py``, two runs, docs/log/2026-12-01a.md;
# Linears 0.6-0.8, attention's short-K batch matmuls 0.2-0.6). A contraction with a known block
# geometry (``Node.geometry``) is priced at the share its rule's own tile reaches
# (``efficiency.py``: 0.19-0.93 measured, by shape); 0.55 prices the rest (stored rows from
# before the geometry, symbolic shapes) and the epilogue computed in its tile. CUDA: dlight's
# SIMT matmul tiles reach about half of FP32 peak and use 64 registers (ptxas).
CONTRACTION_CARD = Card(
    SC.CONTRACTION, "Contraction", _claims_contraction,
    efficiency={"cpu": 0.55, "cuda": 0.50}, contraction_efficiency={"cpu": 0.55, "cuda": 0.50},
    tiles_by_geometry=True, register_tile=True, cuda_registers=64,
    # every Linear of a 3-D input as the PyTorch importer emits it (matmul, bias, reshape,
    # GELU) has its epilogue behind a unit reshape (docs/log/2026-12-01b.md, "Epilogues through
    # unit reshapes"); on CUDA walking views into contractions changed bert's and gpt2's
    # head-split groups (unmeasured: not taken)
    through_views=frozenset({"cpu"}))
# The streamed producers run as an elementwise pass (0.05 of peak, as the fallback's loops)
# whose output reaches memory, in a second parallel nest.
STREAM_CARD = Card(
    SC.CONTRACTION_STREAM, "Contraction", _claims_stream,
    efficiency={"cpu": 0.55}, contraction_efficiency={"cpu": 0.55},
    prologue_efficiency={"cpu": 0.05}, tiles_by_geometry=True, register_tile=True,
    materializes=True, recomputes=False, nests=lambda f: 2)


class Contraction(SafeRule):
    """Matmul, batch matmul, conv2d (incl. 1x1, depthwise) with spatial producers/epilogue.

    A block whose indices are all plain vars (dense, matmul and batch matmul in every form the
    importers emit, 1x1 conv) gets the register-blocked micro-kernel of ``gemm.py``, which pads
    ragged extents; an NC(H)W convolution (windowed, strided, grouped) the direct kernel of
    ``conv.py``, vectorized over output channels; an NCHW depthwise one the kernel of
    ``depthwise.py``, vectorized along the image row; the rest (or where those decline) keep
    the tiling below, whose tiles must divide the extents. Loop nest: ``parallel(tile of the
    bigger operand, other spatial, other tile) -> reduction
    loops -> row tile (unrolled) -> vector tile (vectorized)``. The ``row x vec`` accumulator
    lives in a ``local`` buffer that LLVM promotes to registers; the epilogue is inlined into
    its write-back so the contraction result never reaches memory. Producers (pad, transpose)
    are not inlined into the contraction, which reads each element many times: they stay one
    streamed, parallel, vectorized pass (a transpose so becomes a packing step).
    """

    cards = (CONTRACTION_CARD, STREAM_CARD)

    def _apply(self, sch, target):
        # An inference batch norm divides every output by its channel's sqrt(var + eps): one
        # vector division per output vector in the tile's write-back, as its reciprocal one
        # multiply (16 -> 96 channels at 112 x 112 with BN and ReLU6: 0.43 against 0.53 ms).
        sch = s_tir.Schedule(reciprocal_divisions(sch.mod["main"]))
        if normalize_prim_func(sch) is None:
            return None
        reductions = [b for b in root_blocks(sch) if not is_spatial(sch.get(b))]
        if len(reductions) != 1:
            return None
        name = sch.get(reductions[0]).name_hint
        operands = contraction_operands(sch.get(reductions[0]))
        einsum = gemm.analyze(sch.get(reductions[0]), *operands) if operands else None
        window = conv.analyze(sch.get(reductions[0]), *operands) if operands else None
        dw = depthwise.analyze(sch.get(reductions[0]), *operands) if operands else None
        dw_last = (depthwise_nhwc.analyze(sch.get(reductions[0]), *operands)
                   if operands else None)
        shape = _analyze_contraction(sch.get(reductions[0]))
        if shape is None and einsum is None and window is None and dw is None \
                and dw_last is None:
            return None
        inline_spatial(sch, protect={name})
        main = sch.get_sblock(name)
        read = read_bytes(sch, main)  # before any packed copy: what the model prices
        consumers = sch.get_consumers(main)
        if len(consumers) > 1:
            return None
        # a micro-kernel fails whole (on a copy): the general tiling below stands
        for kernel, roles in ((gemm, einsum), (conv, window), (depthwise, dw),
                              (depthwise_nhwc, dw_last)):
            if roles is None:
                continue
            trial = sch.copy()
            try:
                done = kernel.schedule(trial, name, roles, target)
            except (RuntimeError, ValueError) as err:  # ScheduleError is a RuntimeError
                _log.debug("%s: no %s kernel: %s", name, kernel.__name__.rsplit(".")[-1],
                           str(err).splitlines()[0])
                done = None
            if done is not None:
                return done
        if shape is None:
            return None

        stmt = sch.get(main)
        lanes = vector_lanes(target, str(stmt.writes[0].source.dtype))
        accumulators = vector_registers(target) // 2  # the other half: operands, addresses
        loops = split_loops(sch, main, shape.vec, shape.row)
        if loops is None:  # normalize_prim_func dropped unit loops: their iters bind constants
            return None
        spatial, reduce_loops, vec_loop, row_loop = loops
        if vec_loop is None or not reduce_loops:
            return None

        vec_ext = int_extent(sch, vec_loop)
        vtile = vector_tile(vec_ext, lanes, max_vectors=2 if row_loop is not None else 4)
        vo, vi = sch.split(vec_loop, factors=[None, vtile])
        nvec = -(-vtile // lanes)
        inner, outer_tiles = [vi], [vo]
        if row_loop is not None:
            rtile = largest_divisor(int_extent(sch, row_loop), max(1, accumulators // nvec))
            ro, ri = sch.split(row_loop, factors=[None, rtile])
            inner = [ri, vi]
            outer_tiles = [vo, ro] if shape.streamed_larger else [ro, vo]
        order = [outer_tiles[0], *spatial, *outer_tiles[1:]]
        tile_loop = tile_and_parallelize(sch, order, reduce_loops, inner, read)

        writeback = sch.cache_write(main, 0, "local")
        inline_epilogue(sch, writeback)  # else a separate (generically scheduled) pass
        sch.reverse_compute_at(writeback, tile_loop, preserve_unit_loops=True)
        if len(inner) == 2 and int_extent(sch, inner[0]) > 1:
            sch.unroll(inner[0])
        sch.vectorize(inner[-1])  # before decompose: the update block alone is no reduction
        init = sch.decompose_reduction(main, reduce_loops[0])
        for blk in (init, writeback):
            blk_loops = sch.get_loops(blk)
            if len(blk_loops) > 1 and (int_extent(sch, blk_loops[-1]) or 0) > 1:
                sch.vectorize(blk_loops[-1])
        done = {sch.get(b).name_hint for b in (main, init, writeback)}
        if shape.streamed is not None:
            trial = sch.copy()  # packing fails whole: the tiled schedule stands without it
            try:
                if pack_streamed_operand(trial, main, shape.streamed, vtile):
                    sch = trial
            except (RuntimeError, ValueError) as err:  # ScheduleError is a RuntimeError
                _log.warning("%s: weight left unpacked: %s", name, str(err).splitlines()[0])
        schedule_rest(sch, target, done)
        return sch
