"""``tuning.in_model``: the decisions a plan ends with, each timed fused and split inside the
model, recorded with the features ``cost.evaluation`` scores them by."""

from __future__ import annotations

import json

from tvm_costfuse.schedules import schedule_pass

from tvm_costfuse import models
from tvm_costfuse.config import FusionConfig
from tvm_costfuse.cost.evaluation import decide, in_model_pairs
from tvm_costfuse.cost.features import GroupFeatures
from tvm_costfuse.graph import build_graph
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.targets import host_target, preset
from tvm_costfuse.transform import plan_module
from tvm_costfuse.tuning.in_model import final_decisions, label_decisions, read_labels


def _planned(name: str, target):
    mod, inputs = models.load(name, small=True)
    prepared = prepare(mod, target)
    return mod, inputs, prepared, plan_module(prepared, preset("h100"), FusionConfig.resolve())


def test_final_decisions_are_what_the_plan_shows() -> None:
    _, _, prepared, plan = _planned("bert_layer", "llvm")
    graph = build_graph(prepared)
    decisions = final_decisions(plan, graph)
    groups = {frozenset(g) for g in plan.groups}
    grouped = {n for g in plan.groups for n in g}
    assert any(d.accepted for d in decisions) and any(not d.accepted for d in decisions)
    for d in decisions:
        if d.accepted:
            assert frozenset(d.left + d.right) in groups
        else:
            for side in (d.left, d.right):
                assert frozenset(side) in groups or (len(side) == 1 and side[0] not in grouped)


def test_labels_are_recorded_with_readable_features(tmp_path) -> None:
    target = host_target(1)
    mod, inputs, prepared, plan = _planned("rmsnorm", target)
    records = label_decisions("rmsnorm@small", mod, prepared, plan, inputs, target, tmp_path,
                              schedule_pass(target), repeat=1, log=lambda _m: None)
    assert records and read_labels(tmp_path) == json.loads(json.dumps(records))
    for r in records:
        assert r["fused_s"] > 0 and r["split_s"] > 0
        for side in ("left", "right", "union"):
            assert GroupFeatures.from_row(r[side]).n_ops == len(r[side]["members"])
        assert set(r["union"]["members"]) == set(r["left"]["members"]) | set(
            r["right"]["members"])
    pairs = in_model_pairs(records)
    assert [p.fuse_wins for p in pairs] == [r["fused_s"] < r["split_s"] for r in records]
    assert decide(pairs, lambda row: (1.0, True)).pairs == len(records)
