"""Transposes that move the innermost axis run as register tiles (schedules/transpose.py):
exact outputs for every permutation of 2-4 axes, whole tiles (of 8 or of 4) or not; the
Fallback's scheduled function holds the tile where both axes are whole tiles of a pure float32 copy,
and none otherwise (a kept innermost axis, a symbolic batch, a second reader of the input,
an elementwise op fused in, 64-bit elements)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm_costfuse.schedules import transpose
from tvm_costfuse.schedules.cpu import Fallback

from tvm_costfuse.measurement.timing import run
from tvm_costfuse.partition import ApplyPartition
from tvm_costfuse.pipelines import fuse
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target

SHAPES = [(8, 8), (1, 8, 8), (16, 24), (9, 16), (2, 16, 40), (1, 8, 13), (1, 16, 8, 24),
          (2, 8, 7, 16), (3, 5, 8, 8), (12, 20), (1, 4, 28, 12), (6, 4, 8)]
TARGET = host_target(1)


def _module(shape, build):
    x = relax.Var("x", relax.TensorType(shape, "float32" if not isinstance(build, str)
                                        else build))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(x) if callable(build)
                                 else relax.op.permute_dims(x, (1, 0)))
        bb.emit_func_output(out)
    return bb.get()


def _tiled(mod) -> bool:
    """Whether the Fallback's schedule of the one kernel holds the transpose's tile."""
    kernels = [f for f in fuse(mod, TARGET, relax.transform.FuseOps()).functions.values()
               if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == 1
    sch = Fallback().apply(kernels[0], TARGET, False)
    assert sch is not None
    return "_local" in sch.mod.script()


@pytest.mark.parametrize("shape, perm", [(s, p) for s in SHAPES
                                         for p in itertools.permutations(range(len(s)))])
def test_transposes_compute_exactly_and_tile_where_they_can(shape, perm):
    mod = _module(shape, lambda x: relax.op.permute_dims(x, perm))
    ex = tvm.compile(mod, TARGET, relax_pipeline=strategy_pipeline("tvm", TARGET),
                     tir_pipeline=tir_pipeline())
    data = np.random.default_rng(0).standard_normal(shape).astype("float32")
    np.testing.assert_array_equal(run(ex, {"x": data})[0], data.transpose(perm))
    moved = perm[-1] != len(shape) - 1
    whole = any(shape[-1] % e == 0 and shape[perm[-1]] % e == 0 for e in transpose.EDGES)
    assert _tiled(mod) == (moved and whole)
    func = next(f for f in fuse(mod, TARGET, relax.transform.FuseOps()).functions.values()
                if isinstance(f, tvm.tirx.PrimFunc))
    assert transpose.gathers(func) == moved and transpose.tiles(func) == (moved and whole)


def test_what_is_no_pure_transpose_keeps_the_generic_schedule():
    n = tvm.tirx.Var("n", "int64")
    symbolic = _module((n, 16, 24), lambda x: relax.op.permute_dims(x, (0, 2, 1)))
    fused = _module((16, 24), lambda x: relax.op.exp(relax.op.permute_dims(x, (1, 0))))
    wide = _module((16, 24), "float64")
    assert not _tiled(symbolic) and not _tiled(fused) and not _tiled(wide)


def test_a_second_reader_of_the_input_keeps_its_own_read():
    x = relax.Var("x", relax.TensorType((16, 24), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = relax.op.permute_dims(x, (1, 0))
            out = bb.emit_output(relax.Tuple([bb.emit(t), bb.emit(relax.op.exp(x))]))
        bb.emit_func_output(out)
    mod = bb.get()
    with TARGET:
        grouped = ApplyPartition([["lv", "lv1"]])(tvm.transform.Sequential(
            [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()])(mod))
    kernels = [f for f in relax.transform.FuseTIR()(grouped).functions.values()
               if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == 1  # the transpose and the exp in one kernel
    assert "_local" in Fallback().apply(kernels[0], TARGET, False).mod.script()
    ex = tvm.compile(grouped, TARGET, relax_pipeline=strategy_pipeline("tvm", TARGET),
                     tir_pipeline=tir_pipeline())
    data = np.random.default_rng(1).standard_normal((16, 24)).astype("float32")
    got = run(ex, {"x": data})
    np.testing.assert_array_equal(got[0], data.T)
    np.testing.assert_allclose(got[1], np.exp(data), rtol=1e-5)
