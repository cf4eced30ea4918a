"""Pointwise (1x1) NCHW convolutions on the GEMM micro-kernel with the image's pixels merged
into one column axis (schedules/columns.py): the input is read in place (no padded copy), the
register tile's write-back is exact, the numbers match PyTorch with the fused epilogue, and
the cost model prices the merged tile.

Structural checks use explicit ISAs (AVX2 ``haswell``, AVX-512 ``skylake-avx512``) and only
compile; numeric checks run on this host's ISA and on generic x86-64 (SSE2, 4 lanes).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm_costfuse.schedules import Contraction, columns
from tvm_costfuse.schedules.efficiency import fraction_of_peak
from tvm_costfuse.schedules.gemm_tile import pick_tile
from tvm_costfuse.schedules.prepack import mark_constant_weights

from tvm_costfuse.measurement.timing import run
from tvm_costfuse.pipelines import fuse
from tvm_costfuse.strategies import fusion_pass, strategy_pipeline
from tvm_costfuse.targets import host_target, isa

torch = pytest.importorskip("torch")

HOST = host_target(2)
GENERIC = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 2})
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
ISAS = pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])

# name: (batch, in channels, out channels, height, width, activation, residual)
CASES = {
    "16_to_96_32x32_relu6": (1, 16, 96, 32, 32, "relu6", False),
    "24_to_40_28x28_residual": (1, 24, 40, 28, 28, "none", True),
    "batch2_16_to_20_16x16_hardswish": (2, 16, 20, 16, 16, "hardswish", False),
    "32_to_16_12x20_silu": (1, 32, 16, 12, 20, "silu", True),
}
_ACTS = {"relu6": (relax.op.nn.relu6, torch.nn.functional.relu6),
         "hardswish": (lambda y: relax.op.multiply(relax.op.multiply(
             y, relax.op.nn.relu6(relax.op.add(y, relax.const(3.0, "float32")))),
             relax.const(1.0 / 6.0, "float32")), torch.nn.functional.hardswish),
         "silu": (relax.op.nn.silu, torch.nn.functional.silu),
         "none": (lambda y: y, lambda y: y)}


def _case(batch, cin, cout, h, w, act, residual):
    """conv 1x1 -> + bias -> ``act`` [-> + residual] as Relax, its inputs, PyTorch's output."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, cin, h, w)).astype("float32")
    wt = (rng.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype("float32")
    bias = rng.standard_normal((1, cout, 1, 1)).astype("float32")
    res = rng.standard_normal((batch, cout, h, w)).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    rv = relax.Var("res", relax.TensorType(res.shape, "float32"))
    params, inputs = ([xv, rv], {"x": x, "res": res}) if residual else ([xv], {"x": x})
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(xv, relax.const(wt)))
            y = bb.emit(_ACTS[act][0](bb.emit(relax.op.add(y, relax.const(bias)))))
            if residual:
                y = bb.emit(relax.op.add(y, rv))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    t = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt))
    ref = _ACTS[act][1](t + torch.from_numpy(bias)).numpy() + (res if residual else 0)
    return bb.get(), inputs, ref


def _conv_func(mod, target) -> tirx.PrimFunc:
    fused = mark_constant_weights(fuse(mod, target, fusion_pass("tvm", target)))
    funcs = [f for gv, f in fused.functions.items()
             if isinstance(f, tirx.PrimFunc) and "conv" in gv.name_hint]
    assert len(funcs) == 1  # conv, bias, activation and the residual add: one kernel
    return funcs[0]


@pytest.mark.parametrize("target", [HOST, GENERIC], ids=["host", "x86-64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_pointwise_matches_pytorch_with_fused_epilogue(name, target, monkeypatch):
    mod, inputs, ref = _case(*CASES[name])
    merged = []
    monkeypatch.setattr(columns, "merge_buffer",
                        lambda *a, real=columns.merge_buffer: merged.append(real(*a)))
    ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target))
    assert merged, "the pixels were not merged into the columns"
    got = run(ex, inputs)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@ISAS
def test_pixels_merge_into_one_column_axis_read_in_place(target):
    """16 -> 96 channels at 32 x 32: 1024 merged pixels, which whole tiles divide; nothing is
    allocated but the register tile, laid out over the merged axis, and the update loads
    full vectors."""
    mod, _, _ = _case(*CASES["16_to_96_32x32_relu6"])
    func = _conv_func(mod, target)
    with target:
        sch = Contraction().apply(func, target, False)
    assert sch is not None
    out = sch.mod["main"]
    bufs = []
    tvm_ffi.structural_walk(out.body, (s_tir.SBlock, lambda b: bufs.extend(b.alloc_buffers)))
    assert [(tuple(int(d) for d in b.shape), b.scope()) for b in bufs] == [
        ((1, 96, 1024), "local")]
    loops: list = []
    tvm_ffi.structural_walk(out.body, (tirx.For, loops.append), order="pre")
    lanes = isa.vector_lanes(target, "float32")
    update = [lp for lp in loops if lp.kind == tirx.ForKind.VECTORIZED
              and "_update" in lp.body.script()]
    assert update and int(update[0].extent) % lanes == 0
    asm = tvm.compile(tvm.IRModule({"main": out.with_attr("global_symbol", "main")}),
                      target).mod.inspect_source("asm")
    assert "gather" not in asm and "vinsertps" not in asm  # contiguous vector loads


@ISAS
def test_tile_choice_merges_where_rows_would_pad(target):
    lanes, registers = isa.vector_lanes(target, "float32"), isa.vector_registers(target)
    tile, cols = pick_tile(96, 112, lanes, registers, weight=False, height=112)
    assert cols == 112 * 112 and (112 * 112) % tile.cols == 0
    # a constant weight streamed (packed at compile time to its own width) never merges
    assert pick_tile(96, 112, lanes, registers, weight=True, height=112)[1] == 112
    # nothing divides 7 x 7 = 49 pixels: the rows stay
    assert pick_tile(96, 7, lanes, registers, weight=False, height=7)[1] == 7


def test_cost_model_prices_the_merged_tile():
    """The geometry records the mergeable height; without it (older records) the padded
    per-row tile is priced, lower."""
    merged = (16, (96, 112, False, 112), None, 112, None)
    for lanes, registers in ((16, 32), (8, 16)):
        path, share = fraction_of_peak(merged, lanes, registers)
        old = fraction_of_peak((16, (96, 112, False), None, 112, None), lanes, registers)[1]
        assert path == "gemm" and old <= share < 1.0


def _conv_bn(cin=16, cout=48, hw=16):
    """conv 1x1 -> inference batch_norm -> ReLU6, as the torch importer leaves it (unfolded)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, cin, hw, hw)).astype("float32")
    w = (rng.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype("float32")
    gamma, beta, mean = (rng.standard_normal(cout).astype("float32") for _ in range(3))
    var = rng.uniform(0.5, 1.5, cout).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(xv, relax.const(w)))
            bn = bb.emit(relax.op.nn.batch_norm(
                y, *(relax.const(a) for a in (gamma, beta, mean, var)), axis=1, training=False))
            gv = bb.emit_output(relax.op.clip(bb.emit(relax.TupleGetItem(bn, 0)), 0.0, 6.0))
        bb.emit_func_output(gv)
    t = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w))
    t = torch.nn.functional.batch_norm(t, *(torch.from_numpy(a) for a in (mean, var, gamma,
                                                                          beta)), eps=1e-5)
    return bb.get(), {"x": x}, torch.nn.functional.relu6(t).numpy()


@pytest.mark.parametrize("target", [HOST, GENERIC], ids=["host", "x86-64"])
def test_batch_norm_epilogue_matches_pytorch(target):
    mod, inputs, ref = _conv_bn()
    ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("costfuse", target))
    np.testing.assert_allclose(run(ex, inputs)[0], ref, rtol=1e-4,
                               atol=1e-4 * float(np.abs(ref).max()))


def test_batch_norm_epilogue_multiplies_by_the_reciprocal():
    """The per-channel division is one multiply per output vector (vector divisions: none)."""
    mod, _, _ = _conv_bn()
    ex = tvm.compile(mod, AVX512, relax_pipeline=strategy_pipeline("costfuse", AVX512))
    asm = ex.mod.inspect_source("asm") if not ex.mod.imports else \
        ex.mod.imports[0].inspect_source("asm")
    assert "vfmadd" in asm and not re.search(r"vdivps\s+%zmm", asm)
