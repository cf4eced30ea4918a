"""What share of the FMA peak a contraction's kernel reaches, from the tile its rule would pick.

A single efficiency per schedule class priced a Linear (0.72-0.78 of the FMA-chain peak
measured), an attention score matmul with K = 64 (0.40) and wav2vec2's first convolution
(10 multiply-adds per output, 0.19) alike. The rules know why they differ: the register tile
they choose leaves lanes and rows padded, and a short reduction spends a larger share of each
tile on initializing and writing back its accumulators. So the cost model asks the rules'
own tile choice (``gemm.choose_tile``, ``conv.choose_conv_tile``) and their cycle model:

    share = ideal cycles / modeled cycles of the padded tiles * K / (K + K0) * E_path

- ``ideal``: the output's FMAs at full vector width, 2 per cycle; ``modeled``: the tiles'
  cycles per reduction step as the rule's chooser counts them (FMA issue, loads, latency);
- ``K / (K + K0)``: per tile, accumulator init, write-back and the epilogue cost about ``K0``
  reduction steps (9.2 for the direct convolution and the general tiling, 1.7 for the GEMM
  micro-kernel, whose tile stores whole vectors in place);
- ``E_path``: what the best-shaped kernels of each path reach on top of that (loop and address
  overhead, cache misses the model does not see), times ``E_ACTIVATION`` for a GEMM whose
  streamed operand is not a packed constant weight.

A depthwise convolution (``depthwise.py``) has no tile search: its share is
``K / (K + K0) * E_DEPTHWISE[stride]``, its time the loads of each tap and, at stride 2, the
deinterleaving copy. That share differs most between hosts (0.70 on a znver4 core, 0.30 on a
rocketlake one at stride 1): a calibrated host measures its own, for both layouts
(``measurement/depthwise_shares.py``; ``TargetDesc.depthwise_shares``), and the fitted ones
below price hosts without.

Fitted to the per-kernel ``tvm/peak`` figures of ``scripts/bench_kernels.py --peak`` on
znver4 (28 GEMM and convolution shapes and 17 pointwise convolutions of mobilenet_v2, 1 thread,
kernels with their register tiles on the stack; docs/log/2026-12-06g.md and 2026-12-06h.md;
the fit is ``lab/fit_efficiency.py``, which holds the figures). The kernels reach 0.85-0.99 of
the FMA-chain peak on well-shaped blocks, so the paths' best cases are 1.0: the fit asked
1.27-1.30 for the GEMM path, which would price every other tile above the peak. The depthwise
shares are the same host's stride-1 and stride-2 figures over the corpus's shapes (0.23-0.59
and 0.14-0.20 of peak). What a contraction's block looks like is read once per PrimFunc
(:func:`describe`, target-independent, stored on the graph node); the share needs the
target's lanes and registers (:func:`fraction_of_peak`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from . import columns, conv_shape, depthwise, depthwise_nhwc, gemm
from ._common import is_spatial, largest_divisor, root_blocks
from .conv import choose_conv_tile
from .gemm_tile import FMA_LATENCY, LOADS_PER_CYCLE, pick_tile, tile_cycles
from .prepack import layout_free

__all__ = ["ConvGeometry", "GemmGeometry", "Geometry", "describe", "fraction_of_peak", "lane_fill"]

# Reduction steps' worth of work per tile outside the reduction loop (fitted; see module doc).
K0 = 9.2
# The same for the GEMM micro-kernel, whose tile writes whole vectors of the output in place
# (with the pixels merged into the columns, ``columns.py``): fitted with the corpus's pointwise
# convolutions, K = 16-960 (``fit_efficiency.py --gemm-only``).
K0_GEMM = 1.7
# Best-case share of each path after tile padding and the K term (fitted).
E_PATH = {"gemm": 1.0, "conv": 1.0, "tiled": 0.82}
# The GEMM micro-kernel's share when its streamed operand is no constant weight (attention's
# K^T and V, any batch matmul of two activations): read in its own layout, never packed into
# panels (``prepack.py`` packs constants only). The measured / modeled share of the corpus'
# per-head matmuls at 1 and 2 threads (rocketlake, ``bench_kernels.py --peak``,
# docs/log/2026-12-01b.md): ViT's Q K^T 0.71 / 0.74, its P V 0.76 / 0.85, BERT's Q K^T 0.82 / 0.84,
# against 1.00-1.06 for the weight GEMMs of the same table; their geomean.
E_ACTIVATION = 0.78
# A depthwise kernel's share by its stride, on top of the K term (fitted; see module doc).
E_DEPTHWISE = {1: 0.70, 2: 0.32}
# The channels-last depthwise kernel's (``depthwise_nhwc.py``), the same way: 15 corpus shapes
# at 1 thread (``lab/layout_kernels.py``, rocketlake, 239 GFLOP/s FMA-chain peak; 11 stride-1
# shapes 0.52-1.04, 4 stride-2 ones 0.21-0.74; on the same run the NCHW kernel's shares were
# 0.30 and 0.10, where E_DEPTHWISE has znver4's).
E_CHANNELS_LAST = {1: 0.82, 2: 0.44}
# The channels-last depthwise kernel's share on channel counts whole vectors do not divide,
# against the whole-vector share, by how many times narrower its channel tile is: the geomean
# of the ratios measured at 7-28 px, strides 1 and 2 (half the lanes 0.70-0.85, a quarter
# 0.42-0.64, an eighth 0.21-0.32; AVX-512, rocketlake, 2026-12-08, docs/log/2026-12-08.md).
# The share falls slower than the lanes: at full width the kernel is bound by its loads as
# much as by its FMAs. Narrower still: halving per halving. Applied by that ratio on AVX2 and
# SSE too (not measured there); E_CHANNELS_LAST's fit held some half-vector shapes.
NARROW_VECTORS = {1: 1.0, 2: 0.77, 4: 0.53, 8: 0.26}


class GemmGeometry(NamedTuple):
    """A block the GEMM micro-kernel takes: ``m x n`` outputs, whether the streamed operand is
    a constant weight (packed at compile time), the extent of the axis that may merge into
    the columns (``columns.py``; None: none, and in rows recorded before it), and the output
    rows each streamed element serves (``gemm_tile.pick_tile``'s ``reuse``; None in rows
    recorded before it)."""

    m: int
    n: int
    weight: bool
    height: int | None = None
    reuse: int | None = None


class ConvGeometry(NamedTuple):
    """A block the direct convolution kernel takes (``conv_shape.analyze``)."""

    channels: int
    per_group: int
    height: int
    width: int
    taps: int
    stride: int
    dilation: int


class Geometry(NamedTuple):
    """What the contraction rule's paths see of a block (:func:`describe`). A tuple, so that
    it is hashable and stored in JSON rows as a list; :meth:`of` reads one back."""

    k: int  # reduction steps per output
    gemm: GemmGeometry | None
    conv: ConvGeometry | None
    tiled: int  # the vectorized extent of the general tiling
    depthwise: int | None = None  # the stride of a depthwise convolution (recorded since)
    channels_last: int | None = None  # the same for an NHWC one (recorded since)

    @classmethod
    def of(cls, value) -> Geometry | None:
        """A geometry from its stored form (nested lists or tuples), None from None."""
        if value is None:
            return None
        k, gemm_geom, conv_geom, tiled, *rest = value
        return cls(k, GemmGeometry(*gemm_geom) if gemm_geom else None,
                   ConvGeometry(*conv_geom) if conv_geom else None, tiled, *rest)


def _extent(iv) -> int | None:
    e = iv.dom.extent
    return int(e) if isinstance(e, tirx.IntImm) else None


def describe(func: tirx.PrimFunc) -> Geometry | None:
    """The :class:`Geometry` of a single-contraction PrimFunc; None where the function has no
    such block or a symbolic extent."""
    try:
        sch = s_tir.Schedule(func)
        if normalize_prim_func(sch) is None:
            return None
    except (RuntimeError, ValueError, TypeError):
        return None
    reductions = [b for b in root_blocks(sch) if not is_spatial(sch.get(b))]
    if len(reductions) != 1:
        return None
    block = sch.get(reductions[0])
    from .contraction import contraction_operands  # the rule's matcher (it imports gemm)

    operands = contraction_operands(block)
    if operands is None:
        return None
    extents = {iv.var: _extent(iv) for iv in block.iter_vars}
    if any(e is None for e in extents.values()):
        return None
    k = math.prod(_extent(iv) for iv in block.iter_vars
                  if iv.iter_type == tirx.IterVar.CommReduce)
    store = operands[0]
    last = store.indices[-1]
    tiled = extents.get(last, 1) if isinstance(last, tirx.Var) else 1
    einsum = gemm.analyze(block, *operands)
    gemm_geom = None
    if einsum is not None:
        m = extents[einsum.row] if einsum.row is not None else 1
        weight = any(p.same_as(einsum.streamed.source) for p in layout_free(sch))
        gemm_geom = GemmGeometry(m, extents[einsum.col], weight,
                                 columns.mergeable(block, store, einsum),
                                 gemm.reuse(extents, einsum))
    shape = conv_shape.analyze(block, *operands)
    conv_geom = None
    if shape is not None:
        height = extents[shape.height] if shape.height is not None else 1
        conv_geom = ConvGeometry(extents[shape.channel], shape.per_group, height,
                                 extents[shape.width], *shape.window)
    dw = depthwise.analyze(block, *operands)
    dw_stride = max(dw.rows[1], dw.cols[1]) if dw is not None else None
    last = depthwise_nhwc.analyze(block, *operands)
    last_stride = max(last.rows[1], last.cols[1]) if last is not None else None
    return Geometry(k, gemm_geom, conv_geom, tiled, dw_stride, last_stride)


def _gemm_share(g: GemmGeometry, lanes: int, registers: int) -> float | None:
    if g.n < lanes:
        return None  # the rule keeps the general tiling for rows narrower than a vector
    m = g.m
    tile, cols = pick_tile(m, g.n, lanes, registers, g.weight, g.height, g.reuse)
    if tile is None:
        return None
    return (m * cols / lanes / 2) / tile_cycles(tile, m, cols)


def _conv_share(g: ConvGeometry, lanes: int, registers: int) -> float | None:
    channels, height, width = g.channels, g.height, g.width
    tile = choose_conv_tile(channels, g.per_group, height, width, lanes, registers,
                            (g.taps, g.stride, g.dilation))
    if tile is None:
        return None
    # a partial vector (12 lanes) is split by LLVM into power-of-two pieces (8 + 4): each
    # of its FMAs and weight loads is that many instructions
    pieces = tile.lanes.bit_count()
    fmas = tile.height * tile.width * tile.vectors * pieces
    step = max(fmas / 2, (tile.height * tile.width + tile.vectors * pieces) / LOADS_PER_CYCLE,
               FMA_LATENCY)
    tiles = (channels // (tile.vectors * tile.lanes)) * (height // tile.height) \
        * -(-width // tile.width)
    return (channels * height * width / lanes / 2) / (tiles * step)


def _depthwise_share(g: Geometry, lanes: int, measured: tuple | None) -> tuple[str, float]:
    """(path, share over the K term) of a depthwise block: the host's measured share of its
    layout's kernel at its stride (2 for any stride above), else the fitted one. Both were
    taken on channel counts whole vectors divide; a channels-last kernel on others runs
    narrower vectors (``depthwise_nhwc.channel_tile``) at :data:`NARROW_VECTORS`' share of
    it."""
    nchw = g.depthwise is not None
    stride = g.depthwise if nchw else g.channels_last
    if measured is not None:
        s1, s2 = measured[:2] if nchw else measured[2:]
        share = s1 if stride == 1 else s2
    else:
        fitted = E_DEPTHWISE if nchw else E_CHANNELS_LAST
        share = fitted.get(stride, fitted[2])
    if not nchw:
        narrow = lanes // depthwise_nhwc.channel_tile(g.tiled, lanes)
        share *= NARROW_VECTORS.get(narrow, NARROW_VECTORS[8] * 8 / narrow)
    return ("depthwise" if nchw else "channels_last"), share


def lane_fill(extent: int, lanes: int) -> float:
    """Share of the lanes of ``extent``'s vectors that hold elements: the last, partial
    vector of a row runs whole."""
    return extent / (-(-extent // lanes) * lanes)


def vector_fill(extent: int, lanes: int) -> float:
    """Share of the lanes the general tiling's vectors fill along an ``extent`` (``_common.
    vector_tile``): whole vectors where ``lanes`` divides it; one partial register where it is
    narrower; else vectors as wide as its largest divisor below ``lanes`` (232 channels: 8 of
    16 lanes, where a 7 x 7 x 232 channels-last 1x1 convolution with a constant weight ran at
    0.41 of the peak: the GEMM micro-kernel declines a weight no tile divides that fewer than
    ``PAD_WEIGHT_ROWS`` rows reuse)."""
    return largest_divisor(extent, lanes) / lanes


def k0_of(path: str) -> float:
    """The init/write-back term of ``path``'s kernel, in reduction steps."""
    return K0_GEMM if path == "gemm" else K0


@functools.lru_cache(maxsize=4096)  # asked per estimate; the tile search is a few hundred steps
def fraction_of_peak(geometry, lanes: int, registers: int,
                     depthwise_shares: tuple | None = None) -> tuple[str, float]:
    """(path, share of the FMA peak) of the kernel the CPU contraction rule builds for a block
    of this :func:`describe` geometry on a target with ``lanes`` float lanes and ``registers``
    vector registers. The path is the one the rule tries first that fits: the micro-kernel,
    the direct convolution, the depthwise kernel, else the general tiling. ``geometry`` may
    be in its stored form (:meth:`Geometry.of`). ``depthwise_shares``: the host's measured
    shares of the two depthwise kernels (``TargetDesc.depthwise_shares``), else the fitted
    ones."""
    g = Geometry.of(geometry)
    k = g.k
    reduce = k / (k + K0)
    share = _gemm_share(g.gemm, lanes, registers) if g.gemm else None
    if share is not None:
        packed = 1.0 if g.gemm.weight else E_ACTIVATION
        return "gemm", E_PATH["gemm"] * share * k / (k + K0_GEMM) * packed
    share = _conv_share(g.conv, lanes, registers) if g.conv else None
    if share is not None:
        return "conv", E_PATH["conv"] * share * reduce
    if g.depthwise is not None or g.channels_last is not None:
        path, share = _depthwise_share(g, lanes, depthwise_shares)
        return path, share * reduce
    return "tiled", E_PATH["tiled"] * vector_fill(g.tiled, lanes) * reduce
