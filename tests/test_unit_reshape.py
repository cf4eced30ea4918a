"""A reshape that only adds or drops unit dims (the PyTorch importer's ``(128, 3072) -> (1, 128,
3072)`` around every Linear of a 3-D input) is no data movement: the contraction's epilogue
behind it stays the contraction class, the CPU planner walks the view to fuse it, and the
fused kernel computes what the unfused program does. A reshape that splits an axis (a head
split) still counts as data movement."""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax

from tvm_costfuse import FusionConfig, build_graph, plan_greedy, strategy_pipeline
from tvm_costfuse.cost import group_features
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.schedules.classes import ScheduleClass as SC
from tvm_costfuse.targets import host, host_target

# A CPU described without this machine (named ISA, fixed caches, default figures).
CPU = dataclasses.replace(host(2, calibration=False, mcpu="skylake-avx512"), l1_bytes=32 << 10,
                          l2_bytes=1 << 20, l3_bytes=32 << 20)
TARGET = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}


def _linear_gelu(out_shape):
    rng = np.random.default_rng(0)
    w = relax.const(rng.standard_normal((64, 96)).astype("float32") / 8)
    b = relax.const(rng.standard_normal((96,)).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.matmul(x, w), b))
            r = bb.emit(relax.op.reshape(y, out_shape))
            gv = bb.emit_output(relax.op.nn.gelu(r))
        bb.emit_func_output(gv)
    return bb.get()


def _members(graph):
    return [n.name for n in graph.nodes if n.kind == "call_tir"]


def test_a_unit_reshape_keeps_the_epilogue_a_contraction_a_head_split_does_not():
    unit = build_graph(prepare(_linear_gelu((1, 32, 96)), TARGET))
    split = build_graph(prepare(_linear_gelu((32, 4, 24)), TARGET))
    f_unit, f_split = group_features(unit, _members(unit)), group_features(split, _members(split))
    assert f_unit.reshaping_ops == 0 and f_unit.schedule_on("cpu") == SC.CONTRACTION
    assert f_split.reshaping_ops == 1 and f_split.schedule_on("cpu") == SC.FALLBACK


def test_cpu_plan_fuses_the_gelu_through_the_view_and_matches():
    mod = _linear_gelu((1, 32, 96))
    graph = build_graph(prepare(mod, TARGET))
    plan = plan_greedy(graph, CPU, FusionConfig())
    gelu_group = next(g for g in plan.groups if any("gelu" in (graph[n].prim_func or "")
                                                    or graph[n].math for n in g))
    assert any(graph[n].reshape_like for n in gelu_group)
    assert any(graph[n].reduction_extent > 1 for n in gelu_group)  # the matmul
    x = np.random.default_rng(1).standard_normal((32, 64)).astype("float32")
    outs = {}
    for strategy in ("none", "costfuse"):
        target = host_target(2)  # runs here: this host's ISA (an AVX-512 build is SIGILL on AVX2)
        ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(strategy, target))
        outs[strategy] = run(ex, {"x": x})[0]
    np.testing.assert_allclose(outs["costfuse"], outs["none"], rtol=1e-5, atol=1e-6)
