"""Relax programs of the kinds TVM's own test suite compiles, which CostFuse's strategies failed
to build: one test per cause, each module built under none / tvm / costfuse and compared with
TVM's stock pipeline (or NumPy)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_costfuse.measurement.timing import run
from tvm_costfuse.strategies import strategy_pipeline

STRATEGIES = ("none", "tvm", "costfuse")
TARGETS = {
    "generic": tvm.target.Target({"kind": "llvm", "num-cores": 2}),
    "avx2": tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2}),
    "avx512": tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}),
}
GENERIC = TARGETS["generic"]


def _outputs(mod, inputs, strategy, target=GENERIC):
    ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(strategy, target))
    return run(ex, inputs)


def _matches_stock(mod, inputs, strategies=STRATEGIES):
    want = _outputs(mod, inputs, "stock")
    for strategy in strategies:
        got = _outputs(mod, inputs, strategy)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=strategy)


REFERENCE = {"sinh": np.sinh, "cosh": np.cosh, "asin": np.arcsin, "atan": np.arctan,
             "asinh": np.arcsinh, "erf": scipy.special.erf, "tan": np.tan}


def _unary(name: str, dtype: str) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 33), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(getattr(relax.op, name)(x))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["sinh", "cosh", "asin", "atan", "asinh", "erf", "tan"])
def test_math_without_a_vector_lowering_builds(name: str, dtype: str, target: str) -> None:
    """sinh and cosh are marked vectorizable but LLVM has only a scalar libm call for them:
    the vectorized loop failed in codegen ("unknown intrinsic tirx.sinh") under every
    strategy. Such a loop stays scalar; the others are here so a new case shows up."""
    mod = _unary(name, dtype)
    x = np.random.default_rng(0).uniform(-0.9, 0.9, (4, 33)).astype(dtype)
    for strategy in STRATEGIES:
        ex = tvm.compile(mod, target=TARGETS[target],
                         relax_pipeline=strategy_pipeline(strategy, TARGETS[target]))
        if target == "generic":
            got = run(ex, {"x": x})[0]
            want = REFERENCE[name](x.astype("float64"))
            np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12,
                                       atol=1e-6)


def test_pow_with_a_tensor_exponent() -> None:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 17), "float32"))
    y = relax.Var("y", relax.TensorType((3, 17), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.power(x, y))
        bb.emit_func_output(out)
    rng = np.random.default_rng(0)
    _matches_stock(bb.get(), {"x": rng.uniform(0.5, 2, (3, 17)).astype("float32"),
                              "y": rng.uniform(-2, 2, (3, 17)).astype("float32")})


@I.ir_module
class NestedTuple:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            a = R.add(x, x)
            t = (a,)
            tt = (t,)
            b = tt[0][0]
            c = R.multiply(b, b)
            R.output(c)
        return c


def test_nested_tuple_item() -> None:
    """``tt[0][0]``: FuseOps puts the inner item in the multiply's group and leaves the outer
    one in the caller; ``fuseops_groups`` could not name the inner one ("cannot attribute
    binding 'b' of FuseOps group")."""
    _matches_stock(NestedTuple, {"x": np.random.default_rng(0).random((4, 8), "float32")})


@I.ir_module
class DotProduct:
    @R.function
    def main(x: R.Tensor((8,), "float32"), y: R.Tensor((8,), "float32")) -> R.Tensor(
            (), "float32"):
        with R.dataflow():
            d = R.matmul(x, y)
            e = R.add(d, R.const(1.0, "float32"))
            R.output(e)
        return e


def test_dot_product_with_a_0d_output() -> None:
    """A matmul of two vectors stores to a 0-d buffer: the contraction matcher indexed its
    last axis (IndexError in the rules and in the cost model's ``describe``)."""
    rng = np.random.default_rng(0)
    x, y = rng.random(8, "float32"), rng.random(8, "float32")
    _matches_stock(DotProduct, {"x": x, "y": y})
    got = _outputs(DotProduct, {"x": x, "y": y}, "costfuse")[0]
    np.testing.assert_allclose(got, x @ y + 1, rtol=1e-6)


@I.ir_module
class InnerRootBlock:
    @T.prim_func(private=True, s_tir=True)
    def add_one(A: T.Buffer((T.int64(4), T.int64(8)), "float32"),
                B: T.Buffer((T.int64(4), T.int64(8)), "float32")):
        for i, j in T.grid(T.int64(4), T.int64(8)):
            with T.sblock("root"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vi, vj] + T.float32(1)

    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        cls = InnerRootBlock
        with R.dataflow():
            a = R.call_tir(cls.add_one, (x,), out_ty=R.Tensor((4, 8), "float32"))
            b = R.multiply(a, a)
            R.output(b)
        return b


def test_inner_block_named_root() -> None:
    """A hand-written kernel whose inner block is called "root" like the function's own: the
    graph looked blocks up by name (ScheduleError: 2 blocks with the name root)."""
    _matches_stock(InnerRootBlock, {"x": np.random.default_rng(0).random((4, 8), "float32")})


@I.ir_module
class PlainLoops:
    @T.prim_func(private=True)
    def add_one(A: T.Buffer((T.int64(4), T.int64(8)), "float32"),
                B: T.Buffer((T.int64(4), T.int64(8)), "float32")):
        for i, j in T.grid(T.int64(4), T.int64(8)):
            B[i, j] = A[i, j] + T.float32(1)

    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        cls = PlainLoops
        with R.dataflow():
            a = R.call_tir(cls.add_one, (x,), out_ty=R.Tensor((4, 8), "float32"))
            R.output(a)
        return a


def test_call_tir_to_a_kernel_of_plain_loops() -> None:
    """No blocks at all: TVM's ``has_reshape_pattern`` fails on such a PrimFunc, and the graph
    asked it of every call_tir."""
    x = np.random.default_rng(0).random((4, 8), "float32")
    _matches_stock(PlainLoops, {"x": x})
    np.testing.assert_allclose(_outputs(PlainLoops, {"x": x}, "costfuse")[0], x + 1)
