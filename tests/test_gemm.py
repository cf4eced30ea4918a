"""The contraction micro-kernel (schedules/gemm.py): every matmul form the importers emit gets
it, its tile fits the target's register file, its inner loop is FMAs on registers, and the
numbers match TVM's stock build.

Structural checks use explicit ISAs (AVX2 ``haswell``, AVX-512 ``skylake-avx512``) and only
compile, so they hold on any x86-64 host; numeric checks run on this host's own ISA.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.script import tirx as T
from tvm_costfuse.schedules import Contraction, rules
from tvm_costfuse.schedules.gemm import accumulator_budget, choose_tile
from tvm_costfuse.schedules.gemm_tile import PAD_WEIGHT_ROWS, pick_tile
from tvm_costfuse.schedules.prepack import mark_constant_weights

from tvm_costfuse.measurement.timing import max_mismatch, run
from tvm_costfuse.pipelines import fuse
from tvm_costfuse.strategies import fusion_pass, strategy_pipeline
from tvm_costfuse.targets import host_target, isa

TARGET = host_target(2)
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
ISAS = pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
RTOL, ATOL = 1e-4, 1e-5


@T.prim_func(private=True, s_tir=True)
def qk_transposed(q: T.Buffer((1, 12, 197, 64), "float32"),
                  k: T.Buffer((1, 12, 197, 64), "float32"),
                  s: T.Buffer((1, 12, 197, 197), "float32")):
    """Attention scores with the key read transposed (``q @ k^T``): 197 is prime."""
    for b, h, i, j, r in T.grid(1, 12, 197, 197, 64):
        with T.sblock("matmul"):
            vb, vh, vi, vj, vr = T.axis.remap("SSSSR", [b, h, i, j, r])
            with T.init():
                s[vb, vh, vi, vj] = T.float32(0)
            s[vb, vh, vi, vj] = s[vb, vh, vi, vj] + q[vb, vh, vi, vr] * k[vb, vh, vj, vr]


@T.prim_func(private=True, s_tir=True)
def qk_transposed_even(q: T.Buffer((8, 128, 64), "float32"), k: T.Buffer((8, 128, 64), "float32"),
                       s: T.Buffer((8, 128, 128), "float32")):
    """The same with extents the tile divides: nothing padded, the key still packed."""
    for h, i, j, r in T.grid(8, 128, 128, 64):
        with T.sblock("matmul"):
            vh, vi, vj, vr = T.axis.remap("SSSR", [h, i, j, r])
            with T.init():
                s[vh, vi, vj] = T.float32(0)
            s[vh, vi, vj] = s[vh, vi, vj] + q[vh, vi, vr] * k[vh, vj, vr]


@T.prim_func(private=True, s_tir=True)
def linear_bias(x: T.Buffer((197, 384), "float32"), w: T.Buffer((384, 1536), "float32"),
                bias: T.Buffer((1536,), "float32"), out: T.Buffer((197, 1536), "float32")):
    acc = T.sblock_alloc_buffer((197, 1536))
    for i, j, r in T.grid(197, 1536, 384):
        with T.sblock("matmul"):
            vi, vj, vr = T.axis.remap("SSR", [i, j, r])
            with T.init():
                acc[vi, vj] = T.float32(0)
            acc[vi, vj] = acc[vi, vj] + x[vi, vr] * w[vr, vj]
    for i, j in T.grid(197, 1536):
        with T.sblock("epilogue"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = acc[vi, vj] + bias[vj]


def _scheduled(func, target) -> tirx.PrimFunc:
    sch = Contraction().apply(func, target, False)
    assert sch is not None, "the contraction rule did not apply"
    return sch.mod["main"]


def _loops(func) -> list[tirx.For]:
    found = []
    tvm_ffi.structural_walk(func.body, (tirx.For, found.append), order="pre")
    return found


def _buffers(func) -> dict[str, tuple]:
    found = {}

    def visit(block):
        for buf in block.alloc_buffers:
            found[buf.name] = (tuple(int(d) for d in buf.shape), buf.scope())

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, visit))
    return found


@ISAS
@pytest.mark.parametrize("shape", [(197, 1536), (197, 197), (128, 64), (1, 1000)])
def test_tile_fits_the_register_file(target, shape):
    lanes, registers = isa.vector_lanes(target, "float32"), isa.vector_registers(target)
    tile = choose_tile(*shape, lanes, registers)
    assert tile.cols % lanes == 0 and tile.rows <= shape[0]
    assert tile.rows * tile.vectors <= accumulator_budget(registers)
    assert tile.rows * tile.vectors >= min(8, shape[0] * tile.vectors)  # latency hidden


@ISAS
@pytest.mark.parametrize("func", [qk_transposed, qk_transposed_even], ids=["197", "128"])
def test_transposed_batched_matmul_is_packed_and_register_blocked(target, func):
    rank = len(func.params[0].shape)
    func = _scheduled(func, target)
    lanes = isa.vector_lanes(target, "float32")
    bufs = _buffers(func)
    acc = [shape for shape, scope in bufs.values() if scope == "local"]
    assert acc, "no register accumulator"
    panels = [shape for name, (shape, _) in bufs.items() if name.startswith("k")]
    assert len(panels) == 1 and len(panels[0]) == rank + 1  # (.., j / cols, r, cols)
    assert panels[0][-1] % lanes == 0
    kinds = {lp.kind for lp in _loops(func)}
    assert {tirx.ForKind.PARALLEL, tirx.ForKind.UNROLLED, tirx.ForKind.VECTORIZED} <= kinds
    update = [lp for lp in _loops(func) if lp.kind == tirx.ForKind.VECTORIZED
              and "matmul_update" in lp.body.script()]
    assert update and int(update[0].extent) % lanes == 0


def _inner_loop(asm: str) -> str:
    """The basic block with the most FMAs (the micro-kernel's reduction step)."""
    blocks = [re.split(r"\n\tj\w+\s", b)[0] for b in re.split(r"\n\.LBB\w+:", asm)]
    return max(blocks, key=lambda b: b.count("vfmadd"))


@ISAS
def test_inner_loop_is_fmas_on_registers(target):
    """Compile only (explicit ISA): the reduction step is full-width FMAs, no stack traffic."""
    func = _scheduled(linear_bias, target)
    ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    body = _inner_loop(ex.mod.inspect_source("asm"))
    reg = "zmm" if isa.vector_bits(target) == 512 else "ymm"
    lanes = isa.vector_lanes(target, "float32")
    tile = choose_tile(197, 1536, lanes, isa.vector_registers(target), cols_must_divide=True)
    fmas = [ln for ln in body.splitlines() if "vfmadd" in ln]
    assert len(fmas) >= tile.rows * tile.vectors and all(reg in ln for ln in fmas)
    assert "rsp" not in body  # no spill or reload


def _nhwc_pointwise(rows: int, cols: int, channels: int, out_channels: int) -> tirx.PrimFunc:
    """The legalized 1x1 convolution of a ``rows x cols x channels`` NHWC image by a constant
    HWIO weight, as the layout step leaves one: the weight is the streamed operand."""
    x = relax.Var("x", relax.TensorType((1, rows, cols, channels), "float32"))
    w = np.ones((1, 1, channels, out_channels), "float32")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.nn.conv2d(x, relax.const(w), data_layout="NHWC",
                                                   kernel_layout="HWIO"))
        bb.emit_func_output(gv)
    fused = fuse(bb.get(), "llvm", relax.transform.FuseOps())
    return next(mark_constant_weights(fused)[gv] for gv, f in fused.functions.items()
                if isinstance(f, tirx.PrimFunc))


@ISAS
@pytest.mark.parametrize("rows, padded", [(28, True), (7, False)])
def test_a_ragged_weight_is_padded_to_whole_vectors_where_enough_rows_reuse_it(
        target, rows, padded):
    """58 output channels, which no multiple of the vector divides: over a 28 x 28 image (784
    rows per weight element) the weight is padded and the tile runs whole vectors; over a 7 x 7
    one (49 rows) the copy would cost more, and the general tiling keeps what divides."""
    assert (rows * rows >= PAD_WEIGHT_ROWS) == padded
    lanes = isa.vector_lanes(target, "float32")
    func = _scheduled(_nhwc_pointwise(rows, rows, 58, 58), target)
    update = [int(lp.extent) for lp in _loops(func) if lp.kind == tirx.ForKind.VECTORIZED
              and "conv2d_nhwc_update" in lp.body.script()]
    assert update, "no vectorized update loop"
    assert (update[0] % lanes == 0) == padded, update
    tile, cols = pick_tile(rows, 58, lanes, isa.vector_registers(target), True, None,
                           rows * rows)
    assert (tile is not None) == padded and cols == 58


# ----------------------------------------------------------------------------- numerics


def _module(a_shape, b_shape, transpose_b=False, bias=False, weight=False):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype("float32")
    b = rng.standard_normal(b_shape).astype("float32")
    bb = relax.BlockBuilder()
    xa = relax.Var("a", relax.TensorType(a_shape, "float32"))
    params, inputs = [xa], {"a": a}
    if weight:
        xb = relax.const(b)
    else:
        xb = relax.Var("b", relax.TensorType(b_shape, "float32"))
        params.append(xb)
        inputs["b"] = b
    with bb.function("main", params):
        with bb.dataflow():
            rank = len(b_shape)
            rhs = relax.op.permute_dims(xb, [*range(rank - 2), rank - 1, rank - 2]) \
                if transpose_b else xb
            out = relax.op.matmul(xa, rhs)
            if bias:
                n = b_shape[-2] if transpose_b else b_shape[-1]
                out = relax.op.add(out, relax.const(rng.standard_normal(n).astype("float32")))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get(), inputs


FORMS = {
    "qk_transposed_4d": ((1, 12, 197, 64), (1, 12, 197, 64), True, False, False),
    "pv_4d": ((1, 12, 197, 197), (1, 12, 197, 64), False, False, False),
    "broadcast_batch": ((2, 3, 37, 64), (64, 48), False, False, False),
    "batch_of_one_broadcast": ((4, 33, 40), (1, 40, 24), False, False, False),
    "linear_weight_bias": ((1, 197, 96), (96, 160), False, True, True),
    "linear_transposed_weight": ((197, 96), (160, 96), True, True, True),
    # a weight no tile's columns divide: padded by a copy from PAD_WEIGHT_ROWS rows on
    "linear_ragged_weight": ((1, 197, 96), (96, 58), False, True, True),
    "linear_ragged_weight_few_rows": ((7, 96), (96, 58), False, True, True),
}


@pytest.mark.parametrize("strategy", ["tvm", "costfuse"])
@pytest.mark.parametrize("name", sorted(FORMS))
def test_matmul_forms_get_the_contraction_rule_and_match_stock(name, strategy):
    mod, inputs = _module(*FORMS[name])
    fused = fuse(mod, TARGET, fusion_pass(strategy, TARGET))
    with TARGET:
        for gv, func in fused.functions.items():
            if isinstance(func, tirx.PrimFunc) and "matmul" in gv.name_hint:
                first = next(r for r in rules() if r.apply(func, TARGET, False) is not None)
                assert isinstance(first, Contraction), gv.name_hint
    ref = run(tvm.compile(mod, TARGET, relax_pipeline=strategy_pipeline("stock", TARGET)),
              inputs)
    got = run(tvm.compile(mod, TARGET, relax_pipeline=strategy_pipeline(strategy, TARGET)),
              inputs)
    assert max_mismatch(ref, got, RTOL, ATOL) <= 1.0


@pytest.mark.parametrize("model", ["vit_b_16", "vit", "bert"])
def test_corpus_transformer_matmuls_all_get_the_contraction_rule(model):
    """Every Linear of the corpus transformers, as the PyTorch importer emits them, after
    CostFuse, gets the contraction rule; attention's batch matmuls (per-head 197 or 128 rows,
    K = head width), which CostFuse fuses with the softmax between them, the attention rule."""
    pytest.importorskip("torch")
    from tvm_costfuse.schedules import Attention

    from tvm_costfuse.models import corpus

    mod = corpus.load(model, small=True)[0]
    fused = fuse(mod, TARGET, fusion_pass("costfuse", TARGET))
    matmuls = attention = 0
    with TARGET:
        for gv, func in fused.functions.items():
            if isinstance(func, tirx.PrimFunc) and "matmul" in gv.name_hint:
                first = next(r for r in rules() if r.apply(func, TARGET, False) is not None)
                if "softmax" in gv.name_hint:
                    assert isinstance(first, Attention), gv.name_hint
                    attention += 1
                else:
                    assert isinstance(first, Contraction), gv.name_hint
                    matmuls += 1
    assert matmuls >= 3 and attention >= 1


def _gemv(k: int, n: int) -> tirx.PrimFunc:
    x = relax.Var("x", relax.TensorType((1, k), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(np.zeros((k, n), "float32"))
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return next(f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc))


@pytest.mark.parametrize(("k", "n", "parallel"), [(768, 256, True), (768, 128, True),
                                                  (128, 128, False), (4096, 32, False)])
def test_a_gemv_runs_on_every_core_once_its_weights_outweigh_the_pool_wakeup(k, n, parallel):
    """A GEMV reads each weight once: 768 x 256 (196608 FMAs, under MIN_PARALLEL_FMAS) is
    bound by its 768 KiB of weights, and parallel, as is 768 x 128 (384 KiB); 64 KiB is not
    worth waking the pool, and 4096 x 32 (512 KiB) is one tile of columns: nothing to share."""
    from tvm_costfuse.schedules._common import MIN_PARALLEL_FMAS

    assert k * n < MIN_PARALLEL_FMAS
    kinds = {lp.kind for lp in _loops(_scheduled(_gemv(k, n), AVX512))}
    assert (tirx.ForKind.PARALLEL in kinds) == parallel
