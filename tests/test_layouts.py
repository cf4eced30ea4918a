"""Channels-last layouts (layouts.py, schedules/depthwise_nhwc.py, schedules/column_reduction.py):
CostFuse may run a CNN's depthwise and 1x1 convolutions NHWC, a decision no FuseOps plan has.

The fuzzer draws inverted-residual blocks with adversarial extents (1x1 and prime-sized
images, stride 2 on odd sizes, 5x5 and dilated windows, channel counts of 3, 8, 24 and 72
beside vector multiples, a batch of 2, a squeeze-excite mean, a residual add) and compares
CostFuse's channels-last build with the unfused program built by TVM.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm_costfuse.schedules import depthwise_nhwc, efficiency
from tvm_costfuse.schedules.column_reduction import column_tile

from tvm_costfuse.config import FusionConfig
from tvm_costfuse.layouts import MIN_GAIN, Layout, channels_last, convertible
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.pipelines import build_pipeline, fuse, scheduled_pipeline
from tvm_costfuse.strategies import no_fusion
from tvm_costfuse.targets import host_target
from tvm_costfuse.transform import CostFuse

F32 = "float32"


def _block(rng, batch, channels, expanded, size, kernel=3, stride=1, dilation=1,
           squeeze=False, residual=False, act="relu6"):
    """x -> 1x1 expand (+ bias, act) -> depthwise (+ bias, act) -> [squeeze-excite] -> 1x1
    project (+ bias) [-> + x], NCHW as the importers emit it."""
    op = relax.op
    x = relax.Var("x", relax.TensorType((batch, channels, size, size), F32))

    def const(*dims, scale=1.0):
        return relax.const((rng.standard_normal(dims) * scale).astype(F32))

    bb = relax.BlockBuilder()

    def activate(value):
        value = bb.emit(value)
        if act == "relu6":
            return bb.emit(op.clip(value, 0.0, 6.0))
        return bb.emit(op.multiply(value, bb.emit(op.sigmoid(value))))

    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(op.nn.conv2d(x, const(expanded, channels, 1, 1, scale=channels ** -0.5)))
            e = activate(op.add(e, const(1, expanded, 1, 1)))
            pad = dilation * (kernel // 2)
            d = bb.emit(op.nn.conv2d(e, const(expanded, 1, kernel, kernel, scale=1.0 / kernel),
                                     strides=stride, padding=pad, dilation=dilation,
                                     groups=expanded))
            d = activate(op.add(d, const(1, expanded, 1, 1)))
            if squeeze:
                s = bb.emit(op.mean(d, axis=[2, 3], keepdims=True))
                s = bb.emit(op.nn.conv2d(s, const(expanded, expanded, 1, 1, scale=0.1)))
                d = bb.emit(op.multiply(d, bb.emit(op.sigmoid(s))))
            p = bb.emit(op.nn.conv2d(d, const(channels, expanded, 1, 1, scale=expanded ** -0.5)))
            p = bb.emit(op.add(p, const(1, channels, 1, 1)))
            if residual and stride == 1:
                p = bb.emit(op.add(p, x))
            out = bb.emit_output(p)
        bb.emit_func_output(out)
    data = rng.standard_normal((batch, channels, size, size)).astype(F32)
    return bb.get(), {"x": data}


CASES = [  # batch, channels, expanded, size, kernel, stride, dilation, squeeze, residual, act
    (1, 16, 96, 14, 3, 1, 1, False, True, "relu6"),
    (1, 8, 48, 1, 3, 1, 1, False, True, "relu6"),
    (1, 24, 72, 17, 3, 2, 1, False, False, "relu6"),
    (2, 16, 32, 13, 5, 2, 1, True, False, "silu"),
    (1, 3, 24, 9, 5, 1, 1, True, True, "silu"),
    (1, 16, 64, 12, 3, 1, 2, False, True, "relu6"),
    (1, 40, 240, 7, 5, 1, 1, True, True, "silu"),
    (1, 8, 8, 28, 3, 2, 1, False, False, "relu6"),
]


def _costfuse(layout: str) -> CostFuse:
    return CostFuse(target="llvm", layout=layout)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_fuzz_channels_last_blocks_compute_what_the_program_does(case, monkeypatch):
    """Generic x86-64 (4 lanes) on even cases, the host's ISA on odd ones; the depthwise
    convolution must be the channels-last kernel's (on a 1x1 image TVM drops the image axes
    and another rule runs it)."""
    rng = np.random.default_rng(case)
    mod, data = _block(rng, *CASES[case])
    target = "llvm" if case % 2 == 0 else host_target(1)
    want = run(tvm.compile(mod, "llvm", relax_pipeline=build_pipeline("llvm", no_fusion)), data)
    scheduled = []
    kernel = depthwise_nhwc.schedule
    monkeypatch.setattr(depthwise_nhwc, "schedule",
                        lambda *a: scheduled.append(kernel(*a)) or scheduled[-1])
    cf = CostFuse(target=target, layout="always")
    got = run(tvm.compile(mod, target, relax_pipeline=scheduled_pipeline(target, cf)), data)
    assert cf.layout_decision.chosen and cf.layout_decision.convolutions >= 3
    if CASES[case][3] > 1:
        assert scheduled and all(s is not None for s in scheduled)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_depthwise_and_pointwise_convolutions_turn_channels_last_and_dense_ones_stay():
    rng = np.random.default_rng(0)
    mod, _ = _block(rng, 1, 16, 32, 8)
    out = channels_last(mod)
    layouts = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
                and expr.op.name == "relax.nn.conv2d":
            layouts.append((expr.attrs.data_layout, expr.attrs.kernel_layout))

    relax.analysis.post_order_visit(out["main"], visit)
    assert layouts == [("NHWC", "HWIO"), ("NHWC", "HWOI"), ("NHWC", "HWIO")]
    x = relax.Var("x", relax.TensorType((1, 8, 9, 9), F32))
    assert convertible(relax.op.nn.conv2d(x, relax.const(np.zeros((8, 8, 3, 3), F32)))) is None
    grouped = relax.op.nn.conv2d(x, relax.const(np.zeros((8, 2, 3, 3), F32)), groups=4)
    assert convertible(grouped) is None


def test_never_and_a_model_without_such_convolutions_are_left_alone():
    rng = np.random.default_rng(1)
    mod, _ = _block(rng, 1, 16, 32, 8)
    never = _costfuse("never")
    with tvm.target.Target("llvm"):
        from tvm_costfuse.layouts import ChannelsLast

        kept = ChannelsLast(never)(mod)
    tvm.ir.assert_structural_equal(kept, mod)
    assert not never.layout_decision.chosen and never.layout_decision.prices is None
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ones((4, 4, 3, 3), F32))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    cf = _costfuse("always")
    with tvm.target.Target("llvm"):
        ChannelsLast(cf)(bb.get())
    assert cf.layout_decision == Layout(0, False, cf.layout_decision.why)


def test_cost_decides_by_both_prices():
    rng = np.random.default_rng(2)
    mod, data = _block(rng, 1, 16, 96, 28, stride=2)
    cf = _costfuse("cost")
    got = run(tvm.compile(mod, "llvm", relax_pipeline=scheduled_pipeline("llvm", cf)), data)
    decision = cf.layout_decision
    nchw, nhwc = decision.prices
    assert nchw > 0 and nhwc > 0
    assert decision.chosen == (nhwc < nchw * (1 - MIN_GAIN))
    assert f"{nchw * 1e3:.3f} ms as imported" in decision.why
    want = run(tvm.compile(mod, "llvm", relax_pipeline=build_pipeline("llvm", no_fusion)), data)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_the_layout_key_takes_three_values():
    assert FusionConfig(layout="always").layout == "always"
    with pytest.raises(ValueError, match="costfuse.layout must be one of"):
        FusionConfig(layout="nhwc")


@pytest.mark.parametrize("stride", [1, 2])
def test_the_cost_model_prices_an_nhwc_depthwise_conv_as_its_own_kernel(stride):
    rng = np.random.default_rng(3)
    mod, _ = _block(rng, 1, 16, 64, 14, stride=stride)
    fused = fuse(channels_last(mod), "llvm", relax.transform.FuseOps())
    geometries = [efficiency.describe(f) for f in fused.functions.values()
                  if isinstance(f, tvm.tirx.PrimFunc)]
    last = [g for g in geometries if g is not None and g.channels_last is not None]
    assert [g.channels_last for g in last] == [stride]
    path, share = efficiency.fraction_of_peak(last[0], 16, 32)
    assert path == "channels_last" and 0 < share < 1


def test_tiles_divide_their_axes():
    assert depthwise_nhwc.channel_tile(144, 16) == 16
    assert depthwise_nhwc.channel_tile(72, 16) == 8
    assert depthwise_nhwc.channel_tile(3, 16) == 1
    assert depthwise_nhwc.spatial_tile(56, 56) == (2, 4)
    assert depthwise_nhwc.spatial_tile(7, 7) == (1, 7)
    assert depthwise_nhwc.spatial_tile(1, 1) == (1, 1)
    assert column_tile(32, 16) == 16 and column_tile(72, 16) == 8 and column_tile(7, 16) == 1


@pytest.mark.parametrize("shape", [(1, 28, 28, 32), (2, 7, 7, 72), (1, 5, 3, 7)])
def test_a_mean_over_a_channels_last_image_is_read_as_columns(shape):
    rng = np.random.default_rng(4)
    x = relax.Var("x", relax.TensorType(shape, F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            m = bb.emit(relax.op.mean(x, axis=[1, 2], keepdims=True))
            out = bb.emit_output(relax.op.multiply(m, relax.const(2.0, F32)))
        bb.emit_func_output(out)
    data = {"x": rng.standard_normal(shape).astype(F32)}
    got = run(tvm.compile(bb.get(), "llvm",
                          relax_pipeline=scheduled_pipeline("llvm", _costfuse("never"))), data)
    np.testing.assert_allclose(got[0], 2 * data["x"].mean(axis=(1, 2), keepdims=True),
                               rtol=1e-5, atol=1e-5)
