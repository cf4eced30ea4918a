"""The contraction kernel's share of the FMA peak, as the cost model reads it from the rules'
tile choice: geometry read from real PrimFuncs, the path each rule would take, and the shape
effects the one-constant efficiency could not see (short reductions, ragged tiles, narrow
groups), on fixed AVX2 and AVX-512 register files, never the host's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tvm import relax

from tvm_costfuse import build_graph
from tvm_costfuse.cost import analytical, group_features
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.schedules import efficiency
from tvm_costfuse.schedules.efficiency import fraction_of_peak
from tvm_costfuse.targets import host

AVX512 = (16, 32)  # float32 lanes, vector registers
AVX2 = (8, 16)


def _graph(build):
    bb = relax.BlockBuilder()
    build(bb)
    return build_graph(prepare(bb.get(), {"kind": "llvm"}))


def _matmul(m, k, n, batch=()):
    def build(bb):
        a = relax.Var("a", relax.TensorType((*batch, m, k), "float32"))
        b = relax.Var("b", relax.TensorType((*batch, k, n), "float32"))
        with bb.function("main", [a, b]):
            with bb.dataflow():
                gv = bb.emit_output(relax.op.matmul(a, b))
            bb.emit_func_output(gv)
    return _graph(build)


def _conv(c, f, hw, kernel, groups=1, stride=1):
    w = np.zeros((f, c // groups, kernel, kernel), "float32")

    def build(bb):
        x = relax.Var("x", relax.TensorType((1, c, hw, hw), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                gv = bb.emit_output(relax.op.nn.conv2d(x, relax.const(w), strides=stride,
                                                       padding=kernel // 2, groups=groups))
            bb.emit_func_output(gv)
    return _graph(build)


def _geometry(graph):
    found = [n.geometry for n in graph.nodes if n.geometry is not None]
    assert len(found) == 1, found
    return found[0]


def test_matmul_geometry_and_short_reductions_cost_a_share():
    long_k = _geometry(_matmul(192, 768, 768))
    short_k = _geometry(_matmul(192, 64, 768))
    assert long_k[0] == 768 and long_k[1][:2] == (192, 768)
    for regs in (AVX512, AVX2):
        path, share_long = fraction_of_peak(long_k, *regs)
        path_short, share_short = fraction_of_peak(short_k, *regs)
        assert path == path_short == "gemm"
        assert 0.5 < share_long < 1.0
        # K = 64: init and write-back weigh more (K0_GEMM = 1.7 reduction steps: 0.976 of
        # K = 768's share)
        assert share_short < 0.99 * share_long


def test_ragged_columns_cost_their_padding():
    exact = fraction_of_peak(_geometry(_matmul(192, 256, 192, batch=(4,))), *AVX512)[1]
    ragged = fraction_of_peak(_geometry(_matmul(192, 256, 197, batch=(4,))), *AVX512)[1]
    assert ragged < exact


def test_convolution_paths():
    dense = _geometry(_conv(64, 64, 28, 3))
    assert dense[2] is not None and dense[2][:2] == (64, 64)  # channels, channels per group
    assert fraction_of_peak(dense, *AVX512)[0] == "conv"
    assert fraction_of_peak(dense, *AVX2)[0] == "conv"
    # four channels per group cannot fill a vector of channels: the general tiling (resnext's
    # 3 x 3 groups measured 0.57 of peak against 0.96-0.99 for dense 3 x 3 convs, znver4)
    narrow = _geometry(_conv(128, 128, 28, 3, groups=32))
    path, share = fraction_of_peak(narrow, *AVX512)
    assert path == "tiled" and share < 0.7 * fraction_of_peak(dense, *AVX512)[1]


def test_depthwise_convolutions_take_the_depthwise_path_by_stride():
    """A depthwise conv is read as one (``depthwise.py``'s kernel, stride recorded) and priced
    by its stride on both register files; a dense 1x1 conv with as short a reduction (16
    input channels) is not."""
    s1 = _geometry(_conv(96, 96, 28, 3, groups=96))
    s2 = _geometry(_conv(96, 96, 28, 3, groups=96, stride=2))
    assert s1[0] == 9 and s1[4] == 1 and s2[4] == 2
    for regs in (AVX512, AVX2):
        (p1, share1), (p2, share2) = fraction_of_peak(s1, *regs), fraction_of_peak(s2, *regs)
        assert p1 == p2 == "depthwise"
        assert share2 < share1  # the stride-2 deinterleaving copy is a pass of its own
    pointwise = _geometry(_conv(16, 96, 28, 1))
    assert pointwise[4] is None and fraction_of_peak(pointwise, *AVX512)[0] == "gemm"
    # a geometry recorded before the depthwise element still prices (as before)
    assert fraction_of_peak(s1[:4], *AVX512)[0] == "tiled"


def test_a_hosts_measured_depthwise_shares_price_its_depthwise_kernels():
    """Where the host measured its depthwise kernels' shares (``TargetDesc.depthwise_shares``:
    NCHW s1, s2, NHWC s1, s2), each layout's block at each stride is priced by its own; the
    fitted shares price a host without; other paths ignore them."""
    s1 = _geometry(_conv(96, 96, 28, 3, groups=96))
    s2 = _geometry(_conv(96, 96, 28, 3, groups=96, stride=2))
    measured = (0.3, 0.1, 0.8, 0.4)
    reduce = 9 / (9 + efficiency.K0)
    assert fraction_of_peak(s1, *AVX512, measured) == ("depthwise", pytest.approx(0.3 * reduce))
    assert fraction_of_peak(s2, *AVX512, measured) == ("depthwise", pytest.approx(0.1 * reduce))
    # the same, channels-last: vectorized over the 96 channels
    nhwc = [efficiency.Geometry(*g[:3], 96, None, g[4]) for g in (s1, s2)]
    assert fraction_of_peak(nhwc[0], *AVX512, measured)[1] == pytest.approx(0.8 * reduce)
    assert fraction_of_peak(nhwc[1], *AVX512, measured)[1] == pytest.approx(0.4 * reduce)
    assert fraction_of_peak(s1, *AVX512)[1] == pytest.approx(efficiency.E_DEPTHWISE[1] * reduce)
    assert fraction_of_peak(nhwc[1], *AVX512)[1] == pytest.approx(
        efficiency.E_CHANNELS_LAST[2] * reduce)
    # channel counts no vector divides run narrower vectors channels-last (58: 2 lanes)
    ragged = efficiency.Geometry(9, None, None, 58, None, 1)
    narrow = efficiency.NARROW_VECTORS
    assert fraction_of_peak(ragged, *AVX512, measured)[1] == pytest.approx(
        0.8 * reduce * narrow[8])
    assert fraction_of_peak(ragged, *AVX2, measured)[1] == pytest.approx(0.8 * reduce * narrow[4])
    one = efficiency.Geometry(9, None, None, 57, None, 1)  # odd: 1 lane of 16
    assert fraction_of_peak(one, *AVX512, measured)[1] == pytest.approx(
        0.8 * reduce * narrow[8] / 2)
    dense = _geometry(_conv(64, 64, 28, 3))
    assert fraction_of_peak(dense, *AVX512, measured) == fraction_of_peak(dense, *AVX512)
    # and the analytical model passes the target's shares on: a host whose NCHW kernel
    # reaches a third of another's prices the same block's compute three times as long
    graph = _conv(96, 96, 28, 3, groups=96)
    name = next(n.name for n in graph.nodes if n.geometry is not None)
    f = group_features(graph, [name])
    base = host(1, calibration=False, mcpu="skylake-avx512")
    compute = [analytical.estimate(f, dataclasses.replace(base, depthwise_shares=m))
               .breakdown["compute"] for m in ((0.9, 0.3, 0.9, 0.3), (0.3, 0.3, 0.9, 0.3))]
    assert compute[1] == pytest.approx(3 * compute[0], rel=0.05)


def test_analytical_prices_a_short_reduction_slower_per_flop():
    """Two matmuls of equal FLOPs: the K = 64 one is priced slower than the K = 1024 one;
    the one-constant efficiency priced them alike."""
    target = dataclasses.replace(host(1, calibration=False, mcpu="skylake-avx512"),
                                 l1_bytes=32 << 10, l2_bytes=1 << 20, l3_bytes=32 << 20)
    times = []
    for m, k, n in ((1024, 64, 1024), (256, 1024, 256)):
        graph = _matmul(m, k, n)
        name = next(n.name for n in graph.nodes if n.geometry is not None)
        f = group_features(graph, [name])
        times.append(analytical.estimate(f, target).breakdown["compute"])
    assert times[0] > 1.015 * times[1]  # K0_GEMM = 1.7 steps per tile: 2.5% at K = 64


@pytest.mark.parametrize("regs", [AVX512, AVX2])
def test_shares_stay_below_one(regs):
    for graph in (_matmul(7, 5, 3), _matmul(197, 64, 197, batch=(12,)), _conv(3, 64, 32, 7),
                  _conv(96, 96, 14, 3, groups=96)):
        geometry = [n.geometry for n in graph.nodes if n.geometry is not None]
        for g in geometry:
            assert 0.0 < fraction_of_peak(g, *regs)[1] < 1.0



def test_the_general_tiling_fills_the_lanes_its_vector_tile_takes():
    """``vector_fill`` follows ``_common.vector_tile``: whole vectors where the lanes divide
    the extent, one partial register below them, else vectors as wide as its largest divisor
    below the lanes (232 channels: 8 of 16)."""
    assert efficiency.vector_fill(232, 16) == 0.5 and efficiency.vector_fill(256, 16) == 1.0
    assert efficiency.vector_fill(7, 16) == 7 / 16  # one partial register
    assert efficiency.vector_fill(58, 16) == 2 / 16 and efficiency.vector_fill(58, 8) == 2 / 8
    tiled = efficiency.Geometry(232, None, None, 232)
    assert fraction_of_peak(tiled, *AVX512) == (
        "tiled", pytest.approx(efficiency.E_PATH["tiled"] * 0.5 * 232 / (232 + efficiency.K0)))
