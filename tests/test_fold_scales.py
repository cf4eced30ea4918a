"""Per-channel input scales moved into convolution weights (``fold/scales.py``).

Squeeze-excite programs are drawn with adversarial extents (1x1 and odd images, strides 2,
padding, 1-d and 2-d convolutions, a batch of two, constant and computed scales in every
broadcast form, the multiply's operands either way round) and compared with the program as
written, both built by TVM; the rewrite must happen exactly where it is legal and the weights
are the smaller, and nowhere else (a grouped convolution, a per-image scale in a batch, a
multiply with a second use, a scale that varies over the image).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from tvm_costfuse.fold import fold_weights
from tvm_costfuse.fold.scales import move_input_scales
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.models import load_torch
from tvm_costfuse.strategies import strategy_pipeline
from tvm_costfuse.targets import host_target

_CONV = {1: relax.op.nn.conv1d, 2: relax.op.nn.conv2d}


def _multiplies(mod: tvm.IRModule) -> list[tuple[int, ...]]:
    """The output shapes of ``main``'s multiplies."""
    shapes = []

    def visit(expr):
        if (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
                and expr.op.name == "relax.multiply"):
            shapes.append(tuple(int(d) for d in expr.ty.shape.values))

    relax.analysis.post_order_visit(mod["main"], visit)
    return shapes


def _se_program(rng, axes=2, batch=1, channels=6, out_channels=4, image=5, kernel=1,
                stride=1, pad=0, groups=1, scale="computed", scale_shape=None, swap=False,
                second_use=False):
    """x -> scale (per channel) -> multiply -> conv: what squeeze-excite feeds a projection."""
    shape = (batch, channels) + (image,) * axes
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if scale == "computed":  # sigmoid of the channel means, as squeeze-excite
                pooled = bb.emit(relax.op.mean(x, axis=list(range(2, 2 + axes)), keepdims=True))
                s = bb.emit(relax.op.sigmoid(pooled))
            elif scale == "image":  # varies over the image: not a channel scale
                s = bb.emit(relax.op.sigmoid(x))
            else:
                s = relax.const(rng.uniform(0.5, 2.0, scale_shape).astype("float32"))
            if scale_shape is not None and scale == "computed":
                s = bb.emit(relax.op.reshape(s, scale_shape))
            product = bb.emit(relax.op.multiply(s, x) if swap else relax.op.multiply(x, s))
            weight = rng.standard_normal(
                (out_channels, channels // groups) + (kernel,) * axes).astype("float32")
            y = bb.emit(_CONV[axes](product, relax.const(weight), strides=stride, padding=pad,
                                    groups=groups, out_dtype="float32"))
            if second_use:
                y = bb.emit(relax.op.add(relax.op.sum(product), relax.op.sum(y)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), shape


def _check(mod, shape, rng, moved: bool) -> None:
    folded, notes = move_input_scales(mod)
    assert bool(notes) == moved, notes
    full = [s for s in _multiplies(folded) if s == shape]
    assert bool(full) != moved  # the input-sized product is gone exactly where it moved
    data = {"x": rng.standard_normal(shape).astype("float32")}
    got = run(tvm.compile(folded, "llvm"), data)[0]
    want = run(tvm.compile(mod, "llvm"), data)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


CASES = [
    ({}, True),
    ({"axes": 1, "image": 9, "out_channels": 2, "kernel": 3, "stride": 2, "pad": 1}, True),
    ({"image": 7, "kernel": 3, "stride": 2, "pad": 1, "swap": True}, True),
    ({"batch": 2, "scale": "constant", "scale_shape": (1, 6, 1, 1)}, True),  # one scale, 2 images
    ({"scale": "constant", "scale_shape": (6, 1, 1)}, True),
    ({"scale": "constant", "scale_shape": (1,)}, True),
    ({"scale": "computed", "scale_shape": (6, 1, 1)}, True),
    ({"batch": 2}, False),  # a scale per image: one weight tensor cannot serve both
    ({"groups": 2, "out_channels": 4}, False),
    ({"second_use": True}, False),
    ({"scale": "image"}, False),
    ({"image": 3, "out_channels": 16, "kernel": 3, "pad": 1}, False),  # 864 weights > 54 values
    ({"image": 1, "channels": 3, "out_channels": 2}, False),  # 1x1 image: 6 weights > 3 values
]


@pytest.mark.parametrize("case,moved", CASES)
def test_a_channel_scale_moves_into_the_weights_only_where_it_is_exact_and_smaller(case, moved):
    rng = np.random.default_rng(len(str(case)))
    mod, shape = _se_program(rng, **case)
    _check(mod, shape, rng, moved)


@pytest.mark.parametrize("seed", range(6))
def test_random_squeeze_excite_programs_compute_what_they_did(seed):
    rng = np.random.default_rng(100 + seed)
    axes = int(rng.integers(1, 3))
    case = {"axes": axes, "channels": int(rng.integers(1, 9)),
            "out_channels": int(rng.integers(1, 5)), "image": int(rng.integers(1, 10)),
            "kernel": int(rng.choice([1, 3])), "stride": int(rng.choice([1, 2])),
            "swap": bool(rng.integers(2))}
    case["pad"] = case["kernel"] // 2
    mod, shape = _se_program(rng, **case)
    weights = case["out_channels"] * case["channels"] * case["kernel"] ** axes
    _check(mod, shape, rng, moved=weights < int(np.prod(shape)))


class _SqueezeExcite(torch.nn.Module):
    """An inverted residual's tail as torchvision writes it: depthwise conv, SiLU, squeeze-excite
    scale, 1x1 projection with its batch norm."""

    def __init__(self, channels=32, squeezed=8, out=16):
        super().__init__()
        self.dw = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.fc1 = torch.nn.Conv2d(channels, squeezed, 1)
        self.fc2 = torch.nn.Conv2d(squeezed, channels, 1)
        self.project = torch.nn.Conv2d(channels, out, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(out)

    def forward(self, x):
        x = torch.nn.functional.silu(self.dw(x))
        s = torch.sigmoid(self.fc2(torch.nn.functional.silu(self.fc1(x.mean((2, 3), True)))))
        return self.bn(self.project(x * s))


def test_a_squeeze_excite_block_from_pytorch_moves_its_scale_and_keeps_its_output():
    torch.manual_seed(0)
    block = _SqueezeExcite().eval()
    with torch.no_grad():
        block.bn.running_mean.uniform_(-1, 1)
        block.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 32, 12, 12)
    mod, inputs = load_torch(block, (x,))
    folded, notes = fold_weights(mod)
    assert any("input x scale per channel (32)" in str(n) for n in notes), notes
    # the importer writes SiLU as x * sigmoid(x): one input-sized multiply of two is left
    full = (1, 32, 12, 12)
    assert _multiplies(mod).count(full) == 2 and _multiplies(folded).count(full) == 1
    with torch.no_grad():
        want = block(x).numpy()
    target = host_target(1)
    for strategy in ("costfuse", "tvm"):
        ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(strategy, target))
        np.testing.assert_allclose(run(ex, inputs)[0], want, rtol=1e-4, atol=1e-4)
