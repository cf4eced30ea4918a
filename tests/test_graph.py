"""OpGraph: one node per binding, with patterns, costs and fusability read off the IR."""

from __future__ import annotations

import math

import pytest
from conftest import prepared

from tvm_costfuse.graph import OpPattern, build_graph


def test_mlp_nodes_patterns_and_edges() -> None:
    graph = build_graph(prepared("mlp_gelu")[0])
    kinds = {n.name: (n.kind, n.pattern) for n in graph.nodes}
    assert kinds["matmul"] == ("call_tir", OpPattern.OUT_EWISE_FUSABLE)
    assert kinds["gelu"] == ("call_tir", OpPattern.ELEMWISE)
    assert kinds["gv"][0] == "other"
    assert graph.producers("add") == ("matmul",)
    assert "add" in graph.consumers["matmul"]
    assert graph["matmul"].inputs[0] == "%x"
    assert any(i.startswith("%const") for i in graph["matmul"].inputs)
    assert graph.block_outputs == {"gv"}
    assert graph.fusable_names() == [n.name for n in graph.nodes if n.name != "gv"]
    assert "not a call_tir" in graph["gv"].why_not_fusable


def test_matmul_flops_bytes_and_reduction_extent() -> None:
    graph = build_graph(prepared("mlp_gelu")[0])
    mm = graph["matmul"]
    (out,) = mm.outputs
    assert out.shape == (1, 8, 128) and out.dtype == "float32"
    k = 32  # small mlp_gelu: hidden 32 -> ffn 128
    assert mm.flops == 2 * math.prod(out.shape) * k
    assert mm.reduction_extent == k
    assert mm.bytes_written == math.prod(out.shape) * 4
    assert mm.bytes_read == (8 * 32 + 32 * 128) * 4


def test_softmax_is_a_reduction_over_the_last_axis() -> None:
    graph = build_graph(prepared("attention")[0])
    sm = graph["softmax"]
    assert sm.reduction_extent == sm.outputs[0].shape[-1]
    assert graph["divide"].reduction_extent == 1


def test_tuple_get_item_nodes_follow_their_producer() -> None:
    graph = build_graph(prepared("gpt2_block")[0])
    items = [n for n in graph.nodes if n.kind == "tuple_get_item"]
    assert len(items) == 3
    assert {graph.producers(n.name) for n in items} == {("split",)}
    assert len(graph["split"].outputs) == 3


def test_unknown_function_is_rejected() -> None:
    with pytest.raises(ValueError, match="no function named 'forward'"):
        build_graph(prepared("mlp_gelu")[0], "forward")


def test_math_library_calls_are_counted_where_flops_see_none() -> None:
    """TVM's FLOP estimate gives exp, log, tanh, cos... no work at all; the graph counts them in
    exp-equivalents (schedules.math_calls.MATH_COST), per element of the loop that calls them."""
    from tvm_costfuse.schedules.math_calls import MATH_COST

    graph = build_graph(prepared("elementwise_chain")[0])
    elems = math.prod(graph["cos"].outputs[0].shape)
    assert graph["cos"].flops == 0 and graph["cos"].math == MATH_COST["cos"] * elems
    assert graph["exp"].math == elems and graph["log"].math == MATH_COST["log"] * elems
    assert graph["add"].math == 0 and graph["sqrt"].math == 0 and graph["abs"].math == 0
    gelu = build_graph(prepared("mlp_gelu")[0])["gelu"]
    assert gelu.math == MATH_COST["erf"] * math.prod(gelu.outputs[0].shape)
