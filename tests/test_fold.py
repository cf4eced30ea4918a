"""Weight folding (fold.py): batch norms fold into convolutions, summed convolution branches of
one input become one convolution, and the program computes what it did.

The fuzzer draws branch programs with adversarial extents (1x1 and odd images, strides 2,
groups and depthwise, dilation, asymmetric padding, identity branches, a branch with a second
use) and compares the folded program with the unfolded one, both built by TVM; the frontends'
own forms (conv bias, batch norm tuples) come from PyTorch modules through ``torch.export``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from tvm_costfuse.fold import fold_weights
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.models import load_torch
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.report.explain import explain
from tvm_costfuse.strategies import strategy_pipeline


def _ops(mod: tvm.IRModule, name: str) -> int:
    count = 0

    def visit(expr):
        nonlocal count
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name:
            count += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return count


def _build(mod: tvm.IRModule):
    return tvm.compile(mod, "llvm")  # TVM's default pipeline: numerics, not speed


def _conv_bn(bb, x, weight, rng, dtype="float32", stats=None, **conv):
    """conv2d then batch_norm (gamma, beta, mean, var: ``stats`` or drawn)."""
    channels = weight.shape[0]
    y = bb.emit(relax.op.nn.conv2d(x, relax.const(weight.astype(dtype)), out_dtype=dtype, **conv))
    stats = stats or [rng.uniform(0.5, 2.0, channels) for _ in range(4)]
    vec = [relax.const(np.asarray(v).astype(dtype)) for v in stats]
    return y, bb.emit(relax.TupleGetItem(bb.emit(relax.op.nn.batch_norm(
        y, *vec, axis=1, training=False)), 0))


def _same(mod, folded, shape, rng, dtype="float32"):
    data = {"x": rng.standard_normal(shape).astype(dtype)}
    for a, b in zip(run(_build(folded), data), run(_build(mod), data)):
        assert np.isfinite(a).all() == np.isfinite(b).all()
        np.testing.assert_allclose(a.astype("f8"), b.astype("f8"), atol=1e-3, rtol=1e-3)


_CONV = {1: relax.op.nn.conv1d, 2: relax.op.nn.conv2d, 3: relax.op.nn.conv3d}


def _branch_program(rng: np.random.Generator):
    """A random sum of convolution branches (1-, 2- or 3-d) of one input; the module and the
    input's shape."""
    axes = int(rng.choice([1, 2, 2, 3]))
    cin = int(rng.choice([1, 3, 4, 8]))
    groups = int(rng.choice([g for g in (1, 2, cin) if cin % g == 0]))
    cout = groups * int(rng.choice([1, 2])) if groups == cin else int(rng.choice([2, 4, 6]))
    if cout % groups or rng.random() < 0.5:
        cout = cin  # an identity branch can join
    image = tuple(int(v) for v in rng.choice([1, 2, 5, 7, 9] if axes < 3 else [1, 2, 3, 5],
                                             size=axes))
    stride, dilation = int(rng.choice([1, 2])), int(rng.choice([1, 1, 2]))
    identity_ok = stride == 1 and cout == cin
    shape = (1, cin, *image)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    conv = _CONV[axes]

    def consts(*dims):
        return relax.const(rng.standard_normal(dims).astype("float32"))

    def positive(n):
        return relax.const(rng.uniform(0.5, 2.0, n).astype("float32"))

    outputs = []
    with bb.function("main", [x]):
        with bb.dataflow():
            branches = []
            for _ in range(int(rng.integers(2, 4))):
                kind = rng.choice(["centred", "centred", "asymmetric", "identity"])
                if kind == "identity" and identity_ok:
                    y = x
                elif kind == "asymmetric" and stride == 1 and dilation == 1:
                    y = bb.emit(conv(x, consts(cout, cin // groups, *(2,) * axes),
                                     padding=(1,) * axes + (0,) * axes, groups=groups))
                else:
                    k = int(rng.choice([1, 3, 5]))
                    pad = dilation * (k - 1) // 2
                    y = bb.emit(conv(x, consts(cout, cin // groups, *(k,) * axes),
                                     strides=stride, padding=pad, dilation=dilation,
                                     groups=groups))
                channels = cin if y is x else cout
                if rng.random() < 0.5 and y is not x:
                    y = bb.emit(relax.op.add(y, consts(1, channels, *(1,) * axes)))
                if rng.random() < 0.7:
                    bn = bb.emit(relax.op.nn.batch_norm(
                        y, positive(channels), consts(channels), consts(channels),
                        positive(channels), axis=1, epsilon=1e-5, training=False))
                    y = bb.emit(relax.TupleGetItem(bn, 0))
                branches.append(y)
            shapes = {tuple(int(d) for d in b.ty.shape.values) for b in branches}
            if len(shapes) > 1:  # an identity next to a strided branch: drop it
                branches = [b for b in branches if b is not x] or branches[:1]
            total = branches[0]
            for b in branches[1:]:
                total = bb.emit(relax.op.add(total, b))
            outputs.append(bb.emit(relax.op.nn.relu(total)))
            if rng.random() < 0.3 and branches[0] is not x:
                outputs.append(branches[0])  # a second use: must not be folded away
            out = bb.emit_output(relax.Tuple(outputs) if len(outputs) > 1 else outputs[0])
        bb.emit_func_output(out)
    return bb.get(), shape


@pytest.mark.parametrize("seed", range(18))
def test_folded_branch_programs_compute_what_they_did(seed):
    rng = np.random.default_rng(seed)
    mod, shape = _branch_program(rng)
    folded, notes = fold_weights(mod)
    data = {"x": rng.standard_normal(shape).astype("float32")}
    want = run(_build(mod), data)
    got = run(_build(folded), data)
    assert len(want) == len(got)
    for a, b in zip(got, want):
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, atol=2e-5 * scale, rtol=1e-4)
    # folding only ever removes work, and never computes a convolution twice
    assert _ops(folded, "relax.nn.conv2d") <= _ops(mod, "relax.nn.conv2d")
    assert _ops(folded, "relax.nn.batch_norm") == 0  # every inference batch norm folds
    assert notes or not _ops(mod, "relax.nn.batch_norm")
    assert fold_weights(folded)[1] == []  # a folded program folds no further


def test_mergeable_branches_become_one_convolution():
    """RepVGG's block: 3x3 + BN, 1x1 + BN, identity BN, summed -> one 3x3 with a bias."""

    class Block(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.k3 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.k1 = torch.nn.Conv2d(c, c, 1, bias=True)
            self.bn3, self.bn1, self.bnid = (torch.nn.BatchNorm2d(c) for _ in range(3))

        def forward(self, x):
            return torch.relu(self.bn3(self.k3(x)) + self.bn1(self.k1(x)) + self.bnid(x))

    torch.manual_seed(0)
    block = Block(6).eval()
    with torch.no_grad():
        for bn in (block.bn3, block.bn1, block.bnid):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    x = torch.randn(1, 6, 7, 5)
    mod, inputs = load_torch(block, (x,))
    folded, notes = fold_weights(mod)
    assert _ops(folded, "relax.nn.conv2d") == 1 and _ops(folded, "relax.nn.batch_norm") == 0
    assert len(notes) == 1 and notes[0].what.startswith("3 branches summed")
    assert notes[0].what.endswith("-> conv2d 3x3 + bias")
    target = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 1})
    ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("costfuse", target))
    want = block(x).detach().numpy()
    np.testing.assert_allclose(run(ex, inputs)[0], want, atol=2e-5, rtol=1e-4)


def test_batch_norm_after_biased_conv_and_alone():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, bias=True)
            self.bn = torch.nn.BatchNorm2d(4)
            self.lone = torch.nn.BatchNorm2d(4)

        def forward(self, x):
            y = torch.relu(self.bn(self.conv(x)))
            return self.lone(y * y)

    torch.manual_seed(1)
    net = Net().eval()
    with torch.no_grad():
        for bn in (net.bn, net.lone):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 9, 8)
    mod, inputs = load_torch(net, (x,))
    folded, notes = fold_weights(mod)
    whats = sorted(n.what for n in notes)
    assert whats == ["batch_norm -> multiply-add",
                     "conv2d 3x3 + add + batch_norm -> conv2d 3x3 + bias"]
    assert _ops(folded, "relax.nn.batch_norm") == 0
    np.testing.assert_allclose(run(_build(folded), inputs)[0], net(x).detach().numpy(),
                               atol=2e-5, rtol=1e-4)
    # the caller's module is left as it was
    assert _ops(mod, "relax.nn.batch_norm") == 2


def test_unfolded_pipeline_and_explain_report():
    mod = _branch_program(np.random.default_rng(3))[0]
    folded, notes = fold_weights(mod)
    prepared_plain = prepare(mod, "llvm", fold=False)
    prepared = prepare(mod, "llvm")
    tvm.ir.assert_structural_equal(prepared, prepare(folded, "llvm", fold=False))
    assert notes
    assert len(prepared["main"].body.blocks[0].bindings) < len(
        prepared_plain["main"].body.blocks[0].bindings)
    report = explain(mod, "host")
    assert report["folded"] == [str(n) for n in notes]


def test_a_batch_norm_whose_statistics_are_read_keeps_its_convolution():
    """Were the convolution folded into the normalized item while the tuple's running mean is
    read too, the batch norm would stay alive on a second copy of the convolution."""
    rng = np.random.default_rng(5)
    x = relax.Var("x", relax.TensorType((1, 3, 6, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(
                x, relax.const(rng.standard_normal((4, 3, 3, 3)).astype("float32")), padding=1))
            vec = [relax.const(rng.uniform(0.5, 2.0, 4).astype("float32")) for _ in range(4)]
            bn = bb.emit(relax.op.nn.batch_norm(conv, *vec, axis=1, training=False))
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0))))
            mean = bb.emit(relax.TupleGetItem(bn, 1))
            out = bb.emit_output(relax.Tuple([y, mean]))
        bb.emit_func_output(out)
    mod = bb.get()
    folded, notes = fold_weights(mod)
    assert [n.what for n in notes] == ["batch_norm -> multiply-add"]
    assert _ops(folded, "relax.nn.conv2d") == 1
    data = {"x": rng.standard_normal((1, 3, 6, 6)).astype("float32")}
    for a, b in zip(run(_build(folded), data), run(_build(mod), data)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_a_dynamic_batch_folds_too():
    """ONNX models often come with a symbolic batch: the channels and the image are all a fold
    needs to know."""
    rng = np.random.default_rng(7)
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 4, 7, 5), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            bn = _conv_bn(bb, x, rng.standard_normal((4, 4, 3, 3)), rng, padding=1)[1]
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.add(bn, x))))
        bb.emit_func_output(out)
    mod = bb.get()
    folded, notes = fold_weights(mod)
    assert [n.what for n in notes] == [
        "2 branches summed (conv2d 3x3 + batch_norm; identity) -> conv2d 3x3 + bias"]
    data = {"x": rng.standard_normal((3, 4, 7, 5)).astype("float32")}
    np.testing.assert_allclose(run(_build(folded), data)[0], run(_build(mod), data)[0],
                               atol=2e-5, rtol=1e-4)


def test_edge_programs_fold_safely_or_not_at_all():
    """What a review found: a function without a dataflow block, a float16 weight that would
    overflow once scaled, a constant that widens a one-channel convolution, a convolution also
    returned, and branches whose merged kernel would have more taps than both (3x1 + 1x3)."""
    rng = np.random.default_rng(11)
    x = relax.Var("x", relax.TensorType((1, 3, 6, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):  # no dataflow block
        out = _conv_bn(bb, x, rng.standard_normal((4, 3, 3, 3)), rng, padding=1)[1]
        bb.emit_func_output(out)
    mod = bb.get()
    folded, notes = fold_weights(mod)
    assert len(notes) == 1
    _same(mod, folded, (1, 3, 6, 6), rng)

    x16 = relax.Var("x", relax.TensorType((1, 3, 6, 6), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x16]):
        with bb.dataflow():
            big = np.full((4, 3, 3, 3), 200.0)  # times 2 / sqrt(1e-5): past float16's 65504
            stats = [np.full(4, 2.0), np.zeros(4), np.zeros(4), np.zeros(4)]
            out = bb.emit_output(_conv_bn(bb, x16, big, rng, "float16", stats, padding=1)[1])
        bb.emit_func_output(out)
    assert fold_weights(bb.get())[1] == []

    for case in ("widen", "returned", "cross"):
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                if case == "widen":  # (1, 1, 6, 6) + (1, 5, 1, 1) -> 5 channels
                    one = bb.emit(relax.op.nn.conv2d(
                        x, relax.const(rng.standard_normal((1, 3, 3, 3)).astype("float32")),
                        padding=1))
                    wide = bb.emit(relax.op.add(one, relax.const(
                        rng.standard_normal((1, 5, 1, 1)).astype("float32"))))
                    out = bb.emit_output(relax.op.nn.relu(wide))
                elif case == "returned":
                    conv, normed = _conv_bn(bb, x, rng.standard_normal((4, 3, 3, 3)), rng,
                                            padding=1)
                    out = bb.emit_output(relax.Tuple([conv, normed]))
                else:
                    tall = bb.emit(relax.op.nn.conv2d(x, relax.const(
                        rng.standard_normal((3, 3, 3, 1)).astype("float32")), padding=(1, 0)))
                    wide = bb.emit(relax.op.nn.conv2d(x, relax.const(
                        rng.standard_normal((3, 3, 1, 3)).astype("float32")), padding=(0, 1)))
                    out = bb.emit_output(relax.op.add(tall, wide))
            bb.emit_func_output(out)
        mod = bb.get()
        folded, notes = fold_weights(mod)
        if case == "cross":
            assert notes == [] and _ops(folded, "relax.nn.conv2d") == 2
        if case == "returned":  # the batch norm folds, into a multiply-add: one convolution
            assert _ops(folded, "relax.nn.conv2d") == 1
        _same(mod, folded, (1, 3, 6, 6), rng)
