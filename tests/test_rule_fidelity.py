"""The card the cost model prices a fused kernel with is the card of the rule that schedules
it: for every group CostFuse fuses on the zoo and on the corpus' decode steps (one token
against a KV cache: one query row, one normalized row), the rule ``ApplyDefaultSchedule``
applies to the group's kernel (``schedules.first_rule``) is the rule of the card that claimed
the group (``GroupFeatures.card_on``), and its class one of that rule's. A mismatch means the
plan priced another kernel than the one that runs; the wrong result of a unit-extent reduction
in a two-reduction kernel sat in that gap.

Full shapes for the zoo, the small variants of the decode steps, on a fixed AVX2 target
(nothing here runs a kernel, so no host ISA is assumed).
Single ops are not checked here: they are the same kernels under every strategy, and some are
priced as another class than the rule that takes them (a lone max pool or sum is priced as a
row reduction and scheduled by the fallback; a conv whose output ends in a unit axis is
priced as a contraction and declined by that rule): ``docs/correctness.md``, known gaps.
"""

from __future__ import annotations

import pytest
import tvm
from tvm_costfuse.schedules import first_rule

from tvm_costfuse import FusionConfig, build_graph, models
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.targets import resolve
from tvm_costfuse.transform import plan_module
from tvm_costfuse.tuning.feedback import group_kernel

TARGET = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}


DECODE_STEPS = [n for n in models.corpus_names() if n.endswith("_decode128")]


@pytest.mark.parametrize("name", models.zoo.names() + DECODE_STEPS)
def test_planned_kernels_get_the_rule_they_were_priced_as(name: str) -> None:
    target = tvm.target.Target(TARGET)
    desc = resolve(target).desc
    mod = prepare(models.load(name, small=name in DECODE_STEPS)[0], target)
    graph = build_graph(mod)
    plan = plan_module(mod, desc, FusionConfig(), compile_target=target)
    # the cards and the rules agree on their own: the plan's rule check declined nothing
    assert not plan.mismatched, plan.mismatched
    checked, wrong = 0, []
    for members in plan.groups:
        features = group_features(graph, members)
        if features.is_view or not any(graph[m].kind == "call_tir" for m in members):
            continue  # no kernel of its own
        with target:
            rule, _ = first_rule(group_kernel(mod, graph, members), target)
        card = features.card_on("cpu")
        checked += 1
        if rule is None or card.rule != type(rule).__name__ or card not in rule.cards:
            wrong.append(f"{'+'.join(members)}: priced {card.cls} ({card.rule}), scheduled "
                         f"by {type(rule).__name__ if rule else 'no rule'}")
    assert checked, f"{name}: no kernel checked"
    assert not wrong, f"{name}: " + "; ".join(wrong)
