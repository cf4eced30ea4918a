"""Channel chain: a 1x1 convolution feeding a depthwise convolution, in one kernel tiled over
channels (the inverted-residual block's expand -> depthwise pair).

FuseOps never puts two contractions in one kernel, so the expanded tensor between them (C_mid x
H x W, several MB in a MobileNet's early blocks, more than a core's L2) is written by one kernel
and read back by the next, which pads (and, at stride 2, deinterleaves) it in a pass of its own.
The pair is per-channel consistent: depthwise channel ``c`` reads expanded channel ``c`` only,
so tiled over blocks of ``CB`` channels it needs no halo and recomputes nothing:

``parallel(channel block) -> [1x1 conv of CB channels over all pixels, vectorized along the
pixels] -> [its epilogue written into the padded plane of those CB channels] -> [depthwise
kernel on them]``

- the 1x1 conv is a GEMM ``E[f, p] = sum_c W[f, c] X[c, p]`` with the ``h * w`` pixels merged
  into one column axis (``columns.py``; merged in the block and the buffer, else a register tile
  crossing an image row gets an inexact region and a wrong result); its tile is ``CB`` channels
  by a few vectors of pixels, one broadcast weight per channel and step;
- the expanded plane of a block (``CB x (H + pad) x (W + pad)``, deinterleaved at stride 2 as
  ``depthwise.py`` reads it) lives per thread, in L1/L2, not in memory;
- the depthwise part is ``depthwise.py``'s tile, its epilogue inlined into the write-back.

What it costs: the input ``X`` is read once per channel block (``C_mid / CB`` times) instead of
once; it stays in L2 while ``X`` fits there. Whether the pair pays is the cost model's question
(``CHAIN_CARD``); the rule only builds it.
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from . import columns, depthwise
from ._common import (
    covers_output,
    inline_epilogue,
    inline_spatial,
    is_spatial,
    largest_divisor,
    root_blocks,
    vector_lanes,
    vector_registers,
)
from ._loops import PARTITION_HINT, SafeRule, split_loops
from .card import Card
from .classes import ScheduleClass
from .contraction import contraction_operands
from .efficiency import E_PATH, K0_GEMM, lane_fill
from .gemm_tile import FMA_LATENCY, LOADS_PER_CYCLE, accumulator_budget
from .reduction import reciprocal_divisions

__all__ = ["CHAIN_CARD", "ChannelChain"]

# Channels per block: the broadcast weights of one tile step (8 of AVX-512's 32 registers);
# the expanded channels of a MobileNet block (96-1152) still give 12+ blocks to share out.
_MAX_CHANNELS = 8


def _var(x) -> tirx.Var | None:
    return x if isinstance(x, tirx.Var) else None


def _pointwise(block: tirx.SBlock):
    """``(X, W)`` loads of ``E[.., f, h, w] += X[.., c, h, w] * W[f, c, ..]`` (a 1x1 NCHW
    convolution after ``normalize_prim_func``: one reduction var, the pixels plain vars in both
    the output and ``X``); None otherwise."""
    operands = contraction_operands(block)
    if operands is None:
        return None
    store, lhs, rhs = operands
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    out = [_var(i) for i in store.indices]
    if len(reduce) != 1 or len(out) < 3 or any(v is None for v in out[-3:]):
        return None
    f, h, w = out[-3:]
    for data, weight in ((lhs, rhs), (rhs, lhs)):
        d = [_var(i) for i in data.indices]
        if len(d) != len(out) or not all(
                x is not None and x.same_as(y) for x, y in zip(d[-3:], (reduce[0], h, w))):
            continue
        used = [_var(i) for i in weight.indices]
        if (any(v is not None and (v.same_as(h) or v.same_as(w)) for v in used)
                or not any(v is not None and v.same_as(f) for v in used)):
            continue
        return data, weight
    return None


def _reads_channelwise(plane: tirx.SBlock, buffer) -> bool:
    """Whether every load of ``buffer`` in ``plane`` reads at ``plane``'s own batch and channel
    (the leading output indices, plain vars): then depthwise channel ``c`` needs expanded
    channel ``c`` of the same image, and no block of channels reads another's."""
    store = plane.body
    if not isinstance(store, tirx.BufferStore) or len(store.indices) < 3:
        return False
    lead = list(store.indices[:-2])
    if _var(lead[-1]) is None:
        return False  # the channel index is no plain var

    def same(index, own) -> bool:  # one var, or one constant (a unit batch bound to 0)
        if isinstance(own, tirx.IntImm):
            return isinstance(index, tirx.IntImm) and int(index) == int(own)
        return isinstance(index, tirx.Var) and index.same_as(own)

    loads: list = []
    tvm_ffi.structural_walk(store.value, (ir.TensorLoad, loads.append), order="post")
    mine = [ld for ld in loads if ld.source.same_as(buffer)]
    return bool(mine) and all(
        len(ld.indices) == len(store.indices)
        and all(same(i, own) for i, own in zip(ld.indices, lead)) for ld in mine)


def _channels_block(channels: int) -> int:
    return largest_divisor(channels, _MAX_CHANNELS)


def schedule(sch: s_tir.Schedule, target) -> s_tir.Schedule | None:
    """The chain's schedule (module docstring); None where the function is not such a chain."""
    if normalize_prim_func(sch) is None:
        return None
    reductions = [b for b in root_blocks(sch) if not is_spatial(sch.get(b))]
    if len(reductions) != 2:
        return None
    pw, dw = reductions
    pw_name, dw_name = sch.get(pw).name_hint, sch.get(dw).name_hint
    roles = _pointwise(sch.get(pw))
    operands = contraction_operands(sch.get(dw))
    shape = depthwise.analyze(sch.get(dw), *operands) if operands else None
    if roles is None or shape is None or max(shape.rows[1], shape.cols[1]) not in (1, 2):
        return None  # the card's stride is the larger of the two
    expanded = sch.get(pw).writes[0].source
    columns.inline_copy(sch, pw, roles[0].source)  # the zero-width pad of a 1x1 conv
    if sch.get_producers(pw):
        return None  # the input is computed in the group: it would be recomputed per block
    # the block writing the plane the depthwise conv reads (its zero-pad) stays a copy; what
    # lies between it and the 1x1 conv becomes one elementwise block, computed in the 1x1
    # conv's write-back (vectorized math there; inside the padded copy an exp stayed scalar:
    # 16 -> 96 channels at 112 x 112 with SiLU ran 8.5 ms against 1.9 ms with ReLU6)
    plane = next((b for b in sch.get_producers(dw)
                  if sch.get(b).writes[0].source.same_as(shape.data.source)), None)
    if plane is None or not is_spatial(sch.get(plane)):
        return None
    plane_name = sch.get(plane).name_hint
    inline_spatial(sch, protect={pw_name, dw_name, plane_name})
    pw, dw, plane = (sch.get_sblock(n) for n in (pw_name, dw_name, plane_name))
    between = None
    feeding = sch.get_producers(plane)
    if len(feeding) != 1:
        return None
    if sch.get(feeding[0]).name_hint != pw_name:
        between = feeding[0]
        if ([sch.get(p).name_hint for p in sch.get_producers(between)] != [pw_name]
                or len(sch.get_consumers(between)) != 1
                or not covers_output(sch.get(between), sch.get(pw))
                or not _reads_channelwise(sch.get(between), expanded)):
            return None  # computed in the 1x1 conv's write-back: one point per point
    source = sch.get(between).writes[0].source if between is not None else expanded
    if len(sch.get_consumers(pw)) != 1 or not _reads_channelwise(sch.get(plane), source):
        return None  # the expanded tensor is also an output, or read across channels
    if len(sch.get_consumers(dw)) > 1:
        return None
    known = {pw_name, dw_name, plane_name} | (
        {sch.get(between).name_hint} if between is not None else set())
    rest = [sch.get(b).name_hint for b in root_blocks(sch) if sch.get(b).name_hint not in known]
    after = [sch.get(b).name_hint for b in sch.get_consumers(dw)]
    if len(rest) > 1 or rest and after != rest:
        return None  # anything but one epilogue would be left an unscheduled nest

    lanes = vector_lanes(target, str(expanded.dtype))
    registers = vector_registers(target)
    width = int(sch.get(pw).writes[0].source.shape[-1])
    if columns.merge_block(sch, pw, width) is None:
        return None
    columns.merge_buffer(sch, pw, width)
    if between is not None:
        between_name = sch.get(between).name_hint
        if columns.merge_block(sch, between, width) is None:
            return None
        columns.merge_buffer(sch, sch.get_sblock(between_name), width)
        between = sch.get_sblock(between_name)
    pw = sch.get_sblock(pw_name)
    dw = sch.get_sblock(dw_name)
    plane = sch.get_sblock(plane_name)
    deinterleaved = shape.cols[1] == 2 and int(shape.data.source.shape[-1]) % 2 == 0
    if deinterleaved:
        # an odd plane would need a pad column, written by a second block, and a plane with
        # two writers cannot move into the channel loop: it keeps its rows (strided reads)
        if not depthwise.deinterleave_columns(sch, plane):
            return None  # a layout TVM refused: the pair stays two kernels
        plane = sch.get_sblock(plane_name)

    # the depthwise tile, the channel loop split into blocks that run in parallel
    stmt = sch.get(dw)
    extents = {iv.var: int(iv.dom.extent) for iv in stmt.iter_vars}
    channels = extents[shape.channel]
    block = _channels_block(channels)
    tile = depthwise.choose_depthwise_tile(extents[shape.height], extents[shape.width], lanes,
                                           registers)
    loops = split_loops(sch, dw, shape.width, shape.height)
    by_channel = split_loops(sch, dw, shape.channel, None)
    if loops is None or by_channel is None or by_channel[2] is None:
        return None
    spatial, reduce_loops, width_loop, height_loop = loops
    channel_loop = by_channel[2]
    outer = [lp for lp in spatial if not sch.get(lp).same_as(sch.get(channel_loop))]
    if width_loop is None or height_loop is None or len(reduce_loops) != 2:
        return None
    co, ci = sch.split(channel_loop, factors=[None, block])
    ho, hi = sch.split(height_loop, factors=[None, tile.height])
    wo, wi = sch.split(width_loop, factors=[None, tile.width])
    sch.reorder(*outer, co, ci, ho, wo, *reduce_loops, hi, wi)
    par = sch.fuse(*outer, co) if outer else co
    sch.parallel(par)
    writeback = sch.cache_write(dw, 0, "local")
    if sch.get_consumers(writeback) and not inline_epilogue(sch, writeback):
        return None  # an epilogue left as a pass of its own would run unscheduled
    sch.reverse_compute_at(writeback, wo, preserve_unit_loops=True)
    for lp in (*reduce_loops, hi):
        if int(sch.get(lp).extent) > 1:
            sch.unroll(lp)
    sch.vectorize(wi)
    depthwise.finish_tile(sch, dw, reduce_loops[0], writeback, lanes)

    # the padded plane and the 1x1 conv, per channel block
    sch.compute_at(plane, par)
    if between is not None:
        sch.compute_at(between, par)
    sch.compute_at(pw, par, preserve_unit_loops=True)
    if deinterleaved:
        depthwise.order_parity_last(sch, plane)
        depthwise.unroll_short_row(sch, plane, lanes)
    else:
        depthwise.vectorize_last(sch, plane, lanes)  # whole vectors and a tail on a long row
    return _pointwise_tile(sch, pw, between, par, block, lanes, registers)


def pixel_vectors(pixels: int, block: int, lanes: int, registers: int) -> int:
    """Vectors of merged pixels in the 1x1 conv's tile: as many as the accumulators hold next
    to ``block`` channels, at most four, no more than the image fills."""
    return max(1, min(4, accumulator_budget(registers) // block, -(-pixels // lanes)))


def _pointwise_share(work, lanes: int, registers: int) -> float | None:
    """The 1x1 conv's share of peak in the chain's tile (None for the depthwise conv: its
    standalone tile): the tile's FMAs against its loads (``block`` broadcast weights and the
    pixel vectors per step) and the FMA latency, times the GEMM path's best case and its
    init / write-back term, times the share of its vectors' lanes the image's pixels fill: the
    last vector of an image runs whole. At 7 x 7 on 16 lanes the 49 pixels take three vectors
    and a one-pixel tail; those pairs ran 0.68-0.90x their two kernels in-model, which the tile
    term alone prices even (``lab/chain_price.py``, docs/log/2026-12-06g.md)."""
    g = work.geometry
    if g is None or g.depthwise is not None or g.gemm is None:
        return None
    block = _channels_block(g.gemm.m)
    pixels = g.gemm.n * (g.gemm.height or 1)
    vectors = pixel_vectors(pixels, block, lanes, registers)
    fmas = block * vectors
    step = max(fmas / 2, (block + vectors) / LOADS_PER_CYCLE, FMA_LATENCY)
    return E_PATH["gemm"] * (fmas / 2) / step * g.k / (g.k + K0_GEMM) * lane_fill(pixels, lanes)


def _pointwise_tile(sch, pw, epilogue, par, block: int, lanes: int, registers: int):
    """The 1x1 conv under the channel block: ``block`` channels by ``vectors`` vectors of
    merged pixels in accumulators, the reduction outside them."""
    loops = sch.get_loops(pw)
    at = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(par)))
    rest = loops[at + 1:]  # unit loops (the batch) first, then channels, pixels, reduction
    if len(rest) < 3 or any(int(sch.get(lp).extent) != 1 for lp in rest[:-3]):
        return None
    channel, pixels, reduce = rest[-3:]
    count = int(sch.get(pixels).extent)
    vectors = pixel_vectors(count, block, lanes, registers)
    po, pv, pi = sch.split(pixels, factors=[None, vectors, lanes])
    if count % (vectors * lanes):
        sch.annotate(po, PARTITION_HINT, 1)
    sch.reorder(po, reduce, channel, pv, pi)
    writeback = sch.cache_write(pw, 0, "local")
    sch.reverse_compute_at(writeback, po, preserve_unit_loops=True)
    if epilogue is not None:
        sch.reverse_compute_inline(epilogue)
    if block > 1:
        sch.unroll(channel)
    sch.unroll(pv)
    sch.vectorize(pi)
    init = sch.decompose_reduction(pw, reduce)
    for blk in (init, writeback):
        sch.vectorize(sch.get_loops(blk)[-1])
    return sch


def _claims_chain(f, kind: str) -> bool:
    """CPU: a 1x1 convolution whose only consumer chain is a depthwise convolution (stride 1
    or 2), with elementwise epilogues, as one kernel: two contractions, no reduction, one output
    (the expanded tensor is not handed out), nothing computed before the 1x1 conv, which reads
    at least two input channels over an image of more than one row, the second a depthwise
    window of at least two taps over more than one output row and column."""
    if kind != "cpu" or f.n_contractions != 2 or f.n_reductions or f.attention:
        return False
    if f.n_outputs != 1 or f.window_reductions or f.tuple_items or f.reshaping_ops:
        return False
    if not f.op_work or not f.op_work[0].contraction:
        return False  # the 1x1 conv's input computed in the group: once per channel block
    work = [w for w in f.op_work if w.contraction]
    if len(work) != 2 or work[0].geometry is None or work[1].geometry is None:
        return False
    first, second = work[0].geometry, work[1].geometry
    return (first.depthwise is None and first.gemm is not None and first.k >= 2
            and first.gemm.height is not None
            and second.depthwise in (1, 2) and second.k >= 2)


def _pointwise_work(f):
    """The 1x1 conv's ``OpWork``, its GEMM geometry (rows: expanded channels, columns: a row of
    pixels, ``height`` rows merged into them), its pixels per image and the batch."""
    work = next(w for w in f.op_work if w.contraction)
    g = work.geometry.gemm
    pixels = g.n * (g.height or 1)
    return work, g, pixels, max(1, work.elems // max(1, g.m * pixels))


def _channel_blocks(f) -> int:
    """The parallel loop's iterations: the batch times the expanded channels' blocks."""
    _, g, _, batch = _pointwise_work(f)
    return batch * (g.m // _channels_block(g.m))


def _input_rereads(f) -> tuple[int, int]:
    """The 1x1 conv's input image, read once per block of its expanded channels."""
    work, g, pixels, batch = _pointwise_work(f)
    image = work.geometry.k * pixels * f.dtype_bytes
    return image, batch * (g.m // _channels_block(g.m) - 1)


# The 1x1 conv is priced by the chain's own tile (``_pointwise_share``), the depthwise conv at
# the share its standalone tile reaches (``efficiency.py``, by geometry); the expanded tensor
# between them stays in the thread's cache. What the tiling
# costs: the input read once per channel block (from L2 while it fits there), and a parallel
# loop of batch x C_mid / CB iterations (8 -> 8 channels at 112 x 112 on 2 threads: one block,
# 0.75x the two kernels; ``lab/chain_ab.py``).
CHAIN_CARD = Card(
    ScheduleClass.CONTRACTION_CHAIN, "ChannelChain", _claims_chain,
    efficiency={"cpu": 0.55}, contraction_efficiency={"cpu": 0.55},
    tiles_by_geometry=True, register_tile=True, recomputes=False,
    share=_pointwise_share,
    parallel_items=_channel_blocks, rereads=_input_rereads)


class ChannelChain(SafeRule):
    """1x1 conv -> depthwise conv in one kernel, parallel over channel blocks."""

    cards = (CHAIN_CARD,)

    def _apply(self, sch, target):
        sch = s_tir.Schedule(reciprocal_divisions(sch.mod["main"]))
        return schedule(sch, target)
