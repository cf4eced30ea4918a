"""Rules-only fusion: kernel counts per canonical pattern, convexity, numerics."""

from __future__ import annotations

import pytest
from conftest import prepared, reference

from tvm_costfuse import FusionConfig, apply_partition, build_graph, models
from tvm_costfuse.measurement.timing import assert_close, build, run
from tvm_costfuse.partition import resolve_groups
from tvm_costfuse.planner import initial_units
from tvm_costfuse.rules import RulesFuse, rules_groups


def _kernels(name: str, config: FusionConfig | None = None) -> int:
    graph = build_graph(prepared(name)[0])
    return len(initial_units(graph, rules_groups(graph, config)))


@pytest.mark.parametrize(
    ("name", "kernels"),
    [
        ("conv_bn_relu", 1),  # conv + legalized batch norm + relu (FuseOps: 2)
        ("rmsnorm", 1),  # square -> mean -> +eps -> rsqrt -> *x -> *w (FuseOps: 2)
        ("elementwise_chain", 1),
        ("mlp_gelu", 2),  # [matmul add gelu] [matmul add]
        ("layernorm_mlp", 3),  # [layer_norm] [matmul add gelu] [matmul add +x]
        ("attention", 4),  # [K^T] [QK^T scale] [softmax] [PV]
    ],
)
def test_kernel_count(name: str, kernels: int) -> None:
    assert _kernels(name) == kernels


def test_attention_grouping_is_qk_scale_softmax_pv() -> None:
    graph = build_graph(prepared("attention")[0])
    assert rules_groups(graph) == [["matmul", "divide"]]


def test_never_two_contractions_or_a_contraction_and_a_reduction() -> None:
    from tvm_costfuse.cost.features import op_class

    for name in ("bert_layer", "gpt2_block", "resnet18"):
        graph = build_graph(prepared(name)[0])
        for group in rules_groups(graph):
            classes = [op_class(graph[n]) for n in group]
            assert classes.count("contraction") <= 1, group
            assert not ("contraction" in classes and "reduction" in classes), group


@pytest.mark.parametrize("name", models.zoo.names())
def test_groups_are_convex_and_apply(name: str) -> None:
    mod = prepared(name)[0]
    groups = rules_groups(build_graph(mod))
    assert resolve_groups(build_graph(mod), groups) == groups
    apply_partition(mod, groups)  # raises PartitionError if not convex or cyclic


def test_caps_bound_every_group() -> None:
    graph = build_graph(prepared("elementwise_chain")[0])
    groups = rules_groups(graph, FusionConfig(max_body_ops=4))
    assert groups and max(len(g) for g in groups) <= 4
    assert _kernels("elementwise_chain", FusionConfig(max_chain_length=5)) > 1


@pytest.mark.parametrize("name", ["conv_bn_relu", "rmsnorm", "gpt2_block"])
def test_numerics_match_no_fusion(name: str) -> None:
    mod, inputs = models.load(name, small=True)
    assert_close(run(build(mod, fusion=RulesFuse()), inputs), reference(name))
