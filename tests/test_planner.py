"""Planner scenarios: kernel counts per pattern, the user's caps, speed, greedy vs exact."""

from __future__ import annotations

import pytest
from conftest import prepared

from tvm_costfuse import FusionConfig, build_graph, plan_exact, plan_greedy
from tvm_costfuse.cost import group_features
from tvm_costfuse.graph import OpPattern
from tvm_costfuse.planner import plan_cost
from tvm_costfuse.targets import preset
from tvm_costfuse.testing import branchy_dag, make_graph, op, random_dag

H100, HOST = preset("h100"), preset("host")


def _chain(graph, group) -> int:
    return group_features(graph, group).chain_length


@pytest.mark.parametrize("target", [H100, HOST], ids=["h100", "host"])
def test_reduce_and_epilogue_become_one_kernel(target) -> None:
    # rmsnorm: square -> mean -> +eps -> rsqrt -> *x -> *w. FuseOps stops at the reduction
    # (2 kernels); the model prices the intermediate round trips and fuses all six.
    graph = build_graph(prepared("rmsnorm", small=False)[0])
    plan = plan_greedy(graph, target, FusionConfig())
    assert plan.kernels() == 1
    assert plan.groups[0] == tuple(graph.call_tir_names())


def test_softmax_joins_its_producer_on_cuda() -> None:
    graph = build_graph(prepared("attention", small=False)[0])
    plan = plan_greedy(graph, H100, FusionConfig())
    (group,) = [g for g in plan.groups if "softmax" in g]
    assert "divide" in group
    accepted = [d for d in plan.decisions if d.accepted]
    assert accepted and all(d.gain_s > 0 for d in accepted)


def test_elementwise_chain_is_one_kernel_on_cuda() -> None:
    graph = build_graph(prepared("elementwise_chain", small=False)[0])
    plan = plan_greedy(graph, H100, FusionConfig())
    assert plan.kernels() == 1


def _fan_in(width: int):
    """A balanced tree of adds over ``width`` inputs: every leaf stays live in one kernel."""
    nodes, level, i = [], [f"%x{k}" for k in range(width)], 0
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[::2], level[1::2], strict=True):
            nodes.append(op(i, f"add{i}", OpPattern.ELEMWISE, [a, b], elems=1 << 20))
            nxt.append(f"add{i}")
            i += 1
        level = nxt
    return make_graph(nodes)


def test_fan_in_over_the_register_budget_is_split() -> None:
    graph = _fan_in(32)  # 31 adds; in one kernel all 32 inputs are live: ~74 registers
    assert plan_greedy(graph, H100, FusionConfig()).kernels() == 1
    config = FusionConfig(register_budget=64)
    plan = plan_greedy(graph, H100, config)
    assert plan.kernels() > 1
    assert all(e.registers <= 64 for e in plan.estimates.values())
    assert any("register_budget 64" in d.reason for d in plan.decisions if not d.accepted)


def test_max_chain_length_and_max_body_ops_bound_every_group() -> None:
    graph = build_graph(prepared("elementwise_chain", small=False)[0])
    free = plan_greedy(graph, H100, FusionConfig())
    capped = plan_greedy(graph, H100, FusionConfig(max_chain_length=4))
    assert max(_chain(graph, g) for g in capped.estimates) <= 4 < _chain(graph, free.groups[0])
    narrow = plan_greedy(graph, H100, FusionConfig(max_body_ops=3))
    assert max(len(g) for g in narrow.estimates) <= 3
    assert any("max_body_ops 3" in d.reason for d in narrow.decisions)


def test_thousand_node_graph_plans_every_node_once() -> None:
    """A 1000-node graph plans to a partition of its nodes (planning speed is measured by
    ``scripts/planner_speed.py``, not asserted here)."""
    graph = random_dag(1000, seed=1)
    plan = plan_greedy(graph, H100, FusionConfig())
    members = [n for g in plan.groups for n in g]
    assert len(members) == len(set(members)) and plan.kernels() < 1000


def test_merging_unrelated_ops_does_not_borrow_parallelism() -> None:
    # A scalar-wide reduction fused with an unrelated wide op keeps its own (serial) loop:
    # fusing saves a launch and some overlap, never the reduction's serial time.
    wide = op(0, "wide", OpPattern.ELEMWISE, ["%x"], elems=1 << 20)
    narrow = op(1, "narrow", OpPattern.COMM_REDUCE, ["%y"], elems=1, flops_per_elem=1 << 20,
                reduction=1 << 20, in_elems=[1 << 20])
    graph = make_graph([wide, narrow])
    config = FusionConfig()
    alone = plan_cost(graph, H100, config, [])
    together = plan_cost(graph, H100, config, [["wide", "narrow"]])
    assert together >= 0.9 * alone


def test_greedy_is_deterministic() -> None:
    graph = random_dag(200, seed=3)
    a = plan_greedy(graph, HOST, FusionConfig())
    b = plan_greedy(graph, HOST, FusionConfig())
    assert a.groups == b.groups and a.decisions == b.decisions


@pytest.mark.parametrize("branchy", [False, True], ids=["chain", "branchy"])
@pytest.mark.parametrize("seed", range(6))
def test_exact_is_never_worse_than_greedy(seed: int, branchy: bool) -> None:
    graph = branchy_dag(8, seed=seed) if branchy else random_dag(8, seed=seed, fan_in=0.5)
    config = FusionConfig()
    greedy = plan_greedy(graph, H100, config)
    exact = plan_exact(graph, H100, config)
    assert exact.seconds <= greedy.seconds * (1 + 1e-9)
    assert plan_cost(graph, H100, config, exact.groups) == pytest.approx(exact.seconds)


def test_exact_refuses_big_graphs() -> None:
    with pytest.raises(ValueError, match="units > max_units 9"):
        plan_exact(random_dag(30), H100, FusionConfig())
