"""Differential fuzzing of CostFuse's own groupings (``tvm_costfuse.fuzzing``), a fixed-seed
slice (``scripts/fuzz.py`` runs the long profile), and a named regression test for every bug
it or a user found in groupings FuseOps never forms."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import tirx as T
from tvm_costfuse.schedules import schedule_pass

from tvm_costfuse import apply_partition
from tvm_costfuse.fuzzing import Case, Draws, Program, check, draw_case, draw_program, reference
from tvm_costfuse.fuzzing.differential import TARGETS, runs_here
from tvm_costfuse.graph import build_graph
from tvm_costfuse.measurement.timing import build, run
from tvm_costfuse.pipelines import prepare

SLICE = 30  # programs per run: about 2 s each with the reference build


@settings(max_examples=SLICE)
@given(st.data())
def test_drawn_programs_match_the_unfused_build(data) -> None:
    draws = Draws.hypothesis(data)
    program = draw_program(draws)
    case = draw_case(draws)
    check(program, case, draws)


@pytest.mark.parametrize("grouping", ["intervals", "whole", "siblings", "costfuse"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_every_grouping_on_every_target(grouping: str, target: str) -> None:
    """The same programs under each grouping and target, so each pair is covered every run."""
    for seed in range(2):
        draws = Draws.seeded(seed)
        program = draw_program(draws)
        options = (("max_chain_length", 32), ("max_body_ops", 64)) if grouping == "costfuse" \
            else ()
        check(program, Case(grouping, target, options), draws)


# ------------------------------------------------------------------ named regressions


def _two_depthwise_with_bn(channels: int = 8):
    """A 3x3 and a 1x1 depthwise conv of one input, each with a folded batch norm, summed: the
    train-time form of a reparameterizable block. The 1x1 conv reduces over unit axes only."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, 7, 7), "float32"))

    def const(*shape):
        return relax.const(rng.standard_normal(shape).astype("float32"))

    scale, shift = const(1, channels, 1, 1), const(1, channels, 1, 1)
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, const(channels, 1, 3, 3), padding=1,
                                           groups=channels))
            a = bb.emit(relax.op.add(relax.op.multiply(a, scale), shift))
            b = bb.emit(relax.op.nn.conv2d(x, const(channels, 1, 1, 1), groups=channels))
            b = bb.emit(relax.op.add(relax.op.multiply(b, scale), shift))
            out = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(out)
    inputs = {"x": rng.standard_normal((1, channels, 7, 7)).astype("float32")}
    return bb.get(), inputs


@pytest.mark.parametrize("target", list(TARGETS))
def test_unit_extent_reduction_in_a_two_reduction_kernel(target: str) -> None:
    """Both convs (and their BN epilogues) in one kernel, the sum apart: the 1x1 conv's block
    keeps its init once its unit axes are dropped, and was taken for a spatial block, so the
    epilogue went into the init and the update alike (scaled error 0.1 before the fix)."""
    mod, inputs = _two_depthwise_with_bn()
    tgt = tvm.target.Target(TARGETS[target])
    prepared = prepare(mod, tgt, fold=False)  # folded, the two convs are one 3x3: no trap left
    names = [n.name for n in build_graph(prepared).nodes if n.fusable]
    want = run(build(prepared, TARGETS["generic"]), inputs)
    for groups in ([names[:-1], names[-1:]], [names]):
        ex = build(apply_partition(prepared, groups), tgt, schedule=schedule_pass(tgt))
        if runs_here(target):
            got = run(ex, inputs)
            assert np.abs(got[0] - want[0]).max() <= 1e-5 * np.abs(want[0]).max(), groups


@T.prim_func(s_tir=True)
def _matmul_and_unit_sum(A: T.Buffer((8, 16), "float32"), B: T.Buffer((16, 8), "float32"),
                         X: T.Buffer((8, 1), "float32"), C: T.Buffer((8, 8), "float32"),
                         D: T.Buffer((8,), "float32")):
    T.func_attr({"global_symbol": "main", "tir.noalias": True})
    mm = T.alloc_buffer((8, 8))
    s = T.alloc_buffer((8,))
    for i, j, k in T.grid(8, 8, 16):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                mm[vi, vj] = T.float32(0)
            mm[vi, vj] = mm[vi, vj] + A[vi, vk] * B[vk, vj]
    for i, j in T.grid(8, 8):
        with T.sblock("e1"):
            vi, vj = T.axis.remap("SS", [i, j])
            C[vi, vj] = mm[vi, vj] + T.float32(1)
    for i, k in T.grid(8, 1):
        with T.sblock("s"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                s[vi] = T.float32(0)
            s[vi] = s[vi] + X[vi, vk]
    for i in range(8):
        with T.sblock("e2"):
            vi = T.axis.remap("S", [i])
            D[vi] = s[vi] * T.float32(2) + T.float32(1)


def test_one_row_attention_over_a_single_key() -> None:
    """Seed 40417 of the long profile: a one-row attention whose keys have unit extent (x of
    shape (1, 1, 17)). The one-row rule looked for a loop driving the P V reduction, found
    none (a unit extent has no loop), and raised StopIteration; the kernel still ran right on
    the next rule, so only the rule's log showed it (``check`` now fails on that log)."""
    draws = Draws.seeded(40417)
    program = draw_program(draws)
    check(program, draw_case(draws), draws)


@pytest.mark.parametrize("target", list(TARGETS))
def test_matmul_beside_a_sum_over_a_unit_axis(target: str) -> None:
    """A matmul and a sum over an extent-1 axis, each with an epilogue, in one PrimFunc: the
    Contraction rule took the sum for spatial and built a kernel that failed to compile on
    AVX2 and AVX-512 ("mm_local has duplicate definitions")."""
    tgt = tvm.target.Target(TARGETS[target])
    with tgt:
        mod = schedule_pass(tgt)(tvm.IRModule({"main": _matmul_and_unit_sum}))
    ex = tvm.compile(mod, target=tgt)
    if not runs_here(target):
        return
    rng = np.random.default_rng(0)
    a, b, x = (rng.random(s, dtype="float32") for s in ((8, 16), (16, 8), (8, 1)))
    c, d = tvm.runtime.tensor(np.zeros((8, 8), "float32")), tvm.runtime.tensor(
        np.zeros(8, "float32"))
    ex(*(tvm.runtime.tensor(v) for v in (a, b, x)), c, d)
    np.testing.assert_allclose(c.numpy(), a @ b + 1, rtol=1e-5)
    np.testing.assert_allclose(d.numpy(), 2 * x[:, 0] + 1, rtol=1e-6)


@pytest.mark.parametrize("target", list(TARGETS))
def test_attention_output_read_by_two_epilogues(target: str) -> None:
    """Softmax and P V in one kernel with an add and a subtract both reading P V (found by
    the fuzzer): inlining the add into the write-back left the subtract reading a buffer
    nothing defined ("used before its definition") on AVX-512."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 7, 8), "float32"))
    op = relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            q, k, v = (bb.emit(op.matmul(x, relax.const(rng.standard_normal((8, 8)).astype(
                "float32")))) for _ in range(3))
            s = bb.emit(op.matmul(q, op.permute_dims(k, [0, 2, 1])))
            p = bb.emit(op.nn.softmax(op.multiply(s, relax.const(0.35)), axis=-1))
            o = bb.emit(op.matmul(p, v))
            a = bb.emit(op.add(o, relax.const(rng.standard_normal((8,)).astype("float32"))))
            b = bb.emit(op.subtract(o, relax.const(rng.standard_normal((1, 7, 1)).astype(
                "float32"))))
            out = bb.emit_output(relax.Tuple([a, b]))
        bb.emit_func_output(out)
    mod = bb.get()
    inputs = {"x": rng.standard_normal((1, 7, 8)).astype("float32")}
    tgt = tvm.target.Target(TARGETS[target])
    prepared = prepare(mod, tgt)
    graph = build_graph(prepared)
    softmax = next(i for i, n in enumerate(graph.nodes) if "softmax" in (n.prim_func or ""))
    tail = [n.name for n in graph.nodes[softmax - 1:] if n.fusable]
    ex = build(apply_partition(prepared, [tail]), tgt, schedule=schedule_pass(tgt))
    if runs_here(target):
        got, want = run(ex, inputs), run(build(prepared, TARGETS["generic"]), inputs)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_reference_and_check_see_a_wrong_kernel() -> None:
    """The reference is TVM's own unfused build (NumPy agrees), and a grouping whose kernel
    computes something else fails the check: the fuzzer can fail."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(x, relax.const(1.0))))
        bb.emit_func_output(out)
    inputs = {"x": np.random.default_rng(0).standard_normal((3, 5)).astype("float32")}
    program = Program(bb.get(), inputs, ["add", "relu"])
    np.testing.assert_allclose(reference(program)[0], np.maximum(inputs["x"] + 1, 0))
    assert check(program, Case("whole", "generic"), Draws.seeded(0)) <= 1e-6
    with pytest.raises(AssertionError, match="scaled error"):
        check(program, Case("whole", "generic"), Draws.seeded(0),
              want=[np.maximum(inputs["x"], 0)])


def test_an_output_that_cancels_to_zero_is_judged_against_the_inputs() -> None:
    """Seed 9773 of the long profile: ``mean(mean(x)) - mean(x)`` in one kernel is 0.0 in
    the reference and about 5e-8 under CostFuse (a fused multiply-add where the reference
    rounds the product; inputs of magnitude 2.6). Relative to the output's own largest value,
    0, that read as a scaled error of 5e22. Judged against 1% of the inputs' magnitude it
    passes, and a result that is wrong by 1e-4 of the inputs still fails."""
    draws = Draws.seeded(9773)
    program = draw_program(draws)
    case = draw_case(draws)
    want = reference(program)
    cancelled = [i for i, w in enumerate(want) if not np.abs(w).max()]
    assert cancelled, "the program no longer has an output that cancels to zero"
    if not runs_here(case.target):  # built only: this host lacks the case's ISA
        case = Case(case.grouping, "generic", case.options)
    assert check(program, case, draws, want=want) <= 1e-4
    scale = max(float(np.abs(v).max()) for v in program.inputs.values())
    wrong = [w + (1e-4 * scale if i == cancelled[0] else 0.0) for i, w in enumerate(want)]
    with pytest.raises(AssertionError, match="scaled error"):
        check(program, case, draws, want=wrong)


def test_scaled_error_floor_and_nan() -> None:
    """Host-independent: against an exact zero, rounding noise is judged against the floor;
    a NaN on one side only is an infinite error (``max`` would have dropped it)."""
    from tvm_costfuse.measurement.timing import scaled_error

    noise, zero = np.array([5e-8, -3e-8]), np.zeros(2)
    assert scaled_error(noise, zero) > 1e20
    assert scaled_error(noise, zero, floor=0.026) < 1e-5
    assert scaled_error(noise + 1e-3, zero, floor=0.026) > 1e-2
    assert scaled_error(np.array([np.nan, 1.0]), np.array([0.0, 1.0])) == np.inf
    assert scaled_error(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])) == 0.0
    assert scaled_error(np.array([np.inf, 1.0]), np.array([np.inf, 1.0])) == 0.0
