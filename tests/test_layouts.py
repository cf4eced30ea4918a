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
from tvm_costfuse.schedules import depthwise_nhwc, efficiency, reduction

from tvm_costfuse.config import FusionConfig
from tvm_costfuse.layouts import Layout, channels_last, convertible, decide_layout
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


def _nhwc_convs(mod) -> int:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
                and expr.op.name == "relax.nn.conv2d" and expr.attrs.data_layout == "NHWC":
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return len(found)


def _decided(mod, layout, target="llvm"):
    with tvm.target.Target(target):
        return decide_layout(mod, CostFuse(target=target, layout=layout))


def _one_conv(shape, weight, dtype=F32, groups=1, name="main"):
    x = relax.Var("x", relax.TensorType(shape, dtype))
    bb = relax.BlockBuilder()
    with bb.function(name, [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ones(weight, dtype)), padding=1,
                                           groups=groups))
            out = bb.emit_output(relax.op.clip(y, 0.0, 6.0))
        bb.emit_func_output(out)
    return bb.get()


def test_never_and_a_model_without_such_convolutions_are_left_alone():
    rng = np.random.default_rng(1)
    mod, _ = _block(rng, 1, 16, 32, 8)
    kept, decision = _decided(mod, "never")
    tvm.ir.assert_structural_equal(kept, mod)
    assert not decision.chosen and decision.prices is None
    dense = _one_conv((1, 4, 8, 8), (4, 4, 3, 3))
    kept, decision = _decided(dense, "always")
    tvm.ir.assert_structural_equal(kept, dense)
    assert decision == Layout(0, False, "no depthwise or 1x1 convolution to run channels-last")


@pytest.mark.parametrize("why, mod", [
    ("float16", _one_conv((1, 8, 6, 6), (8, 1, 3, 3), "float16", groups=8)),
    ("a channel multiplier of 2", _one_conv((1, 8, 6, 6), (16, 1, 3, 3), groups=8)),
    ("a symbolic batch", _one_conv((tvm.tirx.Var("n", "int64"), 8, 6, 6), (8, 1, 3, 3),
                                  groups=8)),
])
def test_convolutions_the_kernels_do_not_take_stay_as_imported(why, mod):
    kept, decision = _decided(mod, "always")
    tvm.ir.assert_structural_equal(kept, mod)
    assert decision.convolutions == 0 and not decision.chosen, why


def test_a_cuda_target_is_left_as_imported():
    rng = np.random.default_rng(5)
    mod, _ = _block(rng, 1, 16, 32, 8)
    kept, decision = _decided(mod, "always", "cuda")
    tvm.ir.assert_structural_equal(kept, mod)
    assert not decision.chosen and "CPU rules" in decision.why


def test_a_function_not_named_main_is_priced():
    mod = _one_conv((1, 16, 14, 14), (16, 1, 3, 3), groups=16, name="forward")
    out, decision = _decided(mod, "cost")
    nchw, nhwc = decision.prices
    assert nchw > 0 and nhwc > 0
    assert (_nhwc_convs(out) > 0) == decision.chosen


def test_integer_clips_stay_clips():
    x = relax.Var("x", relax.TensorType((1, 8, 4, 4), "int32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.clip(x, 0, 5))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(channels_last(mod), mod)


@pytest.mark.parametrize("after", ["grouped", "transposed"])
def test_what_follows_a_channels_last_convolution_computes_as_before(after):
    """A grouped (not depthwise) convolution is pinned NCHW after a channels-last producer; a
    transposed one stays NCHW (TVM legalizes no other layout of it)."""
    rng = np.random.default_rng(6)
    op = relax.op
    x = relax.Var("x", relax.TensorType((1, 8, 10, 10), F32))

    def const(*dims):
        return relax.const((rng.standard_normal(dims) * 0.3).astype(F32))

    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(16, 8, 1, 1)))
            y = bb.emit(op.nn.conv2d(y, const(16, 1, 3, 3), padding=1, groups=16))
            if after == "grouped":
                y = bb.emit(op.nn.conv2d(y, const(16, 4, 3, 3), padding=1, groups=4))
            else:
                y = bb.emit(op.nn.conv2d_transpose(y, const(16, 8, 2, 2), strides=2))
            out = bb.emit_output(op.nn.relu(y))
        bb.emit_func_output(out)
    mod = bb.get()
    data = {"x": rng.standard_normal((1, 8, 10, 10)).astype(F32)}
    want = run(tvm.compile(mod, "llvm", relax_pipeline=build_pipeline("llvm", no_fusion)), data)
    cf = _costfuse("always")
    got = run(tvm.compile(mod, "llvm", relax_pipeline=scheduled_pipeline("llvm", cf)), data)
    assert cf.layout_decision.chosen, cf.layout_decision.why
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_cost_decides_by_both_prices():
    rng = np.random.default_rng(2)
    mod, data = _block(rng, 1, 16, 96, 28, stride=2)
    out, decision = _decided(mod, "cost")
    nchw, nhwc = decision.prices
    assert nchw > 0 and nhwc > 0
    assert (_nhwc_convs(out) == 3) == decision.chosen
    assert f"{nchw * 1e3:.3f} ms as imported" in decision.why
    cf = _costfuse("cost")
    got = run(tvm.compile(mod, "llvm", relax_pipeline=scheduled_pipeline("llvm", cf)), data)
    assert cf.layout_decision.chosen == decision.chosen
    want = run(tvm.compile(mod, "llvm", relax_pipeline=build_pipeline("llvm", no_fusion)), data)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_explain_reports_the_decision():
    from tvm_costfuse.report.explain import explain, format_text

    rng = np.random.default_rng(7)
    mod, _ = _block(rng, 1, 16, 32, 8)
    report = explain(mod, "llvm", layout="always")
    assert report["layout"]["channels_last"] and report["layout"]["convolutions"] == 3
    assert "layout: channels-last: costfuse.layout is 'always'" in format_text(report)


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
    assert depthwise_nhwc.channel_tile(32, 16) == 16 and depthwise_nhwc.channel_tile(7, 16) == 1


@pytest.mark.parametrize("shape", [(1, 28, 28, 32), (2, 7, 7, 72), (1, 5, 3, 7)])
def test_a_mean_over_a_channels_last_image_is_read_as_columns(shape, monkeypatch):
    rng = np.random.default_rng(4)
    x = relax.Var("x", relax.TensorType(shape, F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            m = bb.emit(relax.op.mean(x, axis=[1, 2], keepdims=True))
            out = bb.emit_output(relax.op.multiply(m, relax.const(2.0, F32)))
        bb.emit_func_output(out)
    data = {"x": rng.standard_normal(shape).astype(F32)}
    taken = []
    columns = reduction.schedule_columns
    monkeypatch.setattr(reduction, "schedule_columns",
                        lambda *a: taken.append(columns(*a)) or taken[-1])
    got = run(tvm.compile(bb.get(), "llvm",
                          relax_pipeline=scheduled_pipeline("llvm", _costfuse("never"))), data)
    # 4 lanes here: 7 channels leave no whole vector (the rule may be tried more than once)
    assert taken and all(t == (shape[-1] % 4 == 0) for t in taken)
    np.testing.assert_allclose(got[0], 2 * data["x"].mean(axis=(1, 2), keepdims=True),
                               rtol=1e-5, atol=1e-5)
