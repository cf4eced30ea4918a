"""Planner scenarios: kernel counts per pattern, the user's caps, speed, greedy vs exact."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import prepared
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_costfuse import FusionConfig, build_graph, plan_exact, plan_greedy
from tvm_costfuse.cost import Estimate, estimate, group_features
from tvm_costfuse.cost.analytical import one_footing
from tvm_costfuse.graph import OpGraph, OpPattern
from tvm_costfuse.planner import initial_units, plan_cost
from tvm_costfuse.quotient import Quotient
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


@pytest.mark.parametrize("seed", range(3))
def test_exact_on_a_big_graph_searches_regions_and_never_loses_to_greedy(seed: int) -> None:
    graph = random_dag(30, seed=seed, fan_in=0.5)
    config = FusionConfig()
    greedy = plan_greedy(graph, H100, config)
    exact = plan_exact(graph, H100, config)
    assert exact.seconds <= greedy.seconds * (1 + 1e-9)
    assert plan_cost(graph, H100, config, exact.groups) == pytest.approx(exact.seconds)
    assert "exact search per region" in exact.notes[0] and "greedy elsewhere" in exact.notes[0]
    members = [n for g in exact.estimates for n in g]
    assert len(members) == len(set(members))  # a partition
    assert Quotient(graph, [frozenset(g) for g in exact.estimates]).is_acyclic()


def test_exact_on_a_small_graph_is_one_region_without_a_note() -> None:
    assert plan_exact(random_dag(8, seed=1), H100, FusionConfig()).notes == ()


# ---------------------------------------------------------------------------------------------
# Convexity: every plan contracts to a DAG
# ---------------------------------------------------------------------------------------------


def _assert_contracts_to_a_dag(graph: OpGraph, groups) -> None:
    """Each binding in one group at most, groups fusable, and the graph with every group
    contracted to one node acyclic (a path leaving a group and coming back is a cycle)."""
    owner: dict[str, int] = {}
    for i, group in enumerate(groups):
        for name in group:
            assert name not in owner, f"{name} in groups {owner[name]} and {i}"
            assert graph[name].fusable, name
            owner[name] = i
    key = {n.name: owner.get(n.name, n.name) for n in graph.nodes}
    succ: dict = {k: set() for k in key.values()}
    for node in graph.nodes:
        for p in graph.producers(node.name):
            if key[p] != key[node.name]:
                succ[key[p]].add(key[node.name])
    indegree = dict.fromkeys(succ, 0)
    for outs in succ.values():
        for v in outs:
            indegree[v] += 1
    ready, seen = [k for k, d in indegree.items() if d == 0], 0
    while ready:
        seen += 1
        for v in succ[ready.pop()]:
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    assert seen == len(succ), f"the plan's groups form a cycle: {groups}"


_PATTERNS = [(OpPattern.OUT_EWISE_FUSABLE, 512.0, 256), (OpPattern.BROADCAST, 1.0, 1),
             (OpPattern.ELEMWISE, 8.0, 1), (OpPattern.COMM_REDUCE, 1.0, 256),
             (OpPattern.INJECTIVE, 0.0, 1)]


@st.composite
def reconvergent_dags(draw, max_nodes: int = 40) -> OpGraph:
    """Each op reads its predecessor or a nearby one (chains), often also one or two earlier
    ops (diamonds, skip connections, fan-in) or the input; some are unfusable (an opaque
    ``take``, a call_packed), so that paths run through bindings no group may hold."""
    n = draw(st.integers(2, max_nodes), label="n")
    nodes = []
    for i in range(n):
        pattern, fpe, red = draw(st.sampled_from(_PATTERNS))
        if i == 0:
            inputs = ["%x"]
        else:
            near = draw(st.integers(max(0, i - 3), i - 1))
            far = draw(st.lists(st.integers(0, i - 1), max_size=2))
            inputs = list(dict.fromkeys(f"op{j}" for j in [near, *far]))
            if draw(st.integers(0, 7)) == 0:
                inputs.append("%x")
        elems = 1 << draw(st.sampled_from([10, 14, 20]))
        node = op(i, f"op{i}", pattern, inputs, elems=elems, flops_per_elem=fpe, reduction=red)
        if draw(st.integers(0, 5)) == 0:
            node = dataclasses.replace(node, pattern=OpPattern.OPAQUE,
                                       why_not_fusable="it is opaque (op_pattern 8)")
        nodes.append(node)
    return make_graph(nodes)


@pytest.mark.parametrize("target", [H100, HOST], ids=["h100", "host"])
@settings(max_examples=150)
@given(graph=reconvergent_dags())
def test_greedy_plans_are_convex(target, graph: OpGraph) -> None:
    plan = plan_greedy(graph, target, FusionConfig())
    _assert_contracts_to_a_dag(graph, plan.groups)
    narrow = plan_greedy(graph, target, FusionConfig(max_body_ops=3))
    _assert_contracts_to_a_dag(graph, narrow.groups)


@settings(max_examples=60)
@given(graph=reconvergent_dags(max_nodes=9))
def test_exact_plans_are_convex(graph: OpGraph) -> None:
    if len(initial_units(graph)) > 7:
        return
    _assert_contracts_to_a_dag(graph, plan_exact(graph, H100, FusionConfig()).groups)


def test_path_through_an_unfusable_binding_blocks_the_merge() -> None:
    # op0 -> take (opaque) -> op2 and op0 -> op2: fusing op0 with op2 would need the take
    # both before and after the kernel.
    graph = make_graph([
        op(0, "op0", OpPattern.ELEMWISE, ["%x"]),
        dataclasses.replace(op(1, "take", OpPattern.OPAQUE, ["op0"]), why_not_fusable="opaque"),
        op(2, "op2", OpPattern.BROADCAST, ["op0", "take"]),
    ])
    plan = plan_greedy(graph, H100, FusionConfig())
    assert plan.groups == ()
    assert any("through 'take'" in d.reason for d in plan.decisions)


def test_group_zero_is_a_blocker_too() -> None:
    # Group 0 (m) lies on the path a -> m -> b: merging a and b must be refused.
    graph = make_graph([
        op(0, "a", OpPattern.ELEMWISE, ["%x"]),
        op(1, "m", OpPattern.ELEMWISE, ["a"]),
        op(2, "b", OpPattern.BROADCAST, ["a", "m"]),
    ])
    q = Quotient(graph, [frozenset({"m"}), frozenset({"a"}), frozenset({"b"})])
    assert q.blocker(1, 2) == 0 and q.blocker(2, 1) == 0


@pytest.mark.parametrize("target", [H100, HOST], ids=["h100", "host"])
def test_shifted_window_attention_plan_is_convex(target) -> None:
    # Two Swin blocks from PyTorch: q, k and v are opaque `take`s of one tensor, and the
    # planner used to fuse across them into a cycle of four groups.
    import torch
    from torch_models import ShiftedWindowAttention

    from tvm_costfuse import load_torch
    from tvm_costfuse.pipelines import prepare

    torch.manual_seed(0)
    net = torch.nn.Sequential(ShiftedWindowAttention(shift=0), ShiftedWindowAttention(shift=2))
    graph = build_graph(prepare(load_torch(net, (torch.randn(1, 8, 8, 16),))[0]))
    assert not all(n.fusable for n in graph.nodes)
    _assert_contracts_to_a_dag(graph, plan_greedy(graph, target, FusionConfig()).groups)


def _slow_unions(correct_singles: bool):
    """A model whose 'trees' price every merged group at 3x the analytical time, and every
    single op at its analytical time, as a correction (``correct_singles``) or a fallback."""
    def model(f, target, register_budget=None):
        e = estimate(f, target, register_budget)
        if f.chain_length > 1 or correct_singles:
            s = e.seconds * (3.0 if f.chain_length > 1 else 1.0)
            return Estimate(s, {"learned": s, "analytical": e.seconds}, e.registers,
                            e.spill_bytes, 0.8)
        return Estimate(e.seconds, {**e.breakdown, "fallback": 1.0}, e.registers,
                        e.spill_bytes, 0.1)
    return model


def test_a_merge_is_weighed_on_one_footing() -> None:
    # The trees answer the unions but not the parts: the merge is decided on the analytical
    # times of all three, not on a corrected union against uncorrected parts.
    graph = build_graph(prepared("rmsnorm", small=False)[0])
    analytical = plan_greedy(graph, HOST, FusionConfig())
    assert analytical.kernels() == 1
    mixed = plan_greedy(graph, HOST, FusionConfig(), model=_slow_unions(False))
    assert mixed.groups == analytical.groups
    # Where the trees answer every group, their times decide: no merge pays.
    learned = plan_greedy(graph, HOST, FusionConfig(), model=_slow_unions(True))
    assert learned.groups == ()
    assert learned.kernels() == len(graph.call_tir_names())


def test_one_footing_reads_analytical_times_only_when_sources_mix() -> None:
    corrected = Estimate(2.0, {"learned": 2.0, "analytical": 1.0})
    plain = Estimate(5.0, {"memory": 5.0})
    view = Estimate(0.0, {})
    assert one_footing([corrected, corrected]) == [2.0, 2.0]
    assert one_footing([plain, plain]) == [5.0, 5.0]
    assert one_footing([corrected, view]) == [2.0, 0.0]
    assert one_footing([corrected, plain, view]) == [1.0, 5.0, 0.0]
