"""Planner speed-ups must not change plans: the greedy plans (groups and every decision weighed)
of the zoo's small models and of synthetic graphs, on host-independent targets, equal those
recorded in ``tests/data/planner_plans.json`` before the planner was optimized.

Regenerate (only for an intended change of plans): ``python tests/test_plan_identity.py --write``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TVM_COSTFUSE_CALIBRATION", "none")

import pytest

from tvm_costfuse import FusionConfig, build_graph, models, plan_greedy
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.targets import host, preset
from tvm_costfuse.testing import branchy_dag, random_dag

DATA = Path(__file__).resolve().parent / "data" / "planner_plans.json"
ZOO = ("mlp_gelu", "attention", "conv_bn_relu", "resnet18", "mobilenetv2", "bert_layer",
       "gpt2_block", "layernorm_mlp", "rmsnorm", "elementwise_chain")


def _targets():
    # A CPU described without this machine: named ISA, fixed caches, default figures.
    cpu = dataclasses.replace(host(2, calibration=False, mcpu="znver4"), l1_bytes=48 << 10,
                              l2_bytes=1 << 20, l3_bytes=32 << 20)
    return {"h100": preset("h100"), "cpu-znver4": cpu}


def _graphs():
    for name in ZOO:
        yield f"{name}@small", lambda name=name: build_graph(
            prepare(models.load(name, small=True)[0], fold=False))
    for seed in range(3):
        yield f"random_dag-400-{seed}", lambda seed=seed: random_dag(400, seed=seed)
        yield f"branchy_dag-150-{seed}", lambda seed=seed: branchy_dag(150, seed=seed)


def _plan_record(plan) -> dict:
    return {"groups": [list(g) for g in plan.groups],
            "decisions": [[d.kind, list(d.left), list(d.right), d.accepted, d.reason]
                          for d in plan.decisions]}


def current_plans() -> dict:
    targets = _targets()
    out = {}
    for name, make in _graphs():
        graph = make()
        for tname, desc in targets.items():
            out[f"{name}/{tname}"] = _plan_record(plan_greedy(graph, desc, FusionConfig()))
    return out


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(DATA.read_text())


@pytest.fixture(scope="module")
def now() -> dict:
    return current_plans()


def test_plans_are_unchanged(recorded, now):
    assert sorted(now) == sorted(recorded)
    changed = [k for k in recorded if now[k]["groups"] != recorded[k]["groups"]]
    assert not changed, changed


def test_decisions_are_unchanged(recorded, now):
    # The decisions are what `costfuse tune` measures and `explain` prints; reasons carry
    # gains rounded to 0.01 us.
    changed = [k for k in recorded if now[k]["decisions"] != recorded[k]["decisions"]]
    assert not changed, changed


if __name__ == "__main__" and "--write" in sys.argv:
    plans = current_plans()
    rows = (f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'), sort_keys=True)}"
            for k, v in sorted(plans.items()))
    DATA.write_text("{\n" + ",\n".join(rows) + "\n}\n")
    print(f"wrote {DATA}")
