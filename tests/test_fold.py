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


def _branch_program(rng: np.random.Generator):
    """A random sum of convolution branches of one input (and what should fold)."""
    cin = int(rng.choice([1, 3, 4, 8]))
    groups = int(rng.choice([g for g in (1, 2, cin) if cin % g == 0]))
    cout = groups * int(rng.choice([1, 2])) if groups == cin else int(rng.choice([2, 4, 6]))
    if cout % groups or rng.random() < 0.5:
        cout = cin  # an identity branch can join
    h, w = (int(v) for v in rng.choice([1, 2, 5, 7, 9], size=2))
    stride, dilation = int(rng.choice([1, 2])), int(rng.choice([1, 1, 2]))
    identity_ok = stride == 1 and cout == cin
    x = relax.Var("x", relax.TensorType((1, cin, h, w), "float32"))
    bb = relax.BlockBuilder()

    def consts(*shape):
        return relax.const(rng.standard_normal(shape).astype("float32"))

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
                    y = bb.emit(relax.op.nn.conv2d(x, consts(cout, cin // groups, 2, 2),
                                                   padding=(1, 1, 0, 0), groups=groups))
                else:
                    k = int(rng.choice([1, 3, 5]))
                    pad = dilation * (k - 1) // 2
                    y = bb.emit(relax.op.nn.conv2d(x, consts(cout, cin // groups, k, k),
                                                   strides=stride, padding=pad,
                                                   dilation=dilation, groups=groups))
                channels = cin if y is x else cout
                if rng.random() < 0.5 and y is not x:
                    y = bb.emit(relax.op.add(y, consts(1, channels, 1, 1)))
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
    return bb.get(), cin, h, w


@pytest.mark.parametrize("seed", range(14))
def test_folded_branch_programs_compute_what_they_did(seed):
    rng = np.random.default_rng(seed)
    mod, cin, h, w = _branch_program(rng)
    folded, notes = fold_weights(mod)
    data = {"x": rng.standard_normal((1, cin, h, w)).astype("float32")}
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
            k3 = bb.emit(relax.op.nn.conv2d(
                x, relax.const(rng.standard_normal((4, 4, 3, 3)).astype("float32")), padding=1))
            vec = [relax.const(rng.uniform(0.5, 2.0, 4).astype("float32")) for _ in range(4)]
            bn = bb.emit(relax.TupleGetItem(bb.emit(relax.op.nn.batch_norm(
                k3, *vec, axis=1, training=False)), 0))
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.add(bn, x))))
        bb.emit_func_output(out)
    mod = bb.get()
    folded, notes = fold_weights(mod)
    assert [n.what for n in notes] == [
        "2 branches summed (conv2d 3x3 + batch_norm; identity) -> conv2d 3x3 + bias"]
    data = {"x": rng.standard_normal((3, 4, 7, 5)).astype("float32")}
    np.testing.assert_allclose(run(_build(folded), data)[0], run(_build(mod), data)[0],
                               atol=2e-5, rtol=1e-4)
