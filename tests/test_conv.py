"""The direct convolution kernel (schedules/conv.py): the NC(H)W convolutions the importers emit
(windowed, strided, grouped, 1-d, ragged widths, odd channel counts) get it, with the weight
packed at compile time and the epilogue fused; numbers match PyTorch; its inner loop is vector
FMAs on registers.

Structural checks use explicit ISAs (AVX2 ``haswell``, AVX-512 ``skylake-avx512``) and only
compile; numeric checks run on this host's ISA and on generic x86-64 (SSE2, 4 lanes).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm_costfuse.schedules import Contraction, depthwise
from tvm_costfuse.schedules._common import contraction_parallel, is_spatial, root_blocks
from tvm_costfuse.schedules.contraction import contraction_operands
from tvm_costfuse.schedules.conv import _operand_registers, choose_conv_tile
from tvm_costfuse.schedules.depthwise import choose_depthwise_tile
from tvm_costfuse.schedules.gemm import accumulator_budget
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

F = torch.nn.functional


def _hardswish(y):
    return relax.op.multiply(relax.op.multiply(
        y, relax.op.nn.relu6(relax.op.add(y, relax.const(3.0, "float32")))),
        relax.const(1.0 / 6.0, "float32"))


# activation: (Relax, PyTorch)
_ACTS = {"relu": (relax.op.nn.relu, torch.relu), "relu6": (relax.op.nn.relu6, F.relu6),
         "hardswish": (_hardswish, F.hardswish), "silu": (relax.op.nn.silu, F.silu)}

# name: (input shape, weight shape, stride, padding per spatial dim, groups, residual add)
CASES = {
    "3x3_s1_p1": ((1, 32, 14, 14), (32, 32, 3, 3), 1, (1, 1), 1, True),
    "3x3_s2": ((1, 16, 15, 15), (32, 16, 3, 3), 2, (1, 1), 1, False),
    "7x7_s2_p3": ((1, 3, 32, 32), (32, 3, 7, 7), 2, (3, 3), 1, False),
    "1x7_odd_channels": ((1, 24, 9, 9), (40, 24, 1, 7), 1, (0, 3), 1, False),
    "7x1_odd_channels": ((1, 40, 9, 9), (24, 40, 7, 1), 1, (3, 0), 1, False),
    "grouped_3x3": ((1, 64, 8, 8), (64, 16, 3, 3), 1, (1, 1), 4, True),
    "conv1d_k10_s5": ((1, 1, 400), (32, 1, 10), 5, (0,), 1, False),
    "conv1d_k3_s2": ((1, 32, 79), (32, 32, 3), 2, (0,), 1, False),
    "conv1d_grouped_k16": ((1, 64, 20), (64, 16, 16), 1, (8,), 4, False),
    "small_7x7": ((1, 64, 7, 7), (64, 64, 3, 3), 1, (1, 1), 1, True),
    "odd_24_to_40_14x14": ((1, 24, 14, 14), (40, 24, 3, 3), 1, (1, 1), 1, False),
    "prime_width_17": ((1, 16, 17, 17), (32, 16, 3, 3), 1, (1, 1), 1, True),
}


def _arrays(case):
    x_shape, w_shape, _, _, _, residual = case
    rng = np.random.default_rng(0)
    f = w_shape[0]
    return {
        "x": rng.standard_normal(x_shape).astype("float32"),
        "w": (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype("float32"),
        "bias": rng.standard_normal(f).astype("float32"),
        "scale": rng.uniform(0.5, 1.5, f).astype("float32"),
        "shift": rng.standard_normal(f).astype("float32"),
        "res": rng.standard_normal(_out_shape(case)).astype("float32") if residual else None,
    }


def _out_shape(case):
    x_shape, w_shape, stride, pad, _, _ = case
    spatial = [(n + 2 * p - k) // stride + 1 for n, k, p in zip(x_shape[2:], w_shape[2:], pad)]
    return (x_shape[0], w_shape[0], *spatial)


def _module(case, a, act="relu"):
    """conv -> + bias -> BN (scale, shift) -> ``act`` [-> + residual], weights constant."""
    x_shape, w_shape, stride, pad, groups, residual = case
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    params, inputs = [x], {"x": a["x"]}
    if residual:
        r = relax.Var("res", relax.TensorType(_out_shape(case), "float32"))
        params.append(r)
        inputs["res"] = a["res"]
    per_channel = (w_shape[0],) + (1,) * (len(x_shape) - 2)
    op = relax.op.nn.conv1d if len(x_shape) == 3 else relax.op.nn.conv2d
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(op(x, relax.const(a["w"]), strides=stride, padding=pad, groups=groups))
            for name, combine in (("bias", relax.op.add), ("scale", relax.op.multiply),
                                  ("shift", relax.op.add)):
                y = bb.emit(combine(y, relax.const(a[name].reshape(per_channel))))
            y = bb.emit(_ACTS[act][0](y))
            if residual:
                y = bb.emit(relax.op.add(y, r))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get(), inputs


def _reference(case, a, act="relu"):
    _, _, stride, pad, groups, residual = case
    conv = torch.nn.functional.conv1d if len(case[0]) == 3 else torch.nn.functional.conv2d
    t = {k: torch.from_numpy(v) for k, v in a.items() if v is not None}
    per_channel = (-1,) + (1,) * (len(case[0]) - 2)
    y = conv(t["x"], t["w"], t["bias"], stride=stride, padding=pad, groups=groups)
    y = _ACTS[act][1](y * t["scale"].view(per_channel) + t["shift"].view(per_channel))
    return (y + t["res"] if residual else y).numpy()


def _conv_funcs(mod, target):
    """The fused conv PrimFuncs of ``mod`` with their constant weights marked, the program's
    epilogue (bias, scale, shift, activation) as written: unfolded. (Folded, the epilogue is
    one bias add; on AVX2 the borderline conv1d k3/s2 tile then reloads more inputs from the
    stack than this file allows: docs/log/2026-12-03b.md.)"""
    fused = mark_constant_weights(fuse(mod, target, fusion_pass("tvm", target), fold=False))
    return [f for gv, f in fused.functions.items()
            if isinstance(f, tirx.PrimFunc) and "conv" in gv.name_hint]


def _assert_conv_kernel(func, target, rank):
    """The contraction rule gave ``func`` the conv kernel: a weight parameter packed as
    ``(F / cols, IC, K.., cols)`` panels and the update vectorized over channels."""
    sch = Contraction().apply(func, target, False)
    assert sch is not None, "the contraction rule did not apply"
    out = sch.mod["main"]
    packed = [p for p in out.params if len(p.shape) == rank + 1]
    assert len(packed) == 1, [tuple(p.shape) for p in out.params]
    cols = int(packed[0].shape[-1])
    loops: list = []
    tvm_ffi.structural_walk(out.body, (tirx.For, loops.append), order="pre")
    update = [lp for lp in loops if lp.kind == tirx.ForKind.VECTORIZED
              and "_update" in lp.body.script()]
    assert update and int(update[0].extent) == cols
    return out


@pytest.mark.parametrize("target", [HOST, GENERIC], ids=["host", "x86-64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_matches_pytorch_with_fused_epilogue(name, target):
    case = CASES[name]
    a = _arrays(case)
    mod, inputs = _module(case, a)
    funcs = _conv_funcs(mod, target)
    assert len(funcs) == 1  # conv, BN, ReLU and the residual add: one kernel
    with target:
        _assert_conv_kernel(funcs[0], target, len(case[1]))
    ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target))
    got = run(ex, inputs)[0]
    ref = _reference(case, a)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@ISAS
@pytest.mark.parametrize("channels,per_group,height,width", [
    (64, 64, 56, 56), (192, 192, 17, 17), (512, 512, 1, 1599), (768, 48, 1, 49), (48, 48, 14, 14)])
def test_tile_fits_the_register_file(target, channels, per_group, height, width):
    lanes, registers = isa.vector_lanes(target, "float32"), isa.vector_registers(target)
    tile = choose_conv_tile(channels, per_group, height, width, lanes, registers)
    assert tile is not None and per_group % tile.cols == 0 and tile.lanes <= lanes
    assert tile.height * tile.width * tile.vectors <= accumulator_budget(registers)
    assert tile.height * tile.width * tile.vectors >= min(8, height * width)  # latency hidden


def test_narrow_groups_keep_the_general_tiling():
    lanes, registers = isa.vector_lanes(AVX512, "float32"), isa.vector_registers(AVX512)
    assert choose_conv_tile(128, 4, 56, 56, lanes, registers) is None  # ResNeXt's 4 per group


def _inner_loop(asm: str) -> str:
    """The basic block with the most FMAs (the kernel's reduction step)."""
    blocks = [re.split(r"\n\tj\w+\s", b)[0] for b in re.split(r"\n\.LBB\w+:", asm)]
    return max(blocks, key=lambda b: b.count("vfmadd"))


@ISAS
@pytest.mark.parametrize("name", ["3x3_s1_p1", "conv1d_k3_s2", "grouped_3x3", "prime_width_17"])
def test_inner_loop_is_fmas_on_registers(target, name):
    """Compile only (explicit ISA): the reduction step is full-width FMAs, no stack traffic."""
    case = CASES[name]
    func = _conv_funcs(_module(case, _arrays(case))[0], target)[0]
    with target:
        func = _assert_conv_kernel(func, target, len(case[1]))
    ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    body = _inner_loop(ex.mod.inspect_source("asm"))
    reg = "zmm" if isa.vector_bits(target) == 512 else "ymm"
    fmas = [ln for ln in body.splitlines() if "vfmadd" in ln]
    assert len(fmas) >= 8 and all(reg in ln for ln in fmas)
    stack = [ln for ln in body.splitlines() if "rsp" in ln]
    _, w_shape, stride, _, groups, _ = case
    out = _out_shape(case)
    lanes, registers = isa.vector_lanes(target, "float32"), isa.vector_registers(target)
    tile = choose_conv_tile(w_shape[0], w_shape[0] // groups, out[-2] if len(out) == 4 else 1,
                            out[-1], lanes, registers, (w_shape[-1], stride, 1))
    fits = tile.height * tile.width * tile.vectors + _operand_registers(
        tile.height, tile.width, tile.vectors, (w_shape[-1], stride, 1)) <= registers
    if fits:
        assert not stack  # no spill or reload
    else:  # a latency-hiding tile chosen over a spill-free one: a few input reloads
        assert len(stack) <= len(fmas) // 4


def test_weight_passed_as_input_is_packed_per_call():
    """A weight that is a function input is copied into channel panels inside the kernel."""
    x_shape, w_shape = (1, 16, 10, 10), (32, 16, 3, 3)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(x_shape).astype("float32")
    w = rng.standard_normal(w_shape).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x_shape, "float32"))
    wv = relax.Var("w", relax.TensorType(w_shape, "float32"))
    with bb.function("main", [xv, wv]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(xv, wv, padding=1)))
        bb.emit_func_output(gv)
    mod = bb.get()
    func = _conv_funcs(mod, HOST)[0]
    with HOST:
        out = Contraction().apply(func, HOST, False).mod["main"]
    panels = []

    def visit(block):
        panels.extend(tuple(int(d) for d in b.shape) for b in block.alloc_buffers
                      if len(b.shape) == 5)

    tvm_ffi.structural_walk(out.body, (s_tir.SBlock, visit))
    assert len(panels) == 1 and panels[0][1:4] == (16, 3, 3)
    ex = tvm.compile(mod, HOST, relax_pipeline=strategy_pipeline("tvm", HOST))
    got = run(ex, {"x": x, "w": w})[0]
    ref = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                                padding=1)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


# Depthwise (schedules/depthwise.py). name: (input, weight, stride, padding, groups, residual,
# activation); widths from the corpus (112, 56, 14, 7) and odd ones (15 -> 8, 10 unpadded).
DW_CASES = {
    "dw3x3_s1_112": ((1, 16, 112, 112), (16, 1, 3, 3), 1, (1, 1), 16, False, "relu6"),
    "dw3x3_s2_112": ((1, 32, 112, 112), (32, 1, 3, 3), 2, (1, 1), 32, False, "relu6"),
    "dw3x3_s1_14_residual": ((1, 40, 14, 14), (40, 1, 3, 3), 1, (1, 1), 40, True, "hardswish"),
    "dw3x3_s2_14_to_7": ((1, 24, 14, 14), (24, 1, 3, 3), 2, (1, 1), 24, False, "relu"),
    "dw5x5_s1_7_residual": ((1, 48, 7, 7), (48, 1, 5, 5), 1, (2, 2), 48, True, "silu"),
    "dw5x5_s2_odd_15": ((1, 24, 15, 15), (24, 1, 5, 5), 2, (2, 2), 24, False, "silu"),
    "dw3x3_unpadded_10": ((1, 8, 10, 10), (8, 1, 3, 3), 1, (0, 0), 8, False, "relu"),
}


def _dw_func(name, target):
    case = DW_CASES[name]
    funcs = _conv_funcs(_module(case[:6], _arrays(case[:6]), case[6])[0], target)
    assert len(funcs) == 1  # conv, BN, activation and the residual add: one kernel
    return funcs[0]


def _normalized_conv_block(func):
    """The convolution block of ``func`` as the contraction rule analyzes it (unit loops
    dropped by ``normalize_prim_func``)."""
    sch = s_tir.Schedule(func)
    assert normalize_prim_func(sch) is not None
    return next(sch.get(b) for b in root_blocks(sch) if not is_spatial(sch.get(b)))


def _assert_depthwise_kernel(func, target, stride):
    """The contraction rule gave ``func`` the depthwise kernel: the update in a loop over
    channels (parallel when big enough) with the image row vectorized in tiles of
    ``choose_depthwise_tile``; stride 2 reads a deinterleaved ``(.., 2, W / 2)`` plane."""
    conv = _normalized_conv_block(func)
    assert depthwise.analyze(conv, *contraction_operands(conv)) is not None
    sch = Contraction().apply(func, target, False)
    assert sch is not None, "the contraction rule did not apply"
    out = sch.mod["main"]
    body = out.body.block.body
    nests = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    kernel = next(n for n in nests if "_update" in n.script())
    fmas = math.prod(int(iv.dom.extent) for iv in conv.iter_vars)
    read = sum(math.prod(int(d) for d in b.shape) * b.dtype.bits // 8
               for b in {r.source for r in conv.reads})
    assert (kernel.kind == tirx.ForKind.PARALLEL) == contraction_parallel(fmas, read)
    loops: list = []
    tvm_ffi.structural_walk(kernel, (tirx.For, loops.append), order="pre")
    update = [lp for lp in loops if lp.kind == tirx.ForKind.VECTORIZED
              and "_update" in lp.body.script()]
    out_shape = [int(d) for d in conv.writes[0].source.shape]
    tile = choose_depthwise_tile(out_shape[-2], out_shape[-1],
                                 isa.vector_lanes(target, "float32"),
                                 isa.vector_registers(target))
    assert len(update) == 1 and int(update[0].extent) == tile.width
    planes = [len(b.shape) for b in out.body.block.alloc_buffers if len(b.shape) == 5]
    assert bool(planes) == (stride == 2)
    return out


@pytest.mark.parametrize("target", [HOST, GENERIC], ids=["host", "x86-64"])
@pytest.mark.parametrize("name", sorted(DW_CASES))
def test_depthwise_matches_pytorch_with_fused_epilogue(name, target):
    case = DW_CASES[name]
    a = _arrays(case[:6])
    mod, inputs = _module(case[:6], a, case[6])
    with target:
        _assert_depthwise_kernel(_dw_func(name, target), target, case[2])
    ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target))
    got = run(ex, inputs)[0]
    ref = _reference(case[:6], a, case[6])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@ISAS
@pytest.mark.parametrize("name", ["dw3x3_s1_112", "dw3x3_s2_112"])
def test_depthwise_inner_loop_is_full_vector_fmas(target, name):
    """Compile only (explicit ISA): the reduction step is full-width FMAs on contiguous
    input vectors: no gathers or lane inserts (a stride-2 row read in NCHW would be)."""
    with target:
        func = _assert_depthwise_kernel(_dw_func(name, target), target, DW_CASES[name][2])
    ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    body = _inner_loop(ex.mod.inspect_source("asm"))
    lanes = isa.vector_lanes(target, "float32")
    out = _out_shape(DW_CASES[name][:6])
    tile = choose_depthwise_tile(out[-2], out[-1], lanes, isa.vector_registers(target))
    bits = isa.vector_bits(target) // (1 if tile.width >= lanes else 2)  # or half vectors
    reg = {512: "zmm", 256: "ymm", 128: "xmm"}[bits]
    fmas = [ln for ln in body.splitlines() if "vfmadd" in ln]
    assert len(fmas) >= 8 and all(reg in ln for ln in fmas)
    assert not [ln for ln in body.splitlines() if re.search(r"vgather|vinsertps|vpinsr", ln)]


@pytest.mark.parametrize("w_shape,groups", [((32, 1, 3, 3), 16), ((16, 16, 3, 3), 1),
                                            ((16, 4, 3, 3), 4)],
                         ids=["multiplier_2", "dense", "grouped"])
def test_depthwise_declines_other_convolutions(w_shape, groups):
    """A channel multiplier, a dense and a grouped conv are no depthwise block: None."""
    case = ((1, 16, 14, 14), w_shape, 1, (1, 1), groups, False)
    conv = _normalized_conv_block(_conv_funcs(_module(case, _arrays(case))[0], AVX512)[0])
    assert contraction_operands(conv) is not None
    assert depthwise.analyze(conv, *contraction_operands(conv)) is None


@ISAS
@pytest.mark.parametrize("height,width", [(112, 112), (56, 56), (28, 28), (14, 14), (7, 7)])
def test_depthwise_tile_fits_the_register_file(target, height, width):
    lanes, registers = isa.vector_lanes(target, "float32"), isa.vector_registers(target)
    tile = choose_depthwise_tile(height, width, lanes, registers)
    assert height % tile.height == 0 and (tile.width == width or width % tile.width == 0)
    cap = registers // 4  # the accumulators past which the unrolled window ran slower
    rows = [d for d in range(1, height + 1)
            if height % d == 0 and d * tile.vectors <= accumulator_budget(registers) - 2]
    within = [d for d in rows if d * tile.vectors <= cap]
    if within and max(within) * tile.vectors > 1:
        assert tile.height == max(within)  # the most rows within the cap
    else:  # never one dependent FMA chain where a taller tile fits the register file
        assert tile.height == min((d for d in rows if d > 1), default=1)
