"""Depthwise convolution kernel: NCHW, one filter per channel, vectorized along the image row.

A depthwise block (``groups == channels``, multiplier 1, as the importers legalize it)

``C[n, c, y, x] += P[n, c, y * s + ry * d, x * s + rx * d] * W[c, 0, ry, rx]``

has no reduction over channels to vectorize (``conv.py``'s kernel) and only ``KH * KW`` (9 or
25) multiply-adds per output, so its time is loads, stores and the padded copy. As in XNNPACK's
and TVM's old x86 ``depthwise_conv2d`` kernels (NCHW), the output row is the vector axis: per
``(ry, rx)`` step one weight scalar (broadcast) times one input vector per output vector:

``parallel(n, c) -> row tile, column tile -> ry, rx (unrolled) -> rows (unrolled)
-> columns (vectorized)``

- the ``rows x columns`` accumulator tile stays in registers (:func:`choose_depthwise_tile`),
  the unrolled window lets LLVM share the input vectors that neighbouring output rows read,
  and the epilogue (bias, BN, activation, residual) is computed on it before the one store;
- stride 2 stores the input plane deinterleaved, ``(.., H, 2, W / 2)`` (even columns, then
  odd; the legalized zero-pad writes it, or a copy of an unpadded input), so every window tap
  reads contiguous vectors: in NCHW a stride-2 row read is a gather of scalars per tap, 9 or
  25 per output, where the deinterleaving copy moves each input element once, as whole
  vectors split by shuffles (:func:`order_parity_last`).

The padded (or deinterleaved) plane stays one streamed pass of its own. Computing it per
channel inside the parallel loop measured slower or equal on 42 of the corpus's 44 depthwise
shapes (1 thread, emeraldrapids, ``lab/depthwise_bench.py``): a plane under a few
KiB becomes a stack array that LLVM splits into scalars (efficientnet_b0's 1152 x 7 x 7 5x5:
0.70 ms per channel against 0.15 ms as a pass).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.sym.analyzer import Analyzer

from ._common import (
    contraction_parallel,
    inline_epilogue,
    largest_divisor,
    uses,
    vector_lanes,
    vector_registers,
)
from ._loops import parallelize, read_bytes, schedule_rest, split_loops
from .conv_shape import _coefficient
from .gemm import _try
from .gemm_tile import accumulator_budget

__all__ = [
    "MAX_TAPS",
    "DepthwiseShape",
    "DepthwiseTile",
    "analyze",
    "axis_window",
    "choose_depthwise_tile",
    "deinterleave_columns",
    "is_var",
    "order_parity_last",
    "schedule",
    "unroll_short_row",
    "vectorize_last",
    "window_block",
]

_log = logging.getLogger(__name__)

# Windows with more taps than this are no depthwise layer of the corpus (3x3, 5x5; 7x7 in
# ConvNeXt): an unrolled 9x9 window would be a large body for little gain.
MAX_TAPS = 49


@dataclass(frozen=True)
class DepthwiseShape:
    """The block vars of a depthwise convolution and its window along each image axis."""

    channel: tirx.Var
    width: tirx.Var
    height: tirx.Var
    data: ir.TensorLoad
    weight: ir.TensorLoad
    # (taps, stride, dilation) along the rows (height) and the columns (width)
    rows: tuple[int, int, int]
    cols: tuple[int, int, int]


@dataclass(frozen=True)
class DepthwiseTile:
    """``height`` output rows by ``width`` output columns (whole or half vectors, the whole
    row, or a divisor of it below a vector) held in accumulators."""

    height: int
    width: int
    lanes: int

    @property
    def vectors(self) -> int:
        return -(-self.width // self.lanes)


def _vars(expr) -> list[tirx.Var]:
    found: list = []
    tvm_ffi.structural_walk(expr, (tirx.Var, found.append), order="post")
    return found


def is_var(expr, var) -> bool:
    """Whether ``expr`` is the variable ``var`` itself."""
    return isinstance(expr, tirx.Var) and expr.same_as(var)


def axis_window(index, out_var, reduce_var, extents) -> tuple[int, int, int] | None:
    """(taps, stride, dilation) of ``index == out_var * s + reduce_var * d``; None otherwise
    (an offset, another var, a product)."""
    found = _vars(index)
    if not all(v.same_as(out_var) or v.same_as(reduce_var) for v in found):
        return None
    stride, dilation = _coefficient(index, out_var), _coefficient(index, reduce_var)
    if not stride or not dilation or stride < 1 or dilation < 1:
        return None
    rest = Analyzer().simplify(index - out_var * stride - reduce_var * dilation)
    if not (isinstance(rest, tirx.IntImm) and int(rest) == 0):
        return None
    return int(extents[reduce_var]), stride, dilation


def window_block(block: s_tir.SBlock, store):
    """(output indices, extents, the two reduction vars) of a block that may be a 2-d
    depthwise window over a 4-d output: static extents, output indices vars or constants, the
    last three data-parallel vars, two reduction vars; None otherwise. Which of the last three
    is the channel is the layout's business (``analyze`` here, ``depthwise_nhwc.analyze``)."""
    kinds = {iv.var: iv.iter_type for iv in block.iter_vars}
    extents = {iv.var: iv.dom.extent for iv in block.iter_vars}
    if not all(isinstance(e, tirx.IntImm) for e in extents.values()):
        return None
    out = list(store.indices)
    if len(out) != 4 or not all(isinstance(i, tirx.Var | tirx.IntImm) for i in out):
        return None
    if not all(isinstance(v, tirx.Var) and kinds.get(v) == tirx.IterVar.DataPar
               for v in out[1:]):
        return None
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    return (out, extents, reduce) if len(reduce) == 2 else None


def analyze(block: s_tir.SBlock, store, lhs, rhs) -> DepthwiseShape | None:
    """Roles for ``store = store + lhs * rhs`` when it is an NCHW depthwise convolution with
    multiplier 1 (the input's channel index is the output's channel var); None otherwise
    (dense and grouped convolutions, matmuls, NHWC, a channel multiplier)."""
    found = window_block(block, store)
    if found is None:
        return None
    out, extents, reduce = found
    channel, height, width = out[1], out[2], out[3]
    for weight, data in ((lhs, rhs), (rhs, lhs)):
        w, d = list(weight.indices), list(data.indices)
        if len(w) != 4 or len(d) != 4 or not is_var(w[0], channel) or not is_var(d[1], channel):
            continue
        if not (isinstance(w[1], tirx.IntImm) and int(w[1]) == 0
                and is_var(w[2], reduce[0]) and is_var(w[3], reduce[1])):
            continue
        if not (is_var(d[0], out[0]) if isinstance(out[0], tirx.Var) else
                isinstance(d[0], tirx.IntImm) and int(d[0]) == int(out[0])):
            continue  # the batch
        rows = axis_window(d[2], height, reduce[0], extents)
        cols = axis_window(d[3], width, reduce[1], extents)
        if rows is None or cols is None or rows[0] * cols[0] > MAX_TAPS:
            return None
        if weight.source.same_as(store.buffer) or data.source.same_as(store.buffer):
            return None
        return DepthwiseShape(channel, width, height, data, weight, rows, cols)
    return None


def choose_depthwise_tile(height: int, width: int, lanes: int, registers: int
                          ) -> DepthwiseTile:
    """Rows and columns of output held in accumulators.

    Columns: the whole row where it fits two vectors (a 7-, 14- or 28-wide feature map is
    one partly filled vector or two), else the largest multiple of ``lanes`` up to four
    vectors that divides the row (112 = 7 x 16), else whole or half vectors (the largest
    power of two up to ``lanes`` dividing the row, 56 = 7 x 8), which LLVM loads and stores
    as one instruction each, else the largest divisor of the row below one vector. A 14-lane
    piece of a 56-wide row is split into 8 + 4 + 2 lanes per load: 144 x 56 x 56 ran 0.19 ms
    that way, 0.125 ms in half vectors (znver4, 1 thread).

    Rows: the largest divisor of ``height`` whose tile holds at most ``registers / 4`` vectors
    (8 of AVX-512's 32), or where that is a single accumulator (a 7-row map on AVX2), the
    smallest divisor above one that fits the register file. More rows share more input
    vectors between neighbouring rows, but the unrolled window keeps those vectors live too;
    past 8 accumulators the tile ran slower on every shape measured (14 rows of a 14-wide
    map: 0.089 ms against 0.062 with 7; 14 rows of 56 as half vectors: 0.148 against 0.125;
    znver4, 1 thread).
    """
    if width <= 2 * lanes:
        tw = width
    elif width % lanes == 0:
        tw = next(k * lanes for k in (4, 2, 1) if width % (k * lanes) == 0)
    else:
        pow2 = math.gcd(width, 1 << (lanes.bit_length() - 1))
        tw = pow2 if 2 * pow2 >= lanes else largest_divisor(width, lanes)
    vectors = -(-tw // lanes)
    budget = accumulator_budget(registers) - 2
    rows = [d for d in range(1, height + 1) if height % d == 0 and d * vectors <= budget]
    within = [d for d in rows if d * vectors <= registers // 4]
    th = max(within) if within and max(within) * vectors > 1 else min(
        (d for d in rows if d > 1), default=1)  # one accumulator: one dependent FMA chain
    return DepthwiseTile(th, tw, lanes)


def _deinterleaved_plane(sch: s_tir.Schedule, main, data) -> s_tir.SBlockRV | None:
    """The block writing the input plane a stride-2 convolution reads (the legalized zero-pad,
    which the contraction rule left materialized, else a copy of the input), its columns
    stored as ``(column % 2, column // 2)``: each window tap then reads even or odd columns
    as contiguous vectors. Returns it where its loops are left to :func:`order_parity_last`
    (None: an odd row, whose padded last column a second block writes, or a layout TVM
    refused; either is scheduled as any other pass)."""
    plane = next((b for b in sch.get_producers(main)
                  if sch.get(b).writes[0].source.same_as(data.source)), None)
    if plane is None:
        at = next(i for i, r in enumerate(sch.get(main).reads) if r.source.same_as(data.source))
        plane = sch.cache_read(main, at, "global")
    return plane if deinterleave_columns(sch, plane) else None


def deinterleave_columns(sch: s_tir.Schedule, plane) -> bool:
    """Store ``plane``'s output columns as ``(column % 2, column // 2)`` and, where the block
    has an even number of columns, iterate it in that order (its last two iter vars become
    the parity and the half-column; an odd count leaves a padded column no iteration writes).
    Returns whether it does."""
    shape = sch.get(plane).writes[0].source.shape
    ndim, width = len(shape), int(shape[-1])
    split = tirx.IndexMap.from_func(
        lambda *idx: (*idx[:-1], idx[-1] % 2, idx[-1] // 2), ndim=ndim)
    sch.transform_layout(plane, ("write", 0), split, pad_value=0.0)
    iters = sch.get(plane).iter_vars
    if int(iters[-1].dom.extent) != width or width % 2:
        return False  # an odd row, or a block that no longer iterates the source columns
    return _try(sch.transform_block_layout, plane, tirx.IndexMap.from_func(
        lambda *iv: (*iv[:-1], iv[-1] % 2, iv[-1] // 2), ndim=len(iters)))


def order_parity_last(sch: s_tir.Schedule, plane) -> list:
    """Loop a deinterleaved plane's block as ``half-column -> parity`` (unrolled), the
    half-column loop left scalar: LLVM's loop vectorizer then reads the source row as whole
    vectors and splits even from odd columns with shuffles (an interleave group). Vectorized
    in TIR either side is a gather or scatter of scalars: 96 x 112 x 112 ran 0.28 ms that way
    against 0.066 ms (znver4, 1 thread), and in the convolution's kernel it was 2/3 of the
    time. Returns the loops outside the two."""
    loops = sch.get_loops(plane)
    parity, half = loops[-2], loops[-1]
    sch.reorder(half, parity)
    sch.unroll(parity)
    return loops[:-2]


def unroll_short_row(sch: s_tir.Schedule, plane, lanes: int) -> None:
    """Unroll a deinterleaved plane's half-column loop where it has at most one vector of
    half-columns, the padded row (both halves) is a whole number of vectors, and the left pad
    is odd (:func:`order_parity_last` must have run).

    Inside the channel chain (``chain.py``), whose plane copies a buffer the kernel allocates
    itself, LLVM's loop vectorizer made the 8-iteration loop of a 14-wide row a
    ``vgatherqps`` / ``vscatterqps`` pair per 8 floats in AVX-512 code: 42% of the perf samples
    of a 64 -> 384 chain at 14 x 14, stride 2, which ran 0.71-0.78x its two kernels
    (``lab/chain_ab.py``; the standalone kernel, copying from a parameter, got shuffles).
    Unrolled, the SLP vectorizer loads the row as whole vectors and splits it with
    ``vpermps`` / ``vshufps``: the chain ran 1.33x (96 -> 576) and 1.49x (64 -> 384) faster
    (znver4, 1 thread, one process; ``lab/chain_unroll_ab.py``). AVX2 has no scatter: there
    it measured the same either way (0.98-1.00x).

    The gather comes with an odd left pad (a 3x3 window), where even half-columns copy odd
    source columns. With an even pad (a 5x5 window) parity maps to parity: the loop vectorizer
    shuffles, and the unrolled row stays scalar (``vmovss``): 40 -> 240 channels at 28 x 28,
    5 x 5, stride 2 ran 0.51 ms unrolled against 0.33 ms as a loop (12 x 12: 0.076 against
    0.063; znver4, 1 thread). So only an odd pad is unrolled."""
    half = sch.get_loops(plane)[-2]
    extent = int(sch.get(half).extent)
    if (2 * extent) % lanes == 0 and extent <= lanes and _odd_left_pad(sch.get(plane)):
        sch.unroll(half)


def _odd_left_pad(plane: tirx.SBlock) -> bool:
    """Whether a deinterleaved plane's even half-columns read odd columns of its source (the
    read whose column index moves with the parity): that index at parity 0 is odd for every
    half-column (the row's pad is odd; an image row
    merged with its rows keeps that parity, being of even width where it is deinterleaved)."""
    parity = plane.iter_vars[-2]
    source = next((r for r in plane.reads if uses(r.region[-1].min, parity.var)), None)
    if source is None:
        return False
    analyzer = Analyzer()
    analyzer.bind(parity.var, ir.Range.from_min_extent(parity.dom.min, 1))
    index = analyzer.modular_set(source.region[-1].min)
    return index.coeff % 2 == 0 and index.base % 2 == 1


def vectorize_last(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Vectorize ``block``'s innermost loop (whole vectors and a tail where it is long)."""
    loops = sch.get_loops(block)
    ext = int(sch.get(loops[-1]).extent)
    if ext > 1:
        if ext > 4 * lanes and ext % lanes:
            loops = [*loops[:-1], *sch.split(loops[-1], factors=[None, lanes])]
        _try(sch.vectorize, loops[-1])


def finish_tile(sch: s_tir.Schedule, main, reduce_loop, writeback, lanes: int):
    """The tile's accumulators initialized above ``reduce_loop`` and written back by
    ``writeback``, each with its rows unrolled and its row vectorized (whole vectors and a
    tail); the init block. Rolled rows in the write-back made a SiLU epilogue on 28-wide rows
    1.8x slower (the channel chain's 40 -> 240 channels, 5 x 5 at 28 x 28, znver4)."""
    init = sch.decompose_reduction(main, reduce_loop)
    for blk in (init, writeback):
        rows = sch.get_loops(blk)[-2]
        if int(sch.get(rows).extent) > 1:
            sch.unroll(rows)
        vectorize_last(sch, blk, lanes)
    return init


def schedule(sch: s_tir.Schedule, name: str, shape: DepthwiseShape, target
             ) -> s_tir.Schedule | None:
    """Schedule the depthwise block ``name`` (module docstring). Raises a ScheduleError where
    TVM rejects a step; the caller runs this on a copy."""
    main = sch.get_sblock(name)
    read = read_bytes(sch, main)  # before the deinterleaved plane: what the model prices
    stmt = sch.get(main)
    extents = {iv.var: int(iv.dom.extent) for iv in stmt.iter_vars}
    lanes = vector_lanes(target, str(stmt.writes[0].source.dtype))
    tile = choose_depthwise_tile(extents[shape.height], extents[shape.width], lanes,
                                 vector_registers(target))
    plane = _deinterleaved_plane(sch, main, shape.data) if shape.cols[1] == 2 else None
    loops = split_loops(sch, main, shape.width, shape.height)
    if loops is None:
        return None
    spatial, reduce_loops, width_loop, height_loop = loops
    if width_loop is None or height_loop is None or len(reduce_loops) != 2 or not spatial:
        return None
    ho, hi = sch.split(height_loop, factors=[None, tile.height])
    wo, wi = sch.split(width_loop, factors=[None, tile.width])
    sch.reorder(*spatial, ho, wo, *reduce_loops, hi, wi)
    parallelize(sch, spatial, int(contraction_parallel(math.prod(extents.values()), read)), 1)

    writeback = sch.cache_write(main, 0, "local")
    inline_epilogue(sch, writeback)  # else a separate, generic pass
    sch.reverse_compute_at(writeback, wo, preserve_unit_loops=True)
    for lp in (*reduce_loops, hi):
        if int(sch.get(lp).extent) > 1:
            sch.unroll(lp)
    sch.vectorize(wi)  # before decompose: the update block alone is no reduction
    init = finish_tile(sch, main, reduce_loops[0], writeback, lanes)
    done = {sch.get(b).name_hint for b in (main, init, writeback)}
    if plane is not None:  # its own streamed pass
        outer = order_parity_last(sch, plane)
        elements = math.prod(int(d) for d in sch.get(plane).writes[0].source.shape)
        parallelize(sch, outer, elements)  # the threshold is in elements
        done.add(sch.get(plane).name_hint)
    schedule_rest(sch, target, done)
    _log.debug("%s: depthwise %d x %d tile", name, tile.height, tile.width)
    return sch
