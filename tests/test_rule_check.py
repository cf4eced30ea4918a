"""The plan's own rule check (``rule_check``): a group whose card's rule declines its kernel is
priced as the kernel that runs, and the plan is searched again (``transform.plan_module``).

The cards and the rules agree on every model here (``test_rule_fidelity``); to see the check
act, the attention rule is made to decline what the attention card still claims (its key
limit lowered in the rule's module only), or the check itself is replaced.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_costfuse.schedules.attention as attention_rule
from conftest import prepared
from tvm_costfuse.schedules.classes import ScheduleClass

from tvm_costfuse import FusionConfig, build_graph, models
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.strategies import strategy_pipeline
from tvm_costfuse.targets import host_target, resolve
from tvm_costfuse.transform import plan_module

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})


def _plan(mod):
    return plan_module(mod, resolve(AVX2).desc, FusionConfig(), compile_target=AVX2)


def test_agreeing_cards_and_rules_decline_nothing() -> None:
    mod, _ = prepared("bert_layer")
    plan = _plan(mod)
    graph = build_graph(mod)
    assert not plan.mismatched
    assert any(group_features(graph, g).schedule_on("cpu") == ScheduleClass.ATTENTION
               for g in plan.groups)


@pytest.fixture
def attention_declines(monkeypatch):
    """The attention rule declines every key row; the card (``cost/extract``) still claims."""
    monkeypatch.setattr(attention_rule, "MAX_KEYS", 1)


def test_a_declined_group_is_priced_as_what_runs(attention_declines) -> None:
    """Priced as the fallback's loops (what runs), the fused attention loses to its parts:
    the plan keeps no group the attention card claims, and it still computes the model."""
    mod, inputs = prepared("bert_layer")
    graph = build_graph(mod)
    plan = _plan(mod)
    assert plan.mismatched
    assert all("priced as attention (Attention), but its kernel is scheduled by Fallback"
               in why for _, _, why in plan.mismatched)
    assert any("priced as what runs" in n for n in plan.notes)
    assert not any("no rule schedules" in n for n in plan.notes)
    assert not any(group_features(graph, g).schedule_on("cpu") == ScheduleClass.ATTENTION
                   for g in plan.groups)
    # the plan the pass applies (rule check included) computes what no fusion does
    raw, _ = models.load("bert_layer", small=True)
    target = host_target(2)  # built and run here
    got, want = (run(tvm.compile(raw, target, relax_pipeline=strategy_pipeline(s, target)),
                     inputs)[0] for s in ("costfuse", "none"))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_rounds_end_and_say_what_the_plan_still_holds(monkeypatch) -> None:
    """A check that declines every group it is shown, as no rule scheduling it: the searches
    end after their rounds, and the notes say the plan still holds such groups (FuseOps'
    groups were declined too, so no region is cheaper there), priced at infinity."""
    from tvm_costfuse import transform
    from tvm_costfuse.rule_check import Mismatch

    calls = []

    def declines_all(mod, func_name, graph, groups, target, checked):
        calls.append(1)
        new = {frozenset(g) for g in groups} - checked
        checked |= new
        return {g: Mismatch(None, "declined by the test") for g in new
                if sum(graph[m].kind == "call_tir" for m in g) > 1}

    monkeypatch.setattr(transform, "mismatched_groups", declines_all)
    mod, _ = prepared("bert_layer")
    plan = _plan(mod)
    assert len(calls) == transform.RULE_CHECK_ROUNDS + 2  # every search, then the last plan
    assert plan.mismatched and all(cls is None for _, cls, _ in plan.mismatched)
    assert any("no rule schedules" in n for n in plan.notes)
    declined = {g for g, _, _ in plan.mismatched}
    assert any(g in declined for g in plan.groups) and plan.seconds == float("inf")
