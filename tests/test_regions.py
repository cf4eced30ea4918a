"""``regions``: a plan takes FuseOps' grouping region by region where the same cost model
predicts it cheaper, legal and convex, and is then never predicted slower than FuseOps."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import prepared

from tvm_costfuse import models
from tvm_costfuse.config import FusionConfig
from tvm_costfuse.graph import build_graph
from tvm_costfuse.partition import fuseops_groups
from tvm_costfuse.planner import plan_cost
from tvm_costfuse.pricer import Pricer
from tvm_costfuse.regions import cheaper_by_region, differing_regions
from tvm_costfuse.targets import host, preset
from tvm_costfuse.transform import plan_module

H100 = preset("h100")


def _rmsnorm():
    mod = prepared("rmsnorm")[0]
    return build_graph(mod), fuseops_groups(mod)


def test_regions_pair_the_units_over_the_same_ops():
    a, b, c = frozenset("a"), frozenset("b"), frozenset("c")
    regions = differing_regions([a | b, c], [a, b, c])
    assert regions == [([a | b], [a, b])]


def test_a_cheaper_legal_region_is_taken_and_a_dearer_one_is_not():
    graph, fuseops = _rmsnorm()
    config = FusionConfig.resolve()
    price = Pricer(graph, H100, config, None)
    # No fusion at all against FuseOps' two kernels: FuseOps' are predicted cheaper.
    units, swapped, saved = cheaper_by_region(graph, price, [], fuseops)
    assert swapped >= 1 and saved > 0
    assert {frozenset(g) for g in fuseops} <= set(units)
    # CostFuse's one kernel against FuseOps' two: ours is predicted cheaper, kept.
    one = [graph.call_tir_names()]
    units, swapped, _ = cheaper_by_region(graph, price, one, fuseops)
    assert swapped == 0 and frozenset(one[0]) in units
    # A grouping our legality refuses (one op per kernel) is never taken.
    capped = Pricer(graph, H100, FusionConfig.resolve(max_body_ops=1), None)
    assert cheaper_by_region(graph, capped, [], fuseops)[1] == 0


@pytest.mark.parametrize("target", ["h100", "cpu"])
def test_plans_are_never_predicted_slower_than_fuseops(target):
    # The CPU described without this machine: named ISA, fixed caches, default figures.
    cpu = dataclasses.replace(host(2, calibration=False, mcpu="znver4"), l1_bytes=48 << 10,
                              l2_bytes=1 << 20, l3_bytes=32 << 20)
    desc = H100 if target == "h100" else cpu
    config = FusionConfig.resolve()
    for name in models.zoo.names():
        mod = prepared(name)[0]
        graph = build_graph(mod)
        ours = plan_cost(graph, desc, config, plan_module(mod, desc, config).groups)
        assert ours <= plan_cost(graph, desc, config, fuseops_groups(mod)) * (1 + 1e-9), name
