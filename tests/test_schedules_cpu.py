"""CPU schedule rules: structure of the scheduled IR (no timing) and numerics vs the stock build.

Structural tests apply one rule to a small TVMScript PrimFunc and assert on the loops it made
(parallel / vectorized / unrolled), which blocks were inlined and where the accumulator lives.
Numeric tests compile a Relax graph with FuseOps + our rules and with TVM's stock pipeline and
require allclose outputs (float reassociation tolerance).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.script import tirx as T
from tvm_costfuse.schedules import (
    Attention,
    ChannelChain,
    Contraction,
    Fallback,
    RowReduction,
    rules,
    schedule_pass,
)

from tvm_costfuse.measurement.timing import max_mismatch, run
from tvm_costfuse.strategies import strategy_pipeline
from tvm_costfuse.targets import host_target

# Kernels that run use this host's ISA; structural checks use explicit ISAs instead, so they
# hold on any x86-64 host (AMD or Intel, AVX2 or AVX-512).
TARGET = host_target(2)
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
# An llvm target without mcpu compiles for generic x86-64 (SSE2), which runs on every host: the
# numerics run there too, since tile sizes (and so which schedule steps apply) follow the ISA.
GENERIC = tvm.target.Target({"kind": "llvm", "num-cores": 2})
RTOL, ATOL = 1e-4, 1e-5


# ----------------------------------------------------------------------------- helpers


def _loops(func: tirx.PrimFunc) -> list[tirx.For]:
    found = []
    tvm_ffi.structural_walk(func.body, (tirx.For, found.append), order="pre")
    return found


def _kinds(func: tirx.PrimFunc) -> set:
    return {loop.kind for loop in _loops(func)}


def _block_names(func: tirx.PrimFunc) -> set[str]:
    from tvm import s_tir

    names = set()
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: names.add(b.name_hint)))
    return names


def _scheduled(rule, func, target=AVX512) -> tirx.PrimFunc:
    sch = rule.apply(func, target, False)
    assert sch is not None, f"{type(rule).__name__} did not apply"
    return sch.mod["main"]


def _check_numerics(mod: tvm.IRModule, inputs: dict[str, np.ndarray], target=TARGET) -> None:
    ref = run(tvm.compile(mod, target, relax_pipeline=strategy_pipeline("stock", target)), inputs)
    got = run(tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target)), inputs)
    assert max_mismatch(ref, got, RTOL, ATOL) <= 1.0


# ----------------------------------------------------------------------------- fixtures


@T.prim_func(private=True, s_tir=True)
def elementwise_chain(a: T.Buffer((64, 256), "float32"), c: T.Buffer((64, 256), "float32")):
    b = T.sblock_alloc_buffer((64, 256))
    for i, j in T.grid(64, 256):
        with T.sblock("b"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = a[vi, vj] + T.float32(1)
    for i, j in T.grid(64, 256):
        with T.sblock("c"):
            vi, vj = T.axis.remap("SS", [i, j])
            c[vi, vj] = T.exp(b[vi, vj]) * T.float32(2)


@T.prim_func(private=True, s_tir=True)
def matmul_bias_relu(
    a: T.Buffer((128, 256), "float32"),
    w: T.Buffer((256, 512), "float32"),
    bias: T.Buffer((512,), "float32"),
    out: T.Buffer((128, 512), "float32"),
):
    acc = T.sblock_alloc_buffer((128, 512))
    for i, j, k in T.grid(128, 512, 256):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                acc[vi, vj] = T.float32(0)
            acc[vi, vj] = acc[vi, vj] + a[vi, vk] * w[vk, vj]
    for i, j in T.grid(128, 512):
        with T.sblock("epilogue"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = T.max(acc[vi, vj] + bias[vj], T.float32(0))


@T.prim_func(private=True, s_tir=True)
def softmax(x: T.Buffer((256, 128), "float32"), y: T.Buffer((256, 128), "float32")):
    mx = T.sblock_alloc_buffer((256,))
    e = T.sblock_alloc_buffer((256, 128))
    s = T.sblock_alloc_buffer((256,))
    for i, k in T.grid(256, 128):
        with T.sblock("max"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                mx[vi] = T.min_value("float32")
            mx[vi] = T.max(mx[vi], x[vi, vk])
    for i, j in T.grid(256, 128):
        with T.sblock("exp"):
            vi, vj = T.axis.remap("SS", [i, j])
            e[vi, vj] = T.exp(x[vi, vj] - mx[vi])
    for i, k in T.grid(256, 128):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                s[vi] = T.float32(0)
            s[vi] = s[vi] + e[vi, vk]
    for i, j in T.grid(256, 128):
        with T.sblock("norm"):
            vi, vj = T.axis.remap("SS", [i, j])
            y[vi, vj] = e[vi, vj] / s[vi]


@T.prim_func(private=True, s_tir=True)
def transpose_broadcast(a: T.Buffer((128, 64), "float32"), b: T.Buffer((128, 64), "float32"),
                        out: T.Buffer((12, 64, 128), "float32")):
    t = T.sblock_alloc_buffer((64, 128))
    for i, j in T.grid(64, 128):
        with T.sblock("t"):
            vi, vj = T.axis.remap("SS", [i, j])
            t[vi, vj] = a[vj, vi] * b[vj, vi] + T.float32(1)
    for h, i, j in T.grid(12, 64, 128):
        with T.sblock("repeat"):
            vh, vi, vj = T.axis.remap("SSS", [h, i, j])
            out[vh, vi, vj] = t[vi, vj]


@T.prim_func(private=True, s_tir=True)
def rotate_then_transpose(x: T.Buffer((4, 128, 64), "float32"), c: T.Buffer((128, 64), "float32"),
                          out: T.Buffer((4, 64, 128), "float32")):
    r = T.sblock_alloc_buffer((4, 128, 64))
    for h, s, d in T.grid(4, 128, 64):
        with T.sblock("rotate"):
            vh, vs, vd = T.axis.remap("SSS", [h, s, d])
            r[vh, vs, vd] = x[vh, vs, vd] * c[vs, vd]
    for h, d, s in T.grid(4, 64, 128):
        with T.sblock("transpose"):
            vh, vd, vs = T.axis.remap("SSS", [h, d, s])
            out[vh, vd, vs] = r[vh, vs, vd]


@T.prim_func(private=True, s_tir=True)
def concat_norm(a: T.Buffer((64, 96), "float32"), b: T.Buffer((64, 96), "float32"),
                out: T.Buffer((64, 192), "float32")):
    cat = T.sblock_alloc_buffer((64, 192))
    total = T.sblock_alloc_buffer((64,))
    for i, j in T.grid(64, 192):
        with T.sblock("concat"):
            vi, vj = T.axis.remap("SS", [i, j])
            cat[vi, vj] = T.if_then_else(vj >= 96, b[vi, vj - 96], a[vi, vj])
    for i, k in T.grid(64, 192):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                total[vi] = T.float32(0)
            total[vi] = total[vi] + cat[vi, vk]
    for i, j in T.grid(64, 192):
        with T.sblock("norm"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = cat[vi, vj] - total[vi] * T.float32(1.0 / 192)


# ----------------------------------------------------------------------------- structure


def test_host_target_uses_real_cpu():
    assert TARGET.attrs["mcpu"] not in ("", "generic", "native")
    assert int(TARGET.attrs["num-cores"]) == 2


def test_rule_order_is_specific_first_fallback_last():
    # attention before row reductions: RowReduction would take a softmax + P V kernel as rows
    # the channel chain before contractions: a group it takes has two, which Contraction declines
    assert [type(r) for r in rules()] == [ChannelChain, Contraction, Attention, RowReduction,
                                          Fallback]


def test_fallback_inlines_producer_and_parallelizes_vectorizes():
    func = _scheduled(Fallback(), elementwise_chain)
    assert _block_names(func) == {"root", "c"}  # "b" never reaches memory
    assert {tirx.ForKind.PARALLEL, tirx.ForKind.VECTORIZED} <= _kinds(func)
    vec = [lp for lp in _loops(func) if lp.kind == tirx.ForKind.VECTORIZED]
    assert len(vec) == 1 and int(vec[0].extent) % 16 == 0  # AVX512 (explicit target): 16 float32 lanes


def test_fallback_puts_a_broadcast_axis_right_above_the_vector_loop():
    """A head repeat of a transposed key (grouped-query attention's ``broadcast_to``): the
    repeated axis runs inside every loop the value depends on, so the value (gathers of the
    transposed read) is computed once and stored 12 times, not computed 12 times."""
    func = _scheduled(Fallback(), transpose_broadcast)
    loops = _loops(func)
    assert loops[0].kind == tirx.ForKind.PARALLEL and int(loops[0].extent) == 64
    assert loops[-1].kind == tirx.ForKind.VECTORIZED
    assert int(loops[-2].extent) == 12 and loops[-2].kind == tirx.ForKind.SERIAL


def test_fallback_keeps_a_two_input_producer_out_of_a_transpose():
    """Inlined into the transpose, both loads of the producer would be gathers; kept, the
    producer is a contiguous vector nest and the transpose, a pure copy, runs as register
    tiles (``transpose.py``: its tile read and its write vectorized)."""
    func = _scheduled(Fallback(), rotate_then_transpose)
    assert {"rotate", "transpose"} <= _block_names(func)
    assert any(name.endswith("_local") for name in _block_names(func))
    assert sum(lp.kind == tirx.ForKind.VECTORIZED for lp in _loops(func)) == 3


def test_row_reduction_computes_a_concat_once_per_row_in_partitioned_vectors():
    """A concat read by two passes is computed once per row, not selected in each (swin's
    patch merging feeding its layer norm), and its vector loop is partitioned at the parts'
    bound; the numbers are the definition's."""
    from tvm_costfuse.schedules._loops import PARTITION_HINT

    func = _scheduled(RowReduction(), concat_norm)
    assert "concat" in _block_names(func)
    hinted = [lp for lp in _loops(func) if PARTITION_HINT in (lp.annotations or {})]
    assert hinted and int(hinted[0].extent) == 192 // 16
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((64, 96)).astype("float32") for _ in range(2))
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                      target=TARGET)
    out = tvm.runtime.tensor(np.zeros((64, 192), "float32"))
    lib(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    cat = np.concatenate([a, b], axis=1)
    np.testing.assert_allclose(out.numpy(), cat - cat.mean(axis=1, keepdims=True),
                               rtol=RTOL, atol=ATOL)


def test_contraction_register_blocks_and_inlines_epilogue():
    func = _scheduled(Contraction(), matmul_bias_relu)
    names = _block_names(func)
    assert "epilogue" not in names and "matmul_update" in names and "matmul_init" in names
    script = func.script()
    assert 'scope="local"' in script  # accumulator tile, not the global intermediate
    assert "acc = " not in script and "T.sblock_alloc_buffer((128, 512))" not in script
    kinds = _kinds(func)
    assert {tirx.ForKind.PARALLEL, tirx.ForKind.VECTORIZED, tirx.ForKind.UNROLLED} <= kinds
    update_nest = [lp for lp in _loops(func) if lp.kind == tirx.ForKind.VECTORIZED]
    assert all(int(lp.extent) % 16 == 0 for lp in update_nest)


def test_row_reduction_computes_everything_per_row():
    func = _scheduled(RowReduction(), softmax)
    outer = func.body.block.body  # the single root loop
    assert isinstance(outer, tirx.For) and outer.kind == tirx.ForKind.PARALLEL
    assert int(outer.extent) == 256
    names = _block_names(func)
    # exp feeds both sum and norm: kept per row (in cache) rather than computed twice
    assert "exp" in names
    # 128-long rows are rfactored into 16 vector lanes of partial max / sum
    assert {"max_rf_update", "sum_rf_update"} <= names
    assert tirx.ForKind.VECTORIZED in _kinds(func)


def test_row_reduction_takes_a_single_row_serial_and_vectorized():
    # a decode step's RMS norm over its one token: no row loop to run in parallel, each
    # reduction one vector of partial sums
    x = relax.Var("x", relax.TensorType((1, 1, 256), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        out = bb.emit(OP.nn.rms_norm(x, _const(_RNG, 256), axes=[-1]))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    [func] = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    scheduled = _scheduled(RowReduction(), func)
    assert any(n.endswith("_rf_update") for n in _block_names(scheduled))
    assert tirx.ForKind.VECTORIZED in _kinds(scheduled)
    assert tirx.ForKind.PARALLEL not in _kinds(scheduled)


@T.prim_func(private=True, s_tir=True)
def global_avg_pool(x: T.Buffer((1, 32, 56, 56), "float32"), y: T.Buffer((1, 32, 1, 1), "float32")):
    red = T.sblock_alloc_buffer((1, 32, 1, 1))
    for n, c, i, j, h, w in T.grid(1, 32, 1, 1, 56, 56):
        with T.sblock("red"):
            vn, vc, vi, vj, vh, vw = T.axis.remap("SSSSRR", [n, c, i, j, h, w])
            with T.init():
                red[vn, vc, vi, vj] = T.float32(0)
            red[vn, vc, vi, vj] = red[vn, vc, vi, vj] + x[vn, vc, vh, vw]
    for n, c, i, j in T.grid(1, 32, 1, 1):
        with T.sblock("div"):
            vn, vc, vi, vj = T.axis.remap("SSSS", [n, c, i, j])
            y[vn, vc, vi, vj] = red[vn, vc, vi, vj] / T.float32(3136)


def test_row_reduction_vectorizes_a_mean_over_two_contiguous_axes():
    # a mean over H and W reads one contiguous row of H * W per channel: one vectorized row,
    # not a scalar add chain over two loops
    func = _scheduled(RowReduction(), global_avg_pool)
    assert "red_rf_update" in _block_names(func)
    vectors = [lp for lp in _loops(func) if lp.kind == tirx.ForKind.VECTORIZED]
    assert vectors and all(int(lp.extent) == 16 for lp in vectors)
    # the H and W loops are one loop of 56 * 56 / 16 vectors
    assert any(int(lp.extent) == 56 * 56 // 16 for lp in _loops(func))


@T.prim_func(private=True, s_tir=True)
def cropped_avg_pool(x: T.Buffer((1, 32, 58, 58), "float32"), y: T.Buffer((1, 32), "float32")):
    red = T.sblock_alloc_buffer((1, 32))
    for n, c, h, w in T.grid(1, 32, 56, 56):
        with T.sblock("red"):
            vn, vc, vh, vw = T.axis.remap("SSRR", [n, c, h, w])
            with T.init():
                red[vn, vc] = T.float32(0)
            red[vn, vc] = red[vn, vc] + x[vn, vc, vh, vw]
    for n, c in T.grid(1, 32):
        with T.sblock("div"):
            vn, vc = T.axis.remap("SS", [n, c])
            y[vn, vc] = red[vn, vc] / T.float32(3136)


def test_row_reduction_keeps_rows_apart_where_they_are_not_contiguous():
    # 56 of each 58-wide row: the H and W loops stay two, the vector runs along W
    func = _scheduled(RowReduction(), cropped_avg_pool)
    assert not any(int(lp.extent) == 56 * 56 // 16 for lp in _loops(func))
    vectors = [lp for lp in _loops(func) if lp.kind == tirx.ForKind.VECTORIZED]
    assert vectors and all(int(lp.extent) == 16 for lp in vectors)


def test_costly_producer_read_twice_is_not_inlined():
    @T.prim_func(private=True, s_tir=True)
    def square_of_exp(a: T.Buffer((64, 256), "float32"), c: T.Buffer((64, 256), "float32")):
        b = T.sblock_alloc_buffer((64, 256))
        for i, j in T.grid(64, 256):
            with T.sblock("b"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = T.exp(a[vi, vj])
        for i, j in T.grid(64, 256):
            with T.sblock("c"):
                vi, vj = T.axis.remap("SS", [i, j])
                c[vi, vj] = b[vi, vj] * b[vi, vj]

    assert _block_names(_scheduled(Fallback(), square_of_exp)) == {"root", "b", "c"}


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_rules_decline_what_they_do_not_match(target):
    assert Contraction().apply(softmax, target, False) is None
    assert Contraction().apply(elementwise_chain, target, False) is None
    assert RowReduction().apply(elementwise_chain, target, False) is None


@pytest.mark.parametrize(("target", "lanes", "registers"), [(AVX2, 8, 16), (AVX512, 16, 32)],
                         ids=["avx2", "avx512"])
def test_vector_width_and_registers_follow_the_target_isa(target, lanes, registers):
    """Tiles are sized from the target's own ISA, not from the machine compiling it."""
    from tvm_costfuse.targets import isa

    assert isa.vector_lanes(target, "float32") == lanes
    assert isa.vector_registers(target) == registers
    for rule, func in ((Fallback(), elementwise_chain), (Contraction(), matmul_bias_relu)):
        vec = [lp for lp in _loops(_scheduled(rule, func, target))
               if lp.kind == tirx.ForKind.VECTORIZED]
        assert vec and all(int(lp.extent) % lanes == 0 for lp in vec), type(rule).__name__
    fallback = _scheduled(Fallback(), elementwise_chain, target)
    assert max(int(lp.extent) for lp in _loops(fallback)
               if lp.kind == tirx.ForKind.VECTORIZED) <= 8 * lanes


def test_schedule_pass_marks_every_kernel_scheduled():
    mod = tvm.IRModule({"a": elementwise_chain, "b": matmul_bias_relu, "c": softmax})
    with TARGET:
        out = schedule_pass(TARGET)(mod)
    for _, func in out.functions_items():
        assert bool(func.attrs["tirx.is_scheduled"])


# ----------------------------------------------------------------------------- numerics


def _graph(build, shapes: dict[str, tuple], seed: int = 0):
    """A one-function Relax module from ``build(bb, vars)`` plus random inputs."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, "float32")) for n, s in shapes.items()]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    inputs = {n: rng.standard_normal(s).astype("float32") for n, s in shapes.items()}
    return bb.get(), inputs


def _const(rng, *shape):
    return relax.const(rng.standard_normal(shape).astype("float32") * 0.1)


_RNG = np.random.default_rng(1)
OP = relax.op
CASES = {
    "matmul_bias_gelu": (
        lambda bb, x: OP.nn.gelu(OP.add(OP.matmul(x, _const(_RNG, 96, 80)), _const(_RNG, 80))),
        {"x": (24, 96)},
    ),
    "dense_transposed_weight": (
        lambda bb, x, w: OP.matmul(x, OP.permute_dims(w)),
        {"x": (33, 64), "w": (48, 64)},
    ),
    "batch_matmul": (lambda bb, a, b: OP.matmul(a, b), {"a": (3, 20, 32), "b": (3, 32, 40)}),
    "conv2d_relu": (
        lambda bb, x: OP.nn.relu(OP.nn.conv2d(x, _const(_RNG, 16, 8, 3, 3), padding=1)),
        {"x": (1, 8, 14, 14)},
    ),
    "conv1x1_stride2": (
        lambda bb, x: OP.nn.conv2d(x, _const(_RNG, 24, 16, 1, 1), strides=2),
        {"x": (2, 16, 10, 10)},
    ),
    "depthwise_conv": (
        lambda bb, x: OP.nn.conv2d(x, _const(_RNG, 12, 1, 3, 3), padding=1, groups=12),
        {"x": (1, 12, 9, 9)},
    ),
    # The epilogue reads fewer points than the contraction writes (wav2vec2's positional conv:
    # padding 8, kernel 16, the last position sliced off): inlining it into the accumulator's
    # write-back would store the dropped column past each row.
    "conv1d_slice_gelu": (
        lambda bb, x: OP.nn.gelu(OP.strided_slice(
            OP.nn.conv1d(x, _const(_RNG, 32, 16, 16), padding=8, groups=2), [2], [0], [15])),
        {"x": (1, 32, 15)},
    ),
    "matmul_slice_relu": (
        lambda bb, x: OP.nn.relu(OP.strided_slice(
            OP.matmul(x, _const(_RNG, 40, 24)), [1], [0], [21])),
        {"x": (16, 40)},
    ),
    "softmax": (lambda bb, x: OP.nn.softmax(x, axis=-1), {"x": (10, 77)}),
    "softmax_axis1": (lambda bb, x: OP.nn.softmax(x, axis=1), {"x": (2, 5, 6, 7)}),
    "layernorm": (
        lambda bb, x: OP.nn.layer_norm(x, _const(_RNG, 64), _const(_RNG, 64), axes=[-1]),
        {"x": (2, 9, 64)},
    ),
    "rmsnorm": (lambda bb, x: OP.nn.rms_norm(x, _const(_RNG, 48), axes=[-1]), {"x": (17, 48)}),
    # one token (a decode step): a single row, ragged (200 = 12 vectors of 16 and 8)
    "rmsnorm_one_row": (
        lambda bb, x: OP.nn.rms_norm(x, _const(_RNG, 200), axes=[-1]), {"x": (1, 1, 200)}),
    "layernorm_one_row": (
        lambda bb, x: OP.nn.layer_norm(OP.add(x, x), _const(_RNG, 37), _const(_RNG, 37),
                                       axes=[-1]), {"x": (1, 37)}),
    "mean_hw": (lambda bb, x: OP.mean(x, axis=[2, 3], keepdims=True), {"x": (2, 8, 12, 12)}),
    "mean_sum": (
        lambda bb, x: OP.add(OP.mean(x, axis=[2, 3]), OP.sum(x, axis=[2, 3])),
        {"x": (2, 8, 7, 7)},
    ),
    "pool_concat_split": (
        lambda bb, x: relax.Tuple(
            list(
                bb.emit(
                    OP.split(
                        OP.concat(
                            [OP.nn.max_pool2d(x, 3, 2, 1), OP.nn.avg_pool2d(x, 3, 2, 1)], axis=1
                        ),
                        2,
                        axis=1,
                    )
                )
            )
        ),
        {"x": (1, 6, 15, 15)},
    ),
    "cumsum_argmax_take": (
        lambda bb, x: OP.add(
            OP.cumsum(x, axis=1),
            OP.astype(OP.expand_dims(OP.argmax(x, axis=1), 1), "float32"),
        ),
        {"x": (5, 40)},
    ),
    "where_transpose_reshape": (
        lambda bb, x: OP.reshape(
            bb.emit(
                OP.permute_dims(OP.where(OP.greater(x, OP.abs(x)), x, OP.negative(x)), [2, 0, 1])
            ),
            (7, 24),
        ),
        {"x": (4, 6, 7)},
    ),
    "transpose_broadcast_heads": (
        lambda bb, x: OP.broadcast_to(
            OP.permute_dims(OP.add(OP.multiply(x, x), x), [0, 2, 1]), (1, 12, 64, 128)),
        {"x": (1, 128, 64)},
    ),
    "rotary_transpose": (
        lambda bb, x: OP.permute_dims(
            OP.add(OP.multiply(x, OP.cos(x)), OP.multiply(OP.flip(x, axis=2), x)), [0, 2, 1]),
        {"x": (3, 40, 32)},
    ),
    "elementwise_chain": (
        lambda bb, x: OP.multiply(OP.nn.silu(OP.tanh(OP.add(x, x))), OP.exp(x)),
        {"x": (3, 50, 33)},
    ),
}


@pytest.mark.parametrize("target", [TARGET, GENERIC], ids=["host", "generic"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_numerics_match_stock(name, target):
    build, shapes = CASES[name]
    _check_numerics(*_graph(build, shapes), target=target)


def test_symbolic_batch_numerics_match_stock():
    n = tirx.Var("n", "int64")
    rng = np.random.default_rng(2)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(OP.nn.gelu(OP.matmul(x, _const(rng, 64, 48))))
            y = bb.emit(OP.nn.softmax(y, axis=-1))
            out = bb.emit_output(OP.nn.layer_norm(y, _const(rng, 48), _const(rng, 48), axes=[-1]))
        bb.emit_func_output(out)
    _check_numerics(bb.get(), {"x": rng.standard_normal((37, 64)).astype("float32")})


def _int_graph(build, shapes: dict[str, tuple[tuple, str]]):
    rng = np.random.default_rng(3)
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, d)) for n, (s, d) in shapes.items()]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(*params))
        bb.emit_func_output(out)
    return bb.get(), {n: rng.integers(-9, 9, s).astype(d) for n, (s, d) in shapes.items()}


_I64, _I7 = relax.const(3, "int64"), relax.const(7, "int64")
INT_CASES = {
    "sum_int64": (lambda x: OP.sum(OP.multiply(x, x), axis=[1]), {"x": ((33, 130), "int64")}),
    "max_int32": (lambda x: OP.max(x, axis=[1]), {"x": ((40, 96), "int32")}),
    "cumsum_int64": (lambda x: OP.add(OP.cumsum(x, axis=1), x), {"x": ((4, 64), "int64")}),
    "matmul_int32": (lambda a, b: OP.matmul(a, b),
                     {"a": ((20, 36), "int32"), "b": ((36, 24), "int32")}),
    "index_math_int64": (
        lambda x: OP.add(OP.floor_mod(x, _I64), OP.multiply(OP.floor_divide(x, _I64), x)),
        {"x": ((8, 1000), "int64")},
    ),
    "mask_count": (
        lambda x: OP.sum(OP.astype(OP.logical_and(OP.greater(x, _I64), OP.less(x, _I7)), "int64"),
                         axis=[1]),
        {"x": ((16, 200), "int64")},
    ),
}


@pytest.mark.parametrize("name", sorted(INT_CASES))
def test_integer_kernels_schedule_on_any_isa(name):
    """Integer and index kernels (position ids, masks) under our rules: compiled for SSE2,
    AVX2, AVX-512 (Intel and AMD) and run on this host, equal to the stock build."""
    mod, inputs = _int_graph(*INT_CASES[name])
    for mcpu in ("x86-64", "haswell", "skylake-avx512", "znver4"):
        target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
        with target:
            tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target))
    ref = run(tvm.compile(mod, TARGET, relax_pipeline=strategy_pipeline("stock", TARGET)), inputs)
    for strategy in ("none", "tvm", "costfuse"):
        with TARGET:
            ex = tvm.compile(mod, TARGET, relax_pipeline=strategy_pipeline(strategy, TARGET))
        for got, want in zip(run(ex, inputs), ref, strict=True):
            np.testing.assert_array_equal(got, want)


def _zoo_names() -> list[str]:
    try:
        from tvm_costfuse import models
    except ImportError:  # pragma: no cover - zoo is another module's job
        return []
    return models.zoo.names()


@pytest.mark.parametrize("name", _zoo_names())
def test_zoo_small_numerics_match_stock(name):
    from tvm_costfuse import models

    _check_numerics(*models.load(name, small=True))


def test_epilogue_inline_keeps_a_tensor_other_blocks_read():
    """synth-9's conv + BN + ReLU + residual adds as one kernel: add1's tensor is read by two
    later adds, one of them (add2) an output of the kernel. Inlining add2 into add1's block
    would overwrite add1's tensor, which add3 still reads; TVM 0.27 lets it happen and lowering
    then fails ("used before its definition"). Built and checked against the unfused model."""
    from tvm_costfuse import models
    from tvm_costfuse.partition import ApplyPartition
    from tvm_costfuse.pipelines import build_pipeline

    mod, inputs = models.load("synth-9")
    group = ["conv2d", "batch_norm", "bn", "relu", "add", "add1", "add2", "add3"]
    # the batch norm as the importer left it (unfolded): the group's four elementwise ops
    ref = run(tvm.compile(mod, target=TARGET,
                          relax_pipeline=build_pipeline(TARGET, fold=False)), inputs)
    ex = tvm.compile(mod, target=TARGET,
                     relax_pipeline=build_pipeline(TARGET, ApplyPartition([group]),
                                                   schedule_pass(TARGET), fold=False))
    assert max_mismatch(ref, run(ex, inputs)) <= 1.0


def test_the_catalog_lists_every_rules_cards_in_the_rules_order():
    """Each final schedule class (what the cost models table) is one card's; the catalog lists
    the CPU rules' cards in the rules' order (first claim wins, as the first rule that applies
    does); a card names the rule that carries it and claims only on targets it prices."""
    from tvm_costfuse.schedules.catalog import CARDS, claim
    from tvm_costfuse.schedules.classes import FINAL, UNLEARNED

    assert [card for rule in rules() for card in rule.cards] == list(CARDS)
    assert sorted(card.cls for card in CARDS) == sorted(FINAL + UNLEARNED)
    for rule in rules():
        assert all(card.rule == type(rule).__name__ for card in rule.cards)
    fallback = CARDS[-1]
    for kind in ("cpu", "cuda"):
        assert fallback.claims(None, kind) and kind in fallback.efficiency
    from tvm_costfuse import FusionConfig, build_graph, models
    from tvm_costfuse.cost.extract import group_features
    from tvm_costfuse.pipelines import prepare
    from tvm_costfuse.targets import resolve
    from tvm_costfuse.transform import plan_module

    mod = prepare(models.load("bert_layer", small=True)[0], TARGET)
    graph = build_graph(mod)
    groups = plan_module(mod, resolve(TARGET).desc, FusionConfig()).groups
    claimed = set()
    for members in [*groups, *([n.name] for n in graph.nodes)]:
        features = group_features(graph, members)
        for kind in ("cpu", "cuda"):
            card = claim(features, kind)
            assert kind in card.efficiency and features.schedule_on(kind) == card.cls
            claimed.add(card.cls)
    assert len(claimed) >= 4, claimed


@pytest.mark.parametrize("stride, ceil", [(2, True), (1, False)], ids=["s2_ceil", "s1_pad"])
def test_pooling_window_unrolled_under_a_parallel_row_loop(stride: int, ceil: bool):
    # fused into one parallel loop, every output recomputed its coordinates with 64-bit
    # divisions and ran a rolled window; the last spatial loop (the output column) stays
    # serial below the parallel loop
    x = relax.Var("x", relax.TensorType((1, 16, 23, 23), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(OP.nn.max_pool2d(x, (3, 3), (stride, stride),
                                         padding=(0,) * 4 if ceil else (1,) * 4,
                                         ceil_mode=ceil))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    [func] = [f for f in relax.transform.LegalizeOps()(mod).functions.values()
              if isinstance(f, tirx.PrimFunc)]
    scheduled = _scheduled(Fallback(), func)
    loops = _loops(scheduled)
    rows = 11 if stride == 2 else 23
    assert [int(lp.extent) for lp in loops if lp.kind == tirx.ForKind.PARALLEL] == [16 * rows]
    assert sum(lp.kind == tirx.ForKind.UNROLLED for lp in loops) == 2  # the 3 x 3 window
    _check_numerics(mod, {"x": _RNG.standard_normal((1, 16, 23, 23)).astype("float32")})


@T.prim_func(private=True, s_tir=True)
def concat_max_pool(a: T.Buffer((1, 8, 17, 17), "float32"), b: T.Buffer((1, 8, 17, 17), "float32"),
                    out: T.Buffer((1, 16, 8, 8), "float32")):
    cat = T.sblock_alloc_buffer((1, 16, 17, 17))
    for n, c, h, w in T.grid(1, 16, 17, 17):
        with T.sblock("concat"):
            vn, vc, vh, vw = T.axis.remap("SSSS", [n, c, h, w])
            cat[vn, vc, vh, vw] = T.if_then_else(vc >= 8, b[vn, vc - 8, vh, vw], a[vn, vc, vh, vw])
    for n, c, h, w, rh, rw in T.grid(1, 16, 8, 8, 3, 3):
        with T.sblock("pool"):
            vn, vc, vh, vw, vrh, vrw = T.axis.remap("SSSSRR", [n, c, h, w, rh, rw])
            with T.init():
                out[vn, vc, vh, vw] = T.float32(-3.4e38)
            out[vn, vc, vh, vw] = T.max(out[vn, vc, vh, vw], cat[vn, vc, vh * 2 + vrh, vw * 2 + vrw])


def test_pooling_window_keeps_a_concat_it_rereads_materialized():
    """Overlapping windows read each element of a concat about (3 / 2)^2 times: inlined, every
    tap selected between the inputs in scalar code (squeezenet's 128 x 55 x 55 concat + 3 x 3 /
    2 pool: 330 us against 85 for the two apart). The concat stays a block of its own; a pad's
    guard (a load or a constant) is still inlined into the window."""
    func = _scheduled(Fallback(), concat_max_pool)
    assert {"concat", "pool"} <= _block_names(func)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((1, 8, 17, 17)).astype("float32") for _ in range(2))
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                      target=TARGET)
    out = tvm.runtime.tensor(np.zeros((1, 16, 8, 8), "float32"))
    lib(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    cat = np.concatenate([a, b], axis=1)
    want = np.stack([cat[..., 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(-1, -2))
                     for i in range(8) for j in range(8)], axis=-1).reshape(1, 16, 8, 8)
    np.testing.assert_array_equal(out.numpy(), want)

    x = relax.Var("x", relax.TensorType((1, 16, 14, 14), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(OP.nn.max_pool2d(x, (3, 3), (1, 1), padding=(1,) * 4)))
        bb.emit_func_output(out)
    [padded] = [f for f in relax.transform.LegalizeOps()(bb.get()).functions.values()
                if isinstance(f, tirx.PrimFunc)]
    assert len(_block_names(_scheduled(Fallback(), padded)) - {"root"}) == 1


@pytest.mark.parametrize("taps, stride, dilation, rereads", [
    (3, 2, 1, True),    # a 3 x 3 / 2 pool: neighbouring windows share a column
    (2, 2, 1, False),   # 2 x 2 / 2: windows tile the input
    (3, 4, 2, True),    # taps 0, 2, 4 of windows 4 apart: the last is the next one's first
    (3, 4, 1, False),
])
def test_window_rereads_knows_which_windows_overlap(taps, stride, dilation, rereads):
    from tvm import s_tir, te

    from tvm_costfuse.schedules._common import window_rereads

    a = te.placeholder((1, 4, 33), name="a")
    r = te.reduce_axis((0, taps), "r")
    width = (33 - dilation * (taps - 1) - 1) // stride + 1
    pool = te.compute((1, 4, width), lambda n, c, y: te.max(
        a[n, c, y * stride + r * dilation], axis=r), name="pool")
    sch = s_tir.Schedule(te.create_prim_func([a, pool]))
    block = sch.get(sch.get_sblock("pool"))
    assert window_rereads(block, block.reads[0].source) == rereads


def test_window_rereads_is_false_for_a_reduction_over_a_flattened_axis():
    from tvm import s_tir, te

    from tvm_costfuse.schedules._common import window_rereads

    a = te.placeholder((1, 8 * 49), name="a")
    r = te.reduce_axis((0, 8), "r")
    total = te.compute((1, 49), lambda n, y: te.sum(a[n, r * 49 + y], axis=r), name="sum")
    sch = s_tir.Schedule(te.create_prim_func([a, total]))
    block = sch.get(sch.get_sblock("sum"))
    assert not window_rereads(block, block.reads[0].source)


def test_pooling_window_with_too_few_rows_stays_one_parallel_loop():
    # 2 channels x 2 output rows are too few parallel chunks for the cores: the outputs stay
    # fused into one parallel loop, the window rolled
    x = relax.Var("x", relax.TensorType((1, 2, 5, 5), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(OP.nn.max_pool2d(x, (3, 3), (2, 2))))
        bb.emit_func_output(out)
    [func] = [f for f in relax.transform.LegalizeOps()(bb.get()).functions.values()
              if isinstance(f, tirx.PrimFunc)]
    loops = _loops(_scheduled(Fallback(), func))
    assert tirx.ForKind.UNROLLED not in {lp.kind for lp in loops}
    assert [int(lp.extent) for lp in loops] == [2 * 2 * 2, 3, 3]  # the outputs fused, a window
