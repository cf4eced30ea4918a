"""The CostFuse pass, Before/Expected in TVMScript (the style of TVM's own Relax pass tests).

Each ``Before`` is a high-level Relax module; ``_check`` runs what TVM runs before FuseOps
(``pipelines.prepare``) and then ``CostFuse`` priced on the H100 preset (a fixed description,
so no case depends on this host), and compares with ``Expected`` structurally.
"""

import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import tvm_costfuse
from tvm_costfuse.pipelines import prepare


def _check(before: tvm.IRModule, expected: tvm.IRModule) -> None:
    after = tvm_costfuse.CostFuse(target="h100")(prepare(before, "llvm"))
    tvm.ir.assert_structural_equal(after, expected)


@I.ir_module
class ChainBefore:
    @R.function
    def main(x: R.Tensor((8, 16), "float32")) -> R.Tensor((8, 16), "float32"):
        with R.dataflow():
            a = R.add(x, x)
            b = R.exp(a)
            c = R.multiply(b, x)
            R.output(c)
        return c


@I.ir_module
class ChainExpected:
    @T.prim_func(private=True, s_tir=True)
    def add(x: T.Buffer((T.int64(8), T.int64(16)), "float32"), x_1: T.Buffer((T.int64(8), T.int64(16)), "float32"), T_add: T.Buffer((T.int64(8), T.int64(16)), "float32")):
        T.func_attr({"op_pattern": 0, "tirx.noalias": True})
        # with T.sblock("root"):
        for ax0, ax1 in T.grid(T.int64(8), T.int64(16)):
            with T.sblock("T_add"):
                v_ax0, v_ax1 = T.axis.remap("SS", [ax0, ax1])
                T.reads(x[v_ax0, v_ax1], x_1[v_ax0, v_ax1])
                T.writes(T_add[v_ax0, v_ax1])
                T_add[v_ax0, v_ax1] = x[v_ax0, v_ax1] + x_1[v_ax0, v_ax1]

    @T.prim_func(private=True, s_tir=True)
    def multiply(b: T.Buffer((T.int64(8), T.int64(16)), "float32"), x: T.Buffer((T.int64(8), T.int64(16)), "float32"), T_multiply: T.Buffer((T.int64(8), T.int64(16)), "float32")):
        T.func_attr({"op_pattern": 0, "tirx.noalias": True})
        # with T.sblock("root"):
        for ax0, ax1 in T.grid(T.int64(8), T.int64(16)):
            with T.sblock("T_multiply"):
                v_ax0, v_ax1 = T.axis.remap("SS", [ax0, ax1])
                T.reads(b[v_ax0, v_ax1], x[v_ax0, v_ax1])
                T.writes(T_multiply[v_ax0, v_ax1])
                T_multiply[v_ax0, v_ax1] = b[v_ax0, v_ax1] * x[v_ax0, v_ax1]

    @T.prim_func(private=True, s_tir=True)
    def tir_exp(a: T.Buffer((T.int64(8), T.int64(16)), "float32"), compute: T.Buffer((T.int64(8), T.int64(16)), "float32")):
        T.func_attr({"op_pattern": 0, "tirx.noalias": True})
        # with T.sblock("root"):
        for i0, i1 in T.grid(T.int64(8), T.int64(16)):
            with T.sblock("compute"):
                v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                T.reads(a[v_i0, v_i1])
                T.writes(compute[v_i0, v_i1])
                compute[v_i0, v_i1] = T.exp(a[v_i0, v_i1])

    @R.function(private=True)
    def fused_add_tir_exp_multiply(x: R.Tensor((8, 16), dtype="float32")) -> R.Tensor((8, 16), dtype="float32"):
        R.func_attr({"Primitive": True})
        cls = ChainExpected
        with R.dataflow():
            a = R.call_tir(cls.add, (x, x), out_ty=R.Tensor((8, 16), dtype="float32"))
            b = R.call_tir(cls.tir_exp, (a,), out_ty=R.Tensor((8, 16), dtype="float32"))
            gv = R.call_tir(cls.multiply, (b, x), out_ty=R.Tensor((8, 16), dtype="float32"))
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((8, 16), dtype="float32")) -> R.Tensor((8, 16), dtype="float32"):
        cls = ChainExpected
        with R.dataflow():
            gv: R.Tensor((8, 16), dtype="float32") = cls.fused_add_tir_exp_multiply(x)
            R.output(gv)
        return gv


def test_elementwise_chain() -> None:
    """An elementwise chain becomes one kernel."""
    _check(ChainBefore, ChainExpected)


@I.ir_module
class ReduceEpilogueBefore:
    @R.function
    def main(x: R.Tensor((8, 16), "float32")) -> R.Tensor((8, 1), "float32"):
        with R.dataflow():
            s = R.sum(x, axis=[1], keepdims=True)
            e = R.multiply(s, R.const(0.5, "float32"))
            R.output(e)
        return e


@I.ir_module
class ReduceEpilogueExpected:
    @T.prim_func(private=True, s_tir=True)
    def multiply(s: T.Buffer((T.int64(8), T.int64(1)), "float32"), T_multiply: T.Buffer((T.int64(8), T.int64(1)), "float32")):
        T.func_attr({"op_pattern": 0, "tirx.noalias": True})
        # with T.sblock("root"):
        for ax0, ax1 in T.grid(T.int64(8), T.int64(1)):
            with T.sblock("T_multiply"):
                v_ax0, v_ax1 = T.axis.remap("SS", [ax0, ax1])
                T.reads(s[v_ax0, v_ax1])
                T.writes(T_multiply[v_ax0, v_ax1])
                T_multiply[v_ax0, v_ax1] = s[v_ax0, v_ax1] * T.float32(0.5)

    @T.prim_func(private=True, s_tir=True)
    def sum(x: T.Buffer((T.int64(8), T.int64(16)), "float32"), x_red: T.Buffer((T.int64(8), T.int64(1)), "float32")):
        T.func_attr({"op_pattern": 3, "tirx.noalias": True})
        # with T.sblock("root"):
        for ax0, ax1, k1 in T.grid(T.int64(8), T.int64(1), T.int64(16)):
            with T.sblock("x_red"):
                v_ax0, v_ax1, v_k1 = T.axis.remap("SSR", [ax0, ax1, k1])
                T.reads(x[v_ax0, v_k1])
                T.writes(x_red[v_ax0, v_ax1])
                with T.init():
                    x_red[v_ax0, v_ax1] = T.float32(0.0)
                x_red[v_ax0, v_ax1] = x_red[v_ax0, v_ax1] + x[v_ax0, v_k1]

    @R.function(private=True)
    def fused_sum_multiply(x: R.Tensor((8, 16), dtype="float32")) -> R.Tensor((8, 1), dtype="float32"):
        R.func_attr({"Primitive": True})
        cls = ReduceEpilogueExpected
        with R.dataflow():
            s = R.call_tir(cls.sum, (x,), out_ty=R.Tensor((8, 1), dtype="float32"))
            gv = R.call_tir(cls.multiply, (s,), out_ty=R.Tensor((8, 1), dtype="float32"))
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((8, 16), dtype="float32")) -> R.Tensor((8, 1), dtype="float32"):
        cls = ReduceEpilogueExpected
        with R.dataflow():
            gv: R.Tensor((8, 1), dtype="float32") = cls.fused_sum_multiply(x)
            R.output(gv)
        return gv


def test_reduce_with_epilogue() -> None:
    """A reduction and its elementwise epilogue share a kernel (FuseOps never starts a group at a reduction)."""
    _check(ReduceEpilogueBefore, ReduceEpilogueExpected)


@I.ir_module
class HorizontalBefore:
    @R.function
    def main(x: R.Tensor((8, 16), "float32")) -> R.Tuple(R.Tensor((8, 16), "float32"), R.Tensor((8, 16), "float32")):
        with R.dataflow():
            y = R.nn.softmax(x, axis=-1)
            a = R.exp(y)
            b = R.negative(y)
            out = (a, b)
            R.output(out)
        return out


@I.ir_module
class HorizontalExpected:
    @T.prim_func(private=True, s_tir=True)
    def softmax(x: T.Buffer((T.int64(8), T.int64(16)), "float32"), T_softmax_norm: T.Buffer((T.int64(8), T.int64(16)), "float32")):
        T.func_attr({"op_pattern": 4, "tirx.noalias": True})
        # with T.sblock("root"):
        T_softmax_maxelem = T.sblock_alloc_buffer((T.int64(8),))
        T_softmax_exp = T.sblock_alloc_buffer((T.int64(8), T.int64(16)))
        T_softmax_expsum = T.sblock_alloc_buffer((T.int64(8),))
        for i0, k in T.grid(T.int64(8), T.int64(16)):
            with T.sblock("T_softmax_maxelem"):
                v_i0, v_k = T.axis.remap("SR", [i0, k])
                T.reads(x[v_i0, v_k])
                T.writes(T_softmax_maxelem[v_i0])
                with T.init():
                    T_softmax_maxelem[v_i0] = T.float32(-340282346638528859811704183484516925440.0)
                T_softmax_maxelem[v_i0] = T.max(T_softmax_maxelem[v_i0], x[v_i0, v_k])
        for i0, i1 in T.grid(T.int64(8), T.int64(16)):
            with T.sblock("T_softmax_exp"):
                v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                T.reads(x[v_i0, v_i1], T_softmax_maxelem[v_i0])
                T.writes(T_softmax_exp[v_i0, v_i1])
                T_softmax_exp[v_i0, v_i1] = T.exp(x[v_i0, v_i1] - T_softmax_maxelem[v_i0])
        for i0, k in T.grid(T.int64(8), T.int64(16)):
            with T.sblock("T_softmax_expsum"):
                v_i0, v_k = T.axis.remap("SR", [i0, k])
                T.reads(T_softmax_exp[v_i0, v_k])
                T.writes(T_softmax_expsum[v_i0])
                with T.init():
                    T_softmax_expsum[v_i0] = T.float32(0.0)
                T_softmax_expsum[v_i0] = T_softmax_expsum[v_i0] + T_softmax_exp[v_i0, v_k]
        for i0, i1 in T.grid(T.int64(8), T.int64(16)):
            with T.sblock("T_softmax_norm"):
                v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                T.reads(T_softmax_exp[v_i0, v_i1], T_softmax_expsum[v_i0])
                T.writes(T_softmax_norm[v_i0, v_i1])
                T.sblock_attr({"axis": 1})
                T_softmax_norm[v_i0, v_i1] = T_softmax_exp[v_i0, v_i1] / T_softmax_expsum[v_i0]

    @T.prim_func(private=True, s_tir=True)
    def tir_exp(y: T.Buffer((T.int64(8), T.int64(16)), "float32"), compute: T.Buffer((T.int64(8), T.int64(16)), "float32")):
        T.func_attr({"op_pattern": 0, "tirx.noalias": True})
        # with T.sblock("root"):
        for i0, i1 in T.grid(T.int64(8), T.int64(16)):
            with T.sblock("compute"):
                v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                T.reads(y[v_i0, v_i1])
                T.writes(compute[v_i0, v_i1])
                compute[v_i0, v_i1] = T.exp(y[v_i0, v_i1])

    @T.prim_func(private=True, s_tir=True)
    def tir_negative(y: T.Buffer((T.int64(8), T.int64(16)), "float32"), compute: T.Buffer((T.int64(8), T.int64(16)), "float32")):
        T.func_attr({"op_pattern": 0, "tirx.noalias": True})
        # with T.sblock("root"):
        for i0, i1 in T.grid(T.int64(8), T.int64(16)):
            with T.sblock("compute"):
                v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                T.reads(y[v_i0, v_i1])
                T.writes(compute[v_i0, v_i1])
                compute[v_i0, v_i1] = y[v_i0, v_i1] * T.float32(-1.0)

    @R.function(private=True)
    def fused_softmax_tir_exp_tir_negative(x: R.Tensor((8, 16), dtype="float32")) -> R.Tuple(R.Tensor((8, 16), dtype="float32"), R.Tensor((8, 16), dtype="float32")):
        R.func_attr({"Primitive": True})
        cls = HorizontalExpected
        with R.dataflow():
            y = R.call_tir(cls.softmax, (x,), out_ty=R.Tensor((8, 16), dtype="float32"))
            gv = R.call_tir(cls.tir_exp, (y,), out_ty=R.Tensor((8, 16), dtype="float32"))
            gv1 = R.call_tir(cls.tir_negative, (y,), out_ty=R.Tensor((8, 16), dtype="float32"))
            R.output(gv, gv1)
        return (gv, gv1)

    @R.function
    def main(x: R.Tensor((8, 16), dtype="float32")) -> R.Tuple(R.Tensor((8, 16), dtype="float32"), R.Tensor((8, 16), dtype="float32")):
        cls = HorizontalExpected
        with R.dataflow():
            lv: R.Tuple(R.Tensor((8, 16), dtype="float32"), R.Tensor((8, 16), dtype="float32")) = cls.fused_softmax_tir_exp_tir_negative(x)
            lv1: R.Tensor((8, 16), dtype="float32") = lv[0]
            lv2: R.Tensor((8, 16), dtype="float32") = lv[1]
            out: R.Tuple(R.Tensor((8, 16), dtype="float32"), R.Tensor((8, 16), dtype="float32")) = lv1, lv2
            R.output(out)
        return out


def test_horizontal_pair_through_producer() -> None:
    """Two siblings reading one producer join it: one kernel with two outputs."""
    _check(HorizontalBefore, HorizontalExpected)


@I.ir_module
class SymbolicBefore:
    @R.function
    def main(x: R.Tensor(("n", 16), "float32")) -> R.Tensor(("n", 16), "float32"):
        n = T.int64()  # noqa: F841 -- declares the shape variable for TVMScript
        with R.dataflow():
            a = R.add(x, x)
            b = R.exp(a)
            R.output(b)
        return b


def test_symbolic_region_left_to_fuseops() -> None:
    """A region with symbolic shapes is left to FuseOps' own grouping: the Expected module is
    FuseOps' output (TVMScript cannot print a symbolic module back in a parseable form here)."""
    prepared = prepare(SymbolicBefore, "llvm")
    expected = relax.transform.FuseOps()(prepared)
    assert sum(1 for gv in expected.functions if gv.name_hint.startswith("fused_")) == 1
    pass_ = tvm_costfuse.CostFuse(target="h100")
    tvm.ir.assert_structural_equal(pass_(prepared), expected)
    assert any("left to FuseOps" in note for note in pass_.plans["main"].notes)
