"""Horizontal contractions (siblings.py, horizontal.py): sibling matmuls of one input become
one matmul of their weights concatenated, each sibling a slice of its columns, where the cost
model says so.

The fuzzer draws sibling sets with adversarial extents (one row, ragged row counts, widths of
1, 3 and 17 columns beside vector multiples, a batch axis, biases in either operand order,
weights transposed or not, a sibling bound as a dataflow block's output, float16) and compares
CostFuse's build with every set combined against the unfused program built by TVM.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_costfuse.horizontal import MIN_GAIN
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.pipelines import build_pipeline, costfuse_passes, scheduled_pipeline
from tvm_costfuse.pre_fusion import costfuse_model
from tvm_costfuse.siblings import (
    combine_siblings,
    constant_bytes,
    find_siblings,
    sibling_program,
)
from tvm_costfuse.strategies import no_fusion
from tvm_costfuse.transform import CostFuse


def _program(rng, shape, widths, bias, transposed, flip, output_first=False, reshaped=False,
             dtype="float32"):
    """``x @ W_i (+ b_i)`` per width; the frontend's forms: a weight transposed at run time,
    ``add(bias, y)``, the shared input reshaped once per sibling."""
    x = relax.Var("x", relax.TensorType(shape, dtype))
    k = shape[-1]
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for i, n in enumerate(widths):
                w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(dtype)
                rhs = (bb.emit(relax.op.permute_dims(relax.const(w))) if transposed
                       else relax.const(np.ascontiguousarray(w.T)))
                lhs = bb.emit(relax.op.reshape(x, shape)) if reshaped else x
                y = relax.op.matmul(lhs, rhs, out_dtype=dtype)
                if i == 0 and output_first:
                    y = bb.emit_output(y)
                else:
                    y = bb.emit(y)
                if bias:
                    b = relax.const(rng.standard_normal(n).astype(dtype))
                    y = bb.emit(relax.op.add(b, y) if flip else relax.op.add(y, b))
                outs.append(y)
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def _costfuse(horizontal: str) -> CostFuse:
    return CostFuse(target="llvm", horizontal=horizontal)


def _built(mod, fusion, target="llvm"):
    return tvm.compile(mod, target, relax_pipeline=scheduled_pipeline(target, fusion))


CASES = [  # shape of x, sibling widths, dtype
    ((1, 64), [64, 64, 64], "float32"),
    ((1, 48), [48, 16, 16], "float32"),
    ((3, 33), [17, 1, 3], "float32"),
    ((1, 1, 40), [32, 96], "float32"),
    ((2, 5, 24), [24, 8, 8, 40], "float32"),
    ((197, 32), [32, 32, 32], "float32"),
    ((1, 32), [32, 16], "float16"),
]


@pytest.mark.parametrize("seed", range(len(CASES)))
def test_fuzz_combined_siblings_compute_what_the_program_does(seed):
    rng = np.random.default_rng(seed)
    shape, widths, dtype = CASES[seed]
    bias, transposed, flip = (bool(b) for b in rng.integers(0, 2, 3))
    mod = _program(rng, shape, widths, bias, transposed, flip, output_first=seed % 2 == 1,
                   reshaped=seed % 3 == 0, dtype=dtype)
    want_out = run(tvm.compile(mod, "llvm", relax_pipeline=build_pipeline("llvm", no_fusion)),
                   {"x": (data := rng.standard_normal(shape).astype(dtype))})
    cf = _costfuse("always")
    got = run(_built(mod, cf), {"x": data})
    (s,) = cf.siblings
    assert s.combine and s.widths == widths
    assert len(got) == len(want_out) == len(widths)
    tol = 1e-5 if dtype == "float32" else 2e-3
    for g, w in zip(got, want_out):
        assert g.dtype == w.dtype == np.dtype(dtype)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def test_one_matmul_replaces_the_siblings():
    rng = np.random.default_rng(0)
    mod = _program(rng, (1, 32), [32, 16, 16], True, True, True, reshaped=True)
    out, found = combine_siblings(mod)
    assert [s.widths for s in found] == [[32, 16, 16]]
    calls: dict[str, int] = {}

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            calls[e.op.name] = calls.get(e.op.name, 0) + 1

    relax.analysis.post_order_visit(out["main"], visit)
    assert calls["relax.matmul"] == 1 and calls["relax.add"] == 1
    assert calls["relax.strided_slice"] == 3


def test_what_is_no_sibling_stays():
    """Matmuls of two different inputs, of one input at two shapes, or by a weight that is not
    a constant are left as they are."""
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    z = relax.Var("z", relax.TensorType((4, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 8), "float32"))
    c = relax.const(np.ones((8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, z, w]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, c))
            b = bb.emit(relax.op.matmul(z, c))  # another input
            d = bb.emit(relax.op.matmul(x, w))  # a weight given at run time
            x2 = bb.emit(relax.op.reshape(x, (2, 2, 8)))
            e = bb.emit(relax.op.matmul(x2, c))  # the input at another shape
            out = bb.emit_output(relax.Tuple([a, b, d, e]))
        bb.emit_func_output(out)
    assert find_siblings(bb.get()["main"]) == []


def test_never_leaves_the_module_alone_and_cost_keeps_both_prices():
    rng = np.random.default_rng(1)
    mod = _program(rng, (1, 256), [256, 64, 64], True, True, False)
    never = _costfuse("never")
    with tvm.target.Target("llvm"):
        kept = tvm.transform.Sequential(_pipeline_head(never))(mod)
    tvm.ir.assert_structural_equal(kept, mod)
    (listed,) = never.siblings  # listed with the decision, nothing rewritten
    assert not listed.combine and listed.prices is None
    cost = _costfuse("cost")
    with tvm.target.Target("llvm"):
        tvm.transform.Sequential(_pipeline_head(cost))(mod)
    (s,) = cost.siblings
    apart, one = s.prices
    assert apart > 0 and one > 0
    assert s.combine == (one < apart * (1 - MIN_GAIN))
    assert f"{apart * 1e6:.2f} us apart" in s.why


def test_a_tool_that_builds_its_own_plan_sees_the_model_costfuse_builds():
    rng = np.random.default_rng(2)
    mod = _program(rng, (1, 64), [64, 64], False, True, False)
    out, sets, _layout = costfuse_model(mod, "llvm", horizontal="always")
    assert [s.combine for s in sets] == [True]
    assert not find_siblings(out["main"])


def test_a_bias_added_in_another_block_stays_outside_the_set():
    """The matmul is a dataflow block's output and its bias add sits in the next block: the
    slice takes the matmul's place, the add stays where it was, the module is well formed."""
    rng = np.random.default_rng(3)
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    w = [relax.const(rng.standard_normal((16, 16)).astype("float32")) for _ in range(2)]
    b = relax.const(rng.standard_normal(16).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y0 = bb.emit_output(relax.op.matmul(x, w[0]))
            y1 = bb.emit_output(relax.op.matmul(x, w[1]))
        z = bb.emit(relax.op.add(y0, b))
        bb.emit_func_output(relax.Tuple([z, y1]))
    mod = bb.get()
    (s,) = find_siblings(mod["main"])
    assert all(br.bias is None for br in s.branches)
    out, _ = combine_siblings(mod)
    assert relax.analysis.check_well_formed(out)
    want = run(tvm.compile(mod, "llvm"), {"x": (data := rng.standard_normal((1, 16)).astype(
        "float32"))})
    got = run(tvm.compile(out, "llvm"), {"x": data})
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_mixed_and_shared_siblings_group_by_their_form():
    """A bias-less projection beside biased ones is a set of its own kind (a zero bias would
    be an extra add); a matmul with a second consumer keeps its value, the other use reading
    the slice."""
    rng = np.random.default_rng(4)
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    ws = [relax.const(rng.standard_normal((16, 8)).astype("float32")) for _ in range(4)]
    b = [relax.const(rng.standard_normal(8).astype("float32")) for _ in range(2)]
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            q = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, ws[0])), b[0]))
            v = bb.emit(relax.op.add(b[1], bb.emit(relax.op.matmul(x, ws[1]))))
            k = bb.emit(relax.op.matmul(x, ws[2]))
            u = bb.emit(relax.op.matmul(x, ws[3]))
            twice = bb.emit(relax.op.multiply(u, relax.op.add(u, k)))
            out = bb.emit_output(relax.Tuple([q, v, k, twice]))
        bb.emit_func_output(out)
    mod = bb.get()
    sets = find_siblings(mod["main"])
    assert sorted((len(s.branches), s.branches[0].bias is not None) for s in sets) == [
        (2, False), (2, True)]
    out, _ = combine_siblings(mod)
    data = {"x": rng.standard_normal((1, 16)).astype("float32")}
    for g, e in zip(run(tvm.compile(out, "llvm"), data), run(tvm.compile(mod, "llvm"), data)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def _pipeline_head(costfuse):
    return costfuse_passes(costfuse)


def test_the_priced_programs_are_the_siblings_alone():
    apart = sibling_program((1, 64), "float32", [64, 32], True, combined=False)
    one = sibling_program((1, 64), "float32", [64, 32], True, combined=True)
    assert [s.widths for s in find_siblings(apart["main"])] == [[64, 32]]
    assert find_siblings(one["main"]) == []
    assert constant_bytes(apart) == 4 * (64 * 96 + 96)
