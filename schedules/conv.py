"""Direct convolution micro-kernel: NCHW / NCW conv (windowed, strided, grouped) vectorized
over output channels.

The general contraction tiling vectorizes the output's last axis (the image row): a 3x3 window
then reads unaligned, strided input vectors, a 7-wide row fills half a register, and a stride
gathers. Here, as in oneDNN's and TVM's old ``conv2d_avx_common``, a block

``C[n, f, y, x] += P[n, g(f) + rc, y * s + ry, x * s + rx] * W[f, rc, ry, rx]``

is scheduled as

``parallel(n, f tile, y tile, x tile) -> rc, ry, rx -> y, x (unrolled) -> f (vectorized)``

with a ``rows x vectors`` accumulator tile (:func:`choose_conv_tile`, sized from the target's
vector registers like ``gemm.choose_tile``): per reduction step one broadcast input scalar per
output pixel of the tile, one weight vector per output-channel vector, ``rows * vectors`` FMAs.
Input stays NCHW (any stride or dilation is only an address); the constant weight is packed at
compile time into ``(F / cols, IC, KH, KW, cols)`` panels (``prepack.pack_leading_operand``),
a non-constant one per call. The tile goes back to NCHW through the fused epilogue (bias, BN,
activation, residual) computed on vectors of channels; those stores are strided, but number
``1 / (IC * KH * KW)`` of the FMAs.

Grouped convolutions fit when a vector of output channels stays in one group (``cols``
divides the channels per group); depthwise convolutions get ``depthwise.py``'s kernel, and
narrower groups keep the general tiling.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from tvm import s_tir, tirx

from ._common import inline_epilogue, largest_divisor, vector_lanes, vector_registers
from ._loops import read_bytes, schedule_rest, split_loops, tile_and_parallelize
from .conv_shape import ConvShape, analyze
from .gemm_tile import FMA_LATENCY, LOADS_PER_CYCLE, VECTOR_COUNTS, accumulator_budget
from .prepack import layout_free, pack_leading_operand

__all__ = ["ConvShape", "ConvTile", "analyze", "choose_conv_tile", "schedule"]

_log = logging.getLogger(__name__)

# A vector of output channels filled less than this keeps the general tiling along the image
# row instead (ResNeXt's 4 channels per group would fill a quarter of an AVX-512 register).
_MIN_LANE_SHARE = 0.5


@dataclass(frozen=True)
class ConvTile:
    """``height x width`` output pixels by ``vectors`` registers of ``lanes`` channels."""

    height: int
    width: int
    vectors: int
    lanes: int

    @property
    def cols(self) -> int:
        return self.vectors * self.lanes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _partial_vector(per_group: int, lanes: int) -> int:
    """Lanes of a channel vector when ``lanes`` does not divide the channels per group: half
    a vector where that divides them (24, 40, 72 or 120 channels in 8-lane vectors on
    AVX-512), which LLVM loads, stores and multiplies as one instruction; else the largest
    divisor below a vector. A 12- or 10-lane vector is split 8 + 4 (+ 2) per operation:
    40 -> 40 3x3 at 56 x 56 ran 1.34 ms in 10 lanes, 0.87 ms in 8 (znver4, 1 thread; 24 -> 24
    at 112 x 112: 1.68 ms in 12 lanes, 1.33 in 8; docs/log/2026-12-06b.md)."""
    half = math.gcd(per_group, 1 << (lanes.bit_length() - 1))
    return half if 2 * half >= lanes else largest_divisor(per_group, lanes)


def choose_conv_tile(channels: int, per_group: int, height: int, width: int, lanes: int,
                     registers: int, window: tuple[int, int, int] = (1, 1, 1)
                     ) -> ConvTile | None:
    """The tile with the least estimated time per reduction step over the whole output.

    Channel vectors divide the channels per group (a partly filled vector where ``lanes`` does
    not); several image rows go in one tile only when it holds whole rows. A width the tile
    does not divide (a prime 17 or 73) leaves a last tile guarded per pixel: the guard tests a
    value fixed for the whole reduction, never the vectorized channels, and costs the padded
    pixels' share. Per step a tile issues ``pixels * vectors`` FMAs (2 per cycle),
    ``pixels + vectors`` loads (broadcasts and weight vectors) and waits at least one FMA
    latency; ties go to exact tiles, then more accumulators. The tile leaves the registers a
    step's operands need (:func:`_operand_registers`: the inputs overlapping windows share,
    unless that leaves too few accumulators to hide the FMA latency; then some inputs are
    reloaded from the stack, measured faster: wav2vec2's k10/s5 conv, 7 x 2 vectors at 25
    GFLOP/s against 2 x 4 at 5). None where a channel vector would be too narrow.
    """
    lane_fill = lanes if per_group % lanes == 0 else _partial_vector(per_group, lanes)
    if lane_fill < _MIN_LANE_SHARE * lanes:
        return None
    budget = accumulator_budget(registers)
    for counted in (window, None):
        best, best_key = None, None
        for vectors in VECTOR_COUNTS if lane_fill == lanes else (1,):
            if per_group % (vectors * lane_fill):
                continue
            for tw in range(1, min(width, budget // vectors) + 1):
                for th in _divisors(height) if tw == width else (1,):
                    fmas = th * tw * vectors
                    if fmas > budget or fmas + _operand_registers(
                            th, tw, vectors, counted) > registers:
                        continue
                    step = max(fmas / 2, (th * tw + vectors) / LOADS_PER_CYCLE, FMA_LATENCY)
                    tiles = (channels // (vectors * lane_fill)) * (height // th) \
                        * -(-width // tw)
                    key = (tiles * step, width % tw != 0, -fmas, -vectors)
                    if best_key is None or key < best_key:
                        best, best_key = ConvTile(th, tw, vectors, lane_fill), key
        if best is not None and (counted is None or best.height * best.width * best.vectors
                                 >= 2 * FMA_LATENCY):
            return best  # a tile too small to hide the FMA latency: reloads cost less
    return best


def _operand_registers(th: int, tw: int, vectors: int, window: tuple[int, int, int] | None
                       ) -> int:
    """Vector registers a reduction step needs beside the accumulators.

    LLVM unrolls the innermost (window) loop and shares each broadcast input value among the
    pixels whose windows overlap, so a step holds the row's distinct inputs,
    ``(tw - 1) * stride + (taps - 1) * dilation + 1`` of them, beside the weight vectors and
    two temporaries; without overlap a broadcast dies at its FMAs (``window`` None: not
    counted, for windows so wide that no tile fits them: 16 taps in 16 SSE registers). Measured on AVX-512: 9
    pixels x 2 vectors of a 3-wide window (18 accumulators + 2 + 11 = 31 registers) spilled,
    8 x 2 (30 with the temporaries) did not.
    """
    if window is None or (window[0] - 1) * window[2] < window[1]:
        return vectors + 3  # windows do not overlap (or are not counted): inputs die at once
    taps, stride, dilation = window
    inputs = min(th * tw * taps, th * ((tw - 1) * stride + (taps - 1) * dilation + 1))
    return vectors + inputs + 2


def _pack_weight_per_call(sch: s_tir.Schedule, main, buffer, cols: int) -> None:
    """A non-constant weight copied into ``(F / cols, ..., cols)`` panels inside the kernel:
    ``F * IC * KH * KW`` elements against that many times the output pixels in FMAs."""
    at = next(i for i, r in enumerate(sch.get(main).reads) if r.source.same_as(buffer))
    copy = sch.cache_read(main, at, "global")
    sch.transform_layout(copy, ("write", 0), tirx.IndexMap.from_func(
        lambda *idx: (idx[0] // cols, *idx[1:], idx[0] % cols), ndim=len(buffer.shape)))


def _channel_last(ndim: int, pos: int) -> tirx.IndexMap:
    """IndexMap moving axis ``pos`` last: the accumulator tile's layout, so the vectorized
    channel axis is contiguous in the registers it lives in."""
    return tirx.IndexMap.from_func(
        lambda *idx: (*idx[:pos], *idx[pos + 1:], idx[pos]), ndim=ndim)


def schedule(sch: s_tir.Schedule, name: str, shape: ConvShape, target) -> s_tir.Schedule | None:
    """Tile and pack the convolution block ``name`` (module docstring); None where no tile
    fits (the caller keeps its general tiling). Raises a ScheduleError where TVM rejects a
    step; the caller runs this on a copy."""
    main = sch.get_sblock(name)
    read = read_bytes(sch, main)  # before the weight's packed copy: what the model prices
    stmt = sch.get(main)
    extents = {iv.var: int(iv.dom.extent) for iv in stmt.iter_vars}
    lanes = vector_lanes(target, str(stmt.writes[0].source.dtype))
    height = extents[shape.height] if shape.height is not None else 1
    tile = choose_conv_tile(extents[shape.channel], shape.per_group, height,
                            extents[shape.width], lanes, vector_registers(target), shape.window)
    if tile is None:
        return None
    buffer = shape.weight.source
    if any(p.same_as(buffer) for p in layout_free(sch)):
        if not pack_leading_operand(sch, main, buffer, tile.cols):
            return None  # a constant read elsewhere too: its gathers would not pay
    else:
        _pack_weight_per_call(sch, main, buffer, tile.cols)
    main = sch.get_sblock(name)

    loops = split_loops(sch, main, shape.channel, shape.width)
    if loops is None:
        return None
    spatial, reduce_loops, channel_loop, width_loop = loops
    if channel_loop is None or width_loop is None or not reduce_loops:
        return None
    height_loop = None
    if shape.height is not None:
        height_loop = split_loops(sch, main, shape.channel, shape.height)[3]
        if height_loop is None:
            return None
        spatial = [lp for lp in spatial if not sch.get(lp).same_as(sch.get(height_loop))]
    fo, fi = sch.split(channel_loop, factors=[None, tile.cols])
    wo, wi = sch.split(width_loop, factors=[None, tile.width])
    outer, inner = [fo], [wi, fi]
    if height_loop is not None:
        ho, hi = sch.split(height_loop, factors=[None, tile.height])
        outer, inner = [fo, ho], [hi, wi, fi]
    order = [*spatial, *outer, wo]
    tile_loop = tile_and_parallelize(sch, order, reduce_loops, inner, read)

    writeback = sch.cache_write(main, 0, "local")
    ndim = len(stmt.writes[0].source.shape)
    pos = next(i for i, x in enumerate(sch.get(main).body.indices)
               if isinstance(x, tirx.Var) and x.same_as(shape.channel))
    sch.transform_layout(main, ("write", 0), _channel_last(ndim, pos))
    inline_epilogue(sch, writeback)  # else a separate, generic pass
    sch.reverse_compute_at(writeback, tile_loop, preserve_unit_loops=True)
    for lp in inner[:-1]:
        if int(sch.get(lp).extent) > 1:
            sch.unroll(lp)
    sch.vectorize(inner[-1])  # before decompose: the update block alone is no reduction
    init = sch.decompose_reduction(main, reduce_loops[0])
    # write-back: one loop per output dim, channels moved innermost (vectors of channels
    # through the epilogue), the pixel loops unrolled so the tile stays in registers
    wb_loops = list(sch.get_loops(writeback))[-ndim:]
    wb_loops.append(wb_loops.pop(pos))
    sch.reorder(*wb_loops)
    for blk_loops in (list(sch.get_loops(init))[-len(inner):], wb_loops):
        for lp in blk_loops[:-1]:
            if int(sch.get(lp).extent) > 1:
                sch.unroll(lp)
        if int(sch.get(blk_loops[-1]).extent) > 1:
            sch.vectorize(blk_loops[-1])
    done = {sch.get(b).name_hint for b in (main, init, writeback)}
    schedule_rest(sch, target, done)
    _log.debug("%s: %d x %d pixels x %d x %d channels", name, tile.height, tile.width,
               tile.vectors, tile.lanes)
    return sch

