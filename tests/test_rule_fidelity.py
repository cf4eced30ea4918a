"""The card the cost model prices a fused kernel with is the card of the rule that schedules
it: for every group CostFuse fuses on the zoo and on the corpus' decode steps (one token
against a KV cache: one query row, one normalized row), the rule ``ApplyDefaultSchedule``
applies to the group's kernel (``schedules.first_rule``) is the rule of the card that claimed
the group (``GroupFeatures.card_on``), and its class one of that rule's. A mismatch means the
plan priced another kernel than the one that runs; the wrong result of a unit-extent reduction
in a two-reduction kernel sat in that gap.

Full shapes for the zoo, the small variants of the decode steps, on a fixed AVX2 target
(nothing here runs a kernel, so no host ISA is assumed). The plan's groups of one op count
too: a lone max pool (its kernel ends in the reduction) is the fallback's, as is a 1x1 conv
on a 1x1 image alone. Corpus CNNs at full shapes: two by default (squeeze-excite convs, pooling
windows), every prefill model and decode step with ``COSTFUSE_CORPUS=full``. Reductions over
unit extents (a mean over a 1 x 1 map, a matmul with K = 1, a softmax over one element) are
reductions to the rules (they keep their init) and so to the features.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir
from tvm_costfuse.schedules import first_rule

from tvm_costfuse import FusionConfig, build_graph, models
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.targets import resolve
from tvm_costfuse.transform import plan_module
from tvm_costfuse.tuning.feedback import group_kernel

TARGET = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}


DECODE_STEPS = [n for n in models.corpus_names() if n.endswith("_decode128")]
# Full shapes: squeeze-excite convs on a 1x1 image, and pooling windows alone and fused.
CORPUS = (models.corpus_names() if os.environ.get("COSTFUSE_CORPUS") == "full"
          else ["efficientnet_b0", "googlenet"])


def _has_blocks(func: tvm.tirx.PrimFunc) -> bool:
    """Whether ``func`` has a block below its root: the rules schedule blocks only."""
    blocks: list = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append))
    return len(blocks) > 1


def _check(name: str, small: bool) -> None:
    _check_module(name, models.load(name, small=small)[0])


def _check_module(name: str, program: tvm.IRModule):
    """Plan ``program`` and check every kernel's rule against its card; returns the plan."""
    target = tvm.target.Target(TARGET)
    desc = resolve(target).desc
    mod = prepare(program, target)
    graph = build_graph(mod)
    plan = plan_module(mod, desc, FusionConfig(), compile_target=target)
    # the cards and the rules agree on their own: the plan's rule check declined nothing
    assert not plan.mismatched, plan.mismatched
    checked, wrong = 0, []
    grouped = {m for members in plan.groups for m in members}
    alone = [[n.name] for n in graph.nodes if n.name not in grouped]
    for members in [*plan.groups, *alone]:
        features = group_features(graph, members)
        if features.is_view or not any(graph[m].kind == "call_tir" for m in members):
            continue  # no kernel of its own
        kernel = group_kernel(mod, graph, members)
        with target:
            rule, _ = first_rule(kernel, target)
        card = features.card_on("cpu")
        checked += 1
        if rule is None and card.rule == "Fallback" and not _has_blocks(kernel):
            continue  # plain loops (cumsum's scan): built as written, priced by the fallback
        if rule is None or card.rule != type(rule).__name__ or card not in rule.cards:
            wrong.append(f"{'+'.join(members)}: priced {card.cls} ({card.rule}), scheduled "
                         f"by {type(rule).__name__ if rule else 'no rule'}")
    assert checked, f"{name}: no kernel checked"
    assert not wrong, f"{name}: " + "; ".join(wrong)
    return plan


@pytest.mark.parametrize("name", models.zoo.names() + DECODE_STEPS)
def test_planned_kernels_get_the_rule_they_were_priced_as(name: str) -> None:
    _check(name, small=name in DECODE_STEPS)


@pytest.mark.parametrize("name", CORPUS)
def test_corpus_kernels_at_full_shapes_get_their_rule(name: str) -> None:
    _check(name, small=False)


def _squeeze_excite_conv(prologue: bool, bias: bool):
    """A 1x1 conv on a 1x1 image (squeeze-excite's), with a SiLU before it and a bias after
    it or not."""
    from tvm import relax
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 24, 1, 1), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.multiply(x, relax.op.sigmoid(x))) if prologue else x
            w = relax.const(rng.standard_normal((8, 24, 1, 1)).astype("float32"))
            y = bb.emit(relax.op.nn.conv2d(h, w))
            if bias:
                b = relax.const(rng.standard_normal((1, 8, 1, 1)).astype("float32"))
                y = bb.emit(relax.op.add(y, b))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("prologue", [False, True], ids=["plain", "silu_before"])
@pytest.mark.parametrize("bias", [False, True], ids=["alone", "bias_after"])
def test_untiled_conv_groups_get_the_rule_they_are_priced_as(prologue: bool, bias: bool) -> None:
    """Every form of a squeeze-excite conv, the whole program as one group: with an epilogue
    the row-reduction rule takes it; ending in the conv, the fallback."""
    target = tvm.target.Target(TARGET)
    mod = prepare(_squeeze_excite_conv(prologue, bias), target)
    graph = build_graph(mod)
    members = [n.name for n in graph.nodes if n.kind == "call_tir"]
    features = group_features(graph, members)
    with target:
        rule, _ = first_rule(group_kernel(mod, graph, members), target)
    card = features.card_on("cpu")
    assert rule is not None and card.rule == type(rule).__name__, (members, card.cls, rule)
    assert card.rule == ("RowReduction" if bias else "Fallback")


def _unit_program(kind: str) -> tvm.IRModule:
    """A reduction whose reduced extents are all 1, with an epilogue: what the rules take as
    a reduction (it keeps its init) though it reduces nothing."""
    from tvm import relax
    rng = np.random.default_rng(0)
    shapes = {"mean_1x1": (1, 16, 1, 1), "matmul_k1": (32, 1), "softmax_1": (4, 8, 1),
              "squeeze_excite_1x1": (1, 16, 1, 1)}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shapes[kind], "float32"))
    op = relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            if kind == "matmul_k1":
                w = relax.const(rng.standard_normal((1, 48)).astype("float32"))
                y = bb.emit(op.nn.relu(bb.emit(op.matmul(x, w))))
            elif kind == "softmax_1":
                y = bb.emit(op.multiply(bb.emit(op.nn.softmax(x, -1)), relax.const(3.0)))
            else:
                y = bb.emit(op.mean(x, axis=[2, 3], keepdims=True))
                if kind == "squeeze_excite_1x1":
                    w = relax.const(rng.standard_normal((8, 16, 1, 1)).astype("float32"))
                    y = bb.emit(op.nn.conv2d(y, w))
                y = bb.emit(op.nn.relu(bb.emit(op.multiply(y, relax.const(2.0)))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("kind", ["mean_1x1", "matmul_k1", "softmax_1", "squeeze_excite_1x1"])
def test_unit_extent_reductions_are_priced_as_the_reductions_the_rules_take(kind: str) -> None:
    """TVM's op pattern calls these elementwise, the rules take them as reductions (a lone one
    the row-reduction rule, one before a contraction the fallback): the features must say
    reduction too, or the plan prices another kernel than runs. Built with CostFuse they
    compute what the unfused program computes."""
    from tvm import relax

    from tvm_costfuse.strategies import strategy_pipeline
    from tvm_costfuse.targets import host_target

    program = _unit_program(kind)
    _check_module(kind, program)
    target = host_target()  # run here: this host's ISA
    shape = [int(d) for d in program["main"].params[0].ty.shape]
    data = tvm.runtime.tensor(np.random.default_rng(1).standard_normal(shape).astype("float32"))
    outs = []
    for strategy in ("none", "costfuse"):
        ex = tvm.compile(program, target, relax_pipeline=strategy_pipeline(strategy, target))
        outs.append(relax.VirtualMachine(ex, tvm.cpu())["main"](data).numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)
