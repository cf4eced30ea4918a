"""Weight pre-packing (schedules/prepack.py): constant contraction weights are stored tile-major
at compile time, weights passed as inputs are not, and outputs match TVM's stock build."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm_costfuse.schedules import schedule_pass
from tvm_costfuse.schedules.prepack import pack_constants, packed

from tvm_costfuse.measurement.timing import max_mismatch, run
from tvm_costfuse.pipelines import fuse
from tvm_costfuse.strategies import fusion_pass, strategy_pipeline
from tvm_costfuse.targets import host_target

TARGET = host_target(2)
K, N = 64, 256  # N = 4 vector tiles of 64 lanes (or 8 of 32): the weight gets packed


def _linear(bind: bool) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """x @ w + b -> relu, with w and b bound as constants (``bind``) or passed as inputs."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, K)).astype("float32")
    w = rng.standard_normal((K, N)).astype("float32")
    b = rng.standard_normal((N,)).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((1, 16, K), "float32"))
    params = [xv]
    if bind:
        wv, bv = relax.const(w), relax.const(b)
    else:
        wv = relax.Var("w", relax.TensorType((K, N), "float32"))
        bv = relax.Var("b", relax.TensorType((N,), "float32"))
        params += [wv, bv]
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.matmul(xv, wv), bv))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    inputs = {"x": x} if bind else {"x": x, "w": w, "b": b}
    return bb.get(), inputs


def _weight_shapes(mod: tvm.IRModule) -> list[tuple[int, ...]]:
    """Shapes of the 2+-D parameters of the module's PrimFuncs other than x and the output."""
    shapes = []
    for func in mod.functions.values():
        if isinstance(func, tvm.tirx.PrimFunc):
            shapes += [tuple(int(d) for d in p.shape) for p in func.params[1:-1]
                       if len(p.shape) >= 2]
    return shapes


def _scheduled(mod: tvm.IRModule) -> tvm.IRModule:
    with TARGET:
        return schedule_pass(TARGET)(fuse(mod, TARGET, fusion_pass("tvm", TARGET)))


def test_packed_is_tile_major():
    value = np.arange(3 * 8, dtype="float32").reshape(3, 8)
    p = packed(value, 4)
    assert p.shape == (2, 3, 4)
    for jo in range(2):
        for k in range(3):
            assert list(p[jo, k]) == list(value[k, 4 * jo:4 * jo + 4])


def test_packed_leading_is_channel_panels():
    """A convolution weight (F, C, K) as (F / tile, C, K, tile): output channels innermost."""
    value = np.arange(8 * 3 * 2, dtype="float32").reshape(8, 3, 2)
    p = packed(value, 4, leading=True)
    assert p.shape == (2, 3, 2, 4)
    for fo in range(2):
        for c in range(3):
            for k in range(2):
                assert list(p[fo, c, k]) == list(value[4 * fo:4 * fo + 4, c, k])


def test_square_weight_is_packed_along_its_columns():
    """A (N, N) weight's two packings have one shape: the Linear's (trailing) one is meant."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 256)).astype("float32")
    w = rng.standard_normal((256, 256)).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((1, 16, 256), "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(xv, relax.const(w)))
        bb.emit_func_output(out)
    mod = bb.get()
    assert any(len(s) == 3 for s in _weight_shapes(_scheduled(mod)))  # it was packed
    got = run(tvm.compile(mod, TARGET, relax_pipeline=strategy_pipeline("tvm", TARGET)),
              {"x": x})[0]
    np.testing.assert_allclose(got, x @ w, rtol=1e-4, atol=1e-4 * float(np.abs(x @ w).max()))


@pytest.mark.parametrize("bind", [True, False], ids=["constant", "input"])
def test_constant_weight_is_packed_input_is_not(bind):
    mod, _ = _linear(bind)
    shapes = _weight_shapes(_scheduled(mod))
    if bind:
        assert (K, N) not in shapes
        assert any(len(s) == 3 and s[1] == K and s[0] * s[2] == N for s in shapes), shapes
    else:
        assert (K, N) in shapes


@pytest.mark.parametrize("bind", [True, False], ids=["constant", "input"])
@pytest.mark.parametrize("strategy", ["tvm", "costfuse", "none"])
def test_numerics_match_stock(bind, strategy):
    mod, inputs = _linear(bind)
    ref = run(tvm.compile(mod, TARGET, relax_pipeline=strategy_pipeline("stock", TARGET)),
              inputs)
    got = run(tvm.compile(mod, TARGET, relax_pipeline=strategy_pipeline(strategy, TARGET)),
              inputs)
    assert max_mismatch(ref, got, 1e-4, 1e-5) <= 1.0


def test_mismatched_constant_is_an_error():
    """A parameter whose shape is not the tile-major packing of its constant argument."""
    mod, _ = _linear(True)
    scheduled = _scheduled(mod)  # packed already: the signature no longer matches (K, N)
    func = next(f for f in scheduled.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
                and any(len(p.shape) == 3 for p in f.params))
    gv = next(g for g, f in scheduled.functions.items() if f.same_as(func))
    bad = relax.const(np.zeros((K + 1, N), "float32"))
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((1, 16, K), "float32"))
    with bb.function("main", [xv]):
        out = bb.emit(relax.call_tir(
            bb.add_func(func.with_attr("layout_free_buffers", [1]), gv.name_hint),
            [xv, bad, relax.const(np.zeros((N,), "float32"))],
            relax.TensorType((1, 16, N), "float32")))
        bb.emit_func_output(out)
    with pytest.raises(ValueError, match="not the tile-major packing"):
        pack_constants(bb.get())


def test_marking_is_a_copy_and_replaces_stale_marks():
    # Weights passed as inputs: a stale marking (as TVM's AttachAttrLayoutFreeBuffers would
    # leave) must be dropped, and the module given to the pass must not change.
    from tvm_costfuse.schedules.prepack import LAYOUT_FREE, mark_constant_weights

    mod, _ = _linear(False)
    fused = fuse(mod, TARGET, fusion_pass("tvm", TARGET))
    gv = next(g for g, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc))
    fused[gv] = fused[gv].with_attr(LAYOUT_FREE, [1])
    marked = mark_constant_weights(fused)
    assert LAYOUT_FREE in fused[gv].attrs
    func = marked[marked.get_global_var(gv.name_hint)]
    assert func.attrs is None or LAYOUT_FREE not in func.attrs
    constant = mark_constant_weights(fuse(_linear(True)[0], TARGET, fusion_pass("tvm", TARGET)))
    assert any(f.attrs is not None and LAYOUT_FREE in f.attrs
               for f in constant.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


def test_packing_keeps_no_copy_of_the_constants_it_packed():
    """A mutator class defined per call of ``pack_constants`` stayed alive with the packed
    constants in its closure: 150 MB per build of a decode step, until one `costfuse regret`
    run filled 24 GB. Packing a 16 MB weight six times must not keep six copies."""
    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 1024), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((1024, 4096)).astype("float32"))
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    mod = bb.get()
    assert _weight_shapes(_scheduled(mod)) != [(1024, 4096)]  # packed
    before = rss_mb()
    for _ in range(6):
        _scheduled(mod)
    assert rss_mb() - before < 40, f"{rss_mb() - before:.0f} MB kept by six packings"
