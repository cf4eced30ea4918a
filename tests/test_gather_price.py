"""Transposes that gather: which ones the graph marks, which groups the features count them
in, what the analytical model charges for them (and for a lone tiled one), and the
calibration kernels that time them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_costfuse.cost.analytical import estimate
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.graph import build_graph
from tvm_costfuse.measurement import gather
from tvm_costfuse.measurement.kernel_time import one_kernel
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.targets import host, preset

HOST = host(num_cores=2, calibration=False)


def _graph(shape, perm, then_multiply: bool, reshape=None):
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.reshape(x, reshape) if reshape else x
            y = bb.emit(relax.op.permute_dims(y, perm))
            if then_multiply:
                y = bb.emit(relax.op.multiply(y, relax.const(2.0, "float32")))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return build_graph(prepare(bb.get(), {"kind": "llvm"}))


def _calls(graph):
    return [n.name for n in graph.nodes if n.kind == "call_tir"]


def test_the_graph_marks_transposes_that_move_the_innermost_axis():
    nchw = _graph((1, 16, 16, 32), [0, 3, 1, 2], False)
    (node,) = [n for n in nchw.nodes if n.prim_func and "transpose" in n.prim_func]
    assert node.moves_innermost
    middle = _graph((1, 16, 16, 32), [0, 2, 1, 3], False)  # rows swapped: contiguous loads
    assert not any(n.moves_innermost for n in middle.nodes)
    shuffle = _graph((1, 8, 8, 32), [0, 1, 2, 4, 3], False, reshape=(1, 8, 8, 2, 16))
    moved = [n for n in shuffle.nodes if n.moves_innermost]
    assert len(moved) == 1  # a channel shuffle's axis of 2 moved innermost


def test_gathered_elements_are_counted_where_the_transpose_gathers():
    """Alone (tiled, or the fallback's copy): none; fused with a multiply: all of them; two
    transposes through a reshape that undo each other: none."""
    alone = _graph((1, 16, 16, 32), [0, 3, 1, 2], False)
    assert group_features(alone, _calls(alone)).gathered_elems == 0
    assert group_features(alone, _calls(alone)).transposed_elems == 16 * 16 * 32  # tiled
    ragged = _graph((1, 6, 6, 32), [0, 3, 1, 2], False)  # 6 wide: the fallback's rows
    assert group_features(ragged, _calls(ragged)).transposed_elems == 0
    shuffle = _graph((1, 8, 8, 32), [0, 1, 2, 4, 3], False, reshape=(1, 8, 8, 2, 16))
    moved = [n.name for n in shuffle.nodes if n.moves_innermost]
    assert group_features(shuffle, moved).gathered_elems == 0
    fused = _graph((1, 16, 16, 32), [0, 3, 1, 2], True)
    assert group_features(fused, _calls(fused)).gathered_elems == 16 * 16 * 32
    assert group_features(fused, _calls(fused)).transposed_elems == 0  # not alone
    middle = _graph((1, 16, 16, 32), [0, 2, 1, 3], False)  # contiguous rows: a plain copy
    assert group_features(middle, _calls(middle)).transposed_elems == 0
    x = relax.Var("x", relax.TensorType((1, 49, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.permute_dims(x, [0, 2, 1]))  # tokens -> image
            y = bb.emit(relax.op.reshape(y, (1, 64, 7, 7)))
            y = bb.emit(relax.op.reshape(y, (1, 64, 49)))
            y = bb.emit(relax.op.permute_dims(y, [0, 2, 1]))  # and back
            out = bb.emit_output(relax.op.nn.gelu(y))
        bb.emit_func_output(out)
    there_and_back = build_graph(prepare(bb.get(), {"kind": "llvm"}))
    assert sum(n.moves_innermost for n in there_and_back.nodes) == 2
    assert group_features(there_and_back, _calls(there_and_back)).gathered_elems == 0


def test_the_analytical_model_charges_the_hosts_gather_cost_on_cpus_only():
    fused = _graph((1, 56, 56, 128), [0, 3, 1, 2], True)
    f = group_features(fused, _calls(fused))
    elems = 56 * 56 * 128
    cheap, dear = (dataclasses.replace(HOST, gather_s=s) for s in (1e-10, 2e-9))
    extra = estimate(f, dear).breakdown["compute"] - estimate(f, cheap).breakdown["compute"]
    assert extra == pytest.approx(elems * (2e-9 - 1e-10) / HOST.cores, rel=1e-6)
    # the default (no measurement): GATHER_BYTES of DRAM stream per element
    assert HOST.gather_seconds() > 0 and preset("h100").gather_seconds() == 0.0
    # no gather term on CUDA, whatever a description says of gathers
    gpu, told = preset("h100"), dataclasses.replace(preset("h100"), gather_s=1e-6)
    assert estimate(f, told).seconds == estimate(f, gpu).seconds


def test_the_analytical_model_charges_a_lone_transpose_the_hosts_tile_cost():
    """A lone transpose costs its tiles' time beside its stream, on CPUs only; a transpose
    keeping the innermost axis (a copy of whole rows) is not charged."""
    alone = _graph((1, 28, 28, 128), [0, 3, 1, 2], False)
    f = group_features(alone, _calls(alone))
    cheap, dear = (dataclasses.replace(HOST, transpose_s=s) for s in (1e-11, 1e-9))
    extra = estimate(f, dear).breakdown["compute"] - estimate(f, cheap).breakdown["compute"]
    assert extra == pytest.approx(28 * 28 * 128 * (1e-9 - 1e-11) / HOST.cores, rel=1e-6)
    assert estimate(f, dear).seconds > estimate(f, cheap).seconds
    # the default (no measurement): TRANSPOSE_BYTES of DRAM stream per element
    assert 0 < HOST.transpose_seconds() < HOST.gather_seconds()
    gpu, told = preset("h100"), dataclasses.replace(preset("h100"), transpose_s=1e-6)
    assert preset("h100").transpose_seconds() == 0.0
    assert estimate(f, told).seconds == estimate(f, gpu).seconds
    middle = _graph((1, 28, 28, 128), [0, 2, 1, 3], False)
    g = group_features(middle, _calls(middle))
    assert estimate(g, dear).seconds == estimate(g, cheap).seconds


@pytest.mark.parametrize("fused", [True, False])
def test_the_calibration_kernels_are_the_transposes_they_name(fused):
    """The fused kernel (transpose then multiply, the gather) and the lone one (the tile
    rule's) compute what they say."""
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    kernel = one_kernel(gather.program((1, 8, 16, 16), fused=fused), target)
    x = np.random.default_rng(0).standard_normal(kernel.shapes[0]).astype("float32")
    out = tvm.runtime.tensor(np.zeros(kernel.shapes[-1], "float32"))
    kernel.module[kernel.name](tvm.runtime.tensor(x), out)
    np.testing.assert_allclose(out.numpy(), (2 if fused else 1) * x.transpose(0, 3, 1, 2))
