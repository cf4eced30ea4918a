"""Row reductions and elementwise kernels whose rows are not a whole number of vectors.

Attention over ViT's 197 tokens, wav2vec2's 3199-frame GroupNorm: the rows are vectorized as
whole vectors plus a scalar tail (rfactor partials for the reductions), every block runs per
row under one parallel loop, and softmax multiplies by its row's reciprocal. Numerics are
checked against NumPy on the host's ISA and on generic x86-64; structure (scheduled TIR and
the assembly LLVM makes of it) on explicit AVX2 and AVX-512 targets.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from test_schedules_cpu import AVX2, AVX512, GENERIC, TARGET, _graph, _loops
from tvm import relax, tirx
from tvm_costfuse.schedules import Fallback, RowReduction, int32_partition_loops
from tvm_costfuse.schedules._loops import PARTITION_HINT

from tvm_costfuse.measurement.timing import run
from tvm_costfuse.pipelines import fuse
from tvm_costfuse.strategies import strategy_pipeline

OP = relax.op
_RNG = np.random.default_rng(3)
_G, _B = (_RNG.standard_normal(s).astype("float32") for s in ((6,), (6,)))
_W = _RNG.standard_normal(100).astype("float32")


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _norm(x, axis=-1, eps=1e-5):
    mean = x.mean(axis, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis, keepdims=True) + eps)


_erf = np.vectorize(math.erf, otypes=[np.float64])

# name -> (Relax builder, input shapes, NumPy reference of the input)
CASES = {
    "scaled_softmax_197": (
        lambda bb, x: OP.nn.softmax(OP.multiply(x, relax.const(0.125, "float32")), axis=-1),
        {"x": (4, 3, 197)}, lambda x: _softmax(x * 0.125)),
    "layernorm_100": (
        lambda bb, x: OP.nn.layer_norm(x, relax.const(_W), relax.const(_W[::-1].copy()),
                                       axes=[-1]),
        {"x": (5, 100)}, lambda x: _norm(x) * _W + _W[::-1]),
    "groupnorm_101": (
        lambda bb, x: OP.nn.group_norm(x, relax.const(_G), relax.const(_B), num_groups=6,
                                       channel_axis=1, axes=[2]),
        {"x": (1, 6, 101)}, lambda x: _norm(x) * _G[:, None] + _B[:, None]),
    "rmsnorm_100": (
        lambda bb, x: OP.nn.rms_norm(x, relax.const(_W), axes=[-1]),
        {"x": (7, 100)}, lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * _W),
    "gelu_150": (lambda bb, x: OP.nn.gelu(x), {"x": (3, 7, 150)},
                 lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
    # GPT-2's GELU as its modeling code writes it: pow(x, 3.0) becomes two multiplies
    "gelu_tanh_pow_150": (
        lambda bb, x: OP.multiply(OP.multiply(x, relax.const(0.5, "float32")), OP.add(
            relax.const(1.0, "float32"), OP.tanh(OP.multiply(relax.const(0.7978845608, "float32"),
                OP.add(x, OP.multiply(relax.const(0.044715, "float32"),
                                      OP.power(x, relax.const(3.0, "float32")))))))),
        {"x": (3, 150)},
        lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))),
    # ViT's attention-probability reshape: a copy whose legalized indices divide by 197
    "reshape_12x197x197": (lambda bb, x: OP.reshape(x, (12, 197, 197)), {"x": (1, 12, 197, 197)},
                           lambda x: x.reshape(12, 197, 197)),
    "add_tanh_3199": (lambda bb, x: OP.tanh(OP.add(x, x)), {"x": (1, 16, 3199)},
                      lambda x: np.tanh(2 * x)),
}


@pytest.mark.parametrize("target", [TARGET, GENERIC], ids=["host", "generic"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_ragged_rows_match_numpy(name, target):
    build, shapes, reference = CASES[name]
    mod, inputs = _graph(build, shapes)
    ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target))
    want = reference(inputs["x"].astype("float64"))
    np.testing.assert_allclose(run(ex, inputs)[0], want, rtol=1e-4, atol=1e-5)


def _kernel_of(build, shape, target=AVX512) -> tirx.PrimFunc:
    """The last fused PrimFunc FuseOps makes of ``build`` on one input of ``shape``."""
    fused = fuse(_graph(build, {"x": shape})[0], target, relax.transform.FuseOps())
    return [f for _, f in fused.functions_items() if isinstance(f, tirx.PrimFunc)][-1]


def _kernel(name: str, target) -> tirx.PrimFunc:
    """Case ``name``'s reduction kernel (or its one elementwise kernel): FuseOps puts it last."""
    build, shapes, _ = CASES[name]
    return _kernel_of(build, shapes["x"], target)


def _vector_ops(func: tirx.PrimFunc, target, reg: str) -> set[str]:
    """Mnemonics of the instructions LLVM emits for ``func`` that touch a ``reg`` register
    (``%ymm``: AVX2, ``%zmm``: AVX-512)."""
    mod = int32_partition_loops(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}))
    lines = [ln.split(None, 1) for ln in tvm.compile(mod, target).mod.inspect_source("s")
             .splitlines()]
    return {ln[0] for ln in lines if len(ln) == 2 and reg in ln[1]}


@pytest.mark.parametrize(("target", "lanes", "reg"), [(AVX2, 8, "%ymm"), (AVX512, 16, "%zmm")],
                         ids=["avx2", "avx512"])
def test_ragged_softmax_is_one_parallel_row_loop_of_vectors(target, lanes, reg):
    sch = RowReduction().apply(_kernel("scaled_softmax_197", target), target, False)
    assert sch is not None
    func = sch.mod["main"]
    root = func.body.block.body
    assert isinstance(root, tirx.For) and root.kind == tirx.ForKind.PARALLEL
    assert int(root.extent) == 12  # 4 x 3 rows, every block under the one loop
    vec = [lp for lp in _loops(func) if lp.kind == tirx.ForKind.VECTORIZED]
    assert vec and all(int(lp.extent) == lanes for lp in vec)
    hinted = [lp for lp in _loops(func) if PARTITION_HINT in lp.annotations]
    assert len(hinted) == 4  # max and sum partials, exp, the normalization
    assert "T_softmax_exp[v0, v1, v2] /" not in func.script()  # times a row reciprocal
    ops = _vector_ops(func, target, reg)
    assert {"vmaxps", "vaddps", "vmulps"} <= ops  # max and sum partials, the normalization
    assert "vdivps" not in ops


@pytest.mark.parametrize(("target", "reg"), [(AVX2, "%ymm"), (AVX512, "%zmm")],
                         ids=["avx2", "avx512"])
@pytest.mark.parametrize("name", ["groupnorm_101", "layernorm_100"])
def test_tuple_reductions_of_norms_are_vectorized(name, target, reg):
    """Group and layer norm reduce sum and sum of squares in one block (a tuple reducer):
    both get vector partials (vector adds and FMAs on the target's registers)."""
    sch = RowReduction().apply(_kernel(name, target), target, False)
    assert sch is not None
    ops = _vector_ops(sch.mod["main"], target, reg)
    assert "vaddps" in ops and ops & {"vfmadd231ps", "vfmadd213ps", "vfmadd132ps", "vmulps"}


@pytest.mark.parametrize(("target", "lanes"), [(AVX2, 8), (AVX512, 16)], ids=["avx2", "avx512"])
def test_ragged_elementwise_row_is_vectors_and_a_tail(target, lanes):
    func = Fallback().apply(_kernel("add_tanh_3199", target), target, False).mod["main"]
    vec = [lp for lp in _loops(func) if lp.kind == tirx.ForKind.VECTORIZED]
    assert [int(lp.extent) for lp in vec] == [lanes]
    assert any(PARTITION_HINT in lp.annotations for lp in _loops(func))


@pytest.mark.parametrize(("exponent", "kept"), [(2.0, False), (3.0, False), (4.0, False),
                                                (2.5, True), (5.0, True)])
def test_small_integer_powers_become_multiplies(exponent, kept):
    from tvm_costfuse.schedules.fast_math import fast_math_pass

    func = _kernel_of(lambda bb, x: OP.power(x, relax.const(exponent, "float32")), (4, 64))
    out = fast_math_pass(tvm.IRModule({"k": func}))["k"].script()
    assert ("T.pow(" in out) == kept


@pytest.mark.parametrize(("target", "reg"), [(AVX2, "%ymm"), (AVX512, "%zmm")],
                         ids=["avx2", "avx512"])
def test_reshape_of_ragged_rows_loads_whole_vectors(target, reg):
    """The reshape's ``j // 197`` and ``j % 197`` simplify away over the block's domain, so
    the vector loads stay contiguous (no gather)."""
    func = Fallback().apply(_kernel("reshape_12x197x197", target), target, False).mod["main"]
    ops = _vector_ops(func, target, reg)
    assert "vmovups" in ops and not any("gather" in op for op in ops)
