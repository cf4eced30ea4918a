"""Depthwise convolution kernel on channels-last images (NHWC): vectorized over channels.

``C[n, y, x, c] += P[n, y * s + ry * d, x * s + rx * d, c] * W[c, ry, rx]`` (the weight's other
indices constant). The lanes are channels, so every output vector is ``KH * KW`` FMAs of whole
input vectors and weight vectors, whatever the image's width or the stride: the NCHW kernel
(``depthwise.py``) vectorizes along the image row, where a 7- or 14-wide row leaves lanes idle
and stride 2 must deinterleave the input plane first. This kernel ran 2.0-5.9x the NCHW
kernel on 15 corpus shapes, each with its bias and ReLU6 (1 thread, rocketlake,
``lab/layout_kernels.py``). This is the layout XNNPACK runs mobile
CNNs in; ``layouts.py`` decides where a model runs channels-last.

``parallel(n, row tiles) -> column tile -> channel tile -> ry, rx (unrolled) -> rows, columns
(unrolled) -> channels (vectorized)``: a ``rows x columns`` tile of one channel vector each in
accumulators, the epilogue computed on them before the one store. The zero pad is read in
place (its condition in the window's loads), the row and column tile loops partitioned so that
only the border tiles test it: as a streamed pass of its own the pad copies the whole input
again (a one-off A/B while building this measured that 2.25x slower over 15 shapes; the
script was not kept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize

from ._common import (
    contraction_parallel,
    inline_epilogue,
    largest_divisor,
    uses,
    vector_lanes,
)
from ._loops import PARTITION_HINT, parallelize, read_bytes, schedule_rest
from .depthwise import MAX_TAPS, axis_window, is_var, window_block
from .math_calls import short_name

__all__ = ["ChannelsLastShape", "analyze", "channel_tile", "schedule", "spatial_tile"]

# Accumulator vectors of the tile: a quarter of AVX-512's registers, as the NCHW kernel's
# (``depthwise.choose_depthwise_tile``); the input vectors the unrolled window shares stay live
# beside them. The 2 x 4 tile it gives a 56-wide map is the one measured (other tiles not yet).
_TILE_VECTORS = 8


@dataclass(frozen=True)
class ChannelsLastShape:
    """The block vars of a channels-last depthwise convolution and its window per axis."""

    channel: tirx.Var
    width: tirx.Var
    height: tirx.Var
    data: ir.TensorLoad
    weight: ir.TensorLoad
    rows: tuple[int, int, int]  # (taps, stride, dilation) along the height
    cols: tuple[int, int, int]  # the same along the width
    window: tuple[tirx.Var, tirx.Var]  # the reduce vars of the rows and of the columns


def analyze(block: s_tir.SBlock, store, lhs, rhs) -> ChannelsLastShape | None:
    """Roles for ``store = store + lhs * rhs`` when it is an NHWC depthwise convolution with
    multiplier 1 (the input's last index is the output's channel var, the weight is indexed by
    that var and the two window vars, its other indices constant); None otherwise."""
    found = window_block(block, store)
    if found is None:
        return None
    out, extents, reduce = found
    height, width, channel = out[1], out[2], out[3]
    for weight, data in ((lhs, rhs), (rhs, lhs)):
        w, d = list(weight.indices), list(data.indices)
        if len(d) != 4 or not is_var(d[3], channel):
            continue
        named = [i for i in w if not isinstance(i, tirx.IntImm)]
        if len(named) != 3 or not all(isinstance(i, tirx.Var) for i in named):
            continue
        if not (is_var(d[0], out[0]) if isinstance(out[0], tirx.Var) else
                isinstance(d[0], tirx.IntImm) and int(d[0]) == int(out[0])):
            continue  # the batch
        # the window var of each image axis is the reduce var its data index moves with
        by_axis = [next((r for r in reduce if uses(d[axis], r)), None) for axis in (1, 2)]
        if None in by_axis or by_axis[0].same_as(by_axis[1]):
            return None
        if not all(any(v.same_as(u) for u in named) for v in (channel, *by_axis)):
            continue  # the weight must be indexed by the channel and both window vars
        rows = axis_window(d[1], height, by_axis[0], extents)
        cols = axis_window(d[2], width, by_axis[1], extents)
        if rows is None or cols is None or rows[0] * cols[0] > MAX_TAPS:
            return None
        if weight.source.same_as(store.buffer) or data.source.same_as(store.buffer):
            return None
        return ChannelsLastShape(channel, width, height, data, weight, rows, cols,
                                 tuple(by_axis))
    return None


def channel_tile(channels: int, lanes: int) -> int:
    """Channels per accumulator vector: a whole vector where it divides the channels, else
    the largest power of two that does (72 channels: 8, half an AVX-512 vector; LLVM loads
    and stores it as one instruction), at least one."""
    if channels % lanes == 0:
        return lanes
    return math.gcd(channels, 1 << (lanes.bit_length() - 1))


def spatial_tile(height: int, width: int) -> tuple[int, int]:
    """(rows, columns) of output in accumulators: columns the largest divisor of the row up
    to 4, rows the largest divisor of the height that keeps the tile within
    ``_TILE_VECTORS`` vectors (a 7-wide row: 1 x 7)."""
    cols = largest_divisor(width, 4)
    if cols < 3:  # no divisor of 3 or 4 (7, 14, 17): the largest divisor up to 8 columns
        cols = largest_divisor(width, _TILE_VECTORS)
    rows = largest_divisor(height, max(1, _TILE_VECTORS // cols))
    return rows, cols


def _zero_pad(block: s_tir.SBlock) -> bool:
    """Whether ``block`` stores ``if_then_else(inside, source[...], constant)``: the legalized
    zero pad (a producer that computes or moves data stays a pass of its own: inlined, it
    would run once per window tap)."""
    value = getattr(block.body, "value", None)
    op = getattr(value, "op", None)
    if op is None or short_name(getattr(op, "name", "")) != "if_then_else":
        return False
    return (isinstance(value.args[1], ir.TensorLoad)
            and isinstance(value.args[2], tirx.FloatImm | tirx.IntImm))


def _loops_by_var(sch: s_tir.Schedule, block) -> dict | None:
    """{block var: loop} where every loop binds one var trivially; None otherwise."""
    stmt = sch.get(block)
    realize = get_sblockrealize(sch, block)
    by_loop = {}
    for iv, value in zip(stmt.iter_vars, realize.iter_values):
        if not isinstance(value, tirx.Var):
            return None
        by_loop[value] = iv.var
    out = {}
    for loop in sch.get_loops(block):
        var = by_loop.get(sch.get(loop).loop_var)
        if var is None:
            return None
        out[var] = loop
    return out


def schedule(sch: s_tir.Schedule, name: str, shape: ChannelsLastShape, target
             ) -> s_tir.Schedule | None:
    """Schedule the depthwise block ``name`` (module docstring). Raises a ScheduleError where
    TVM rejects a step; the caller runs this on a copy."""
    main = sch.get_sblock(name)
    read = read_bytes(sch, main)
    for producer in sch.get_producers(main):  # the zero pad, read in place (module doc)
        if sch.get(producer).writes[0].source.same_as(shape.data.source) \
                and _zero_pad(sch.get(producer)):
            sch.compute_inline(producer)
    stmt = sch.get(main)
    extents = {iv.var: int(iv.dom.extent) for iv in stmt.iter_vars}
    lanes = vector_lanes(target, str(stmt.writes[0].source.dtype))
    loops = _loops_by_var(sch, main)
    if loops is None:
        return None
    batch = [loops[iv.var] for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar
             and not any(iv.var.same_as(v) for v in (shape.height, shape.width, shape.channel))]
    rows, cols = spatial_tile(extents[shape.height], extents[shape.width])
    ct = channel_tile(extents[shape.channel], lanes)
    yo, yi = sch.split(loops[shape.height], factors=[None, rows])
    xo, xi = sch.split(loops[shape.width], factors=[None, cols])
    co, ci = sch.split(loops[shape.channel], factors=[None, ct])
    ry, rx = loops[shape.window[0]], loops[shape.window[1]]
    sch.reorder(*batch, yo, xo, co, ry, rx, yi, xi, ci)
    rows_loop = parallelize(sch, [*batch, yo],
                            int(contraction_parallel(math.prod(extents.values()), read)), 1)
    sch.annotate(xo, PARTITION_HINT, 1)  # the border tiles peeled off the unguarded ones
    sch.annotate(rows_loop, PARTITION_HINT, 1)
    writeback = sch.cache_write(main, 0, "local")
    inline_epilogue(sch, writeback)
    sch.reverse_compute_at(writeback, co, preserve_unit_loops=True)
    for lp in (ry, rx, yi, xi):
        if int(sch.get(lp).extent) > 1:
            sch.unroll(lp)
    sch.vectorize(ci)  # before decompose: the update block alone is no reduction
    init = sch.decompose_reduction(main, ry)
    for blk in (init, writeback):
        blk_loops = sch.get_loops(blk)
        for lp in blk_loops[-3:-1]:
            if int(sch.get(lp).extent) > 1:
                sch.unroll(lp)
        sch.vectorize(blk_loops[-1])
    done = {sch.get(b).name_hint for b in (main, init, writeback)}
    schedule_rest(sch, target, done)
    return sch
