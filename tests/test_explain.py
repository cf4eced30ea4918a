"""``costfuse explain``: the report covers every op once, prices every partition, and draws."""

from __future__ import annotations

import json

import pytest
from conftest import prepared

from tvm_costfuse import build_graph
from tvm_costfuse.cli import main
from tvm_costfuse.report.explain import draw, explain, format_text, intermediate_bytes, kernels_of


@pytest.fixture(scope="module")
def report() -> dict:
    return explain("layernorm_mlp", "h100", small=True)


def test_report_is_json_and_covers_every_op_once(report) -> None:
    json.dumps(report)
    graph = build_graph(prepared("layernorm_mlp")[0])
    ops = [o["binding"] for g in report["groups"] for o in g["ops"]]
    assert sorted(ops) == sorted(graph.call_tir_names())
    for g in report["groups"]:
        assert set(g["breakdown"]) >= {"launch", "memory", "compute", "spill"}
        assert g["predicted_s"] >= sum(g["breakdown"].values()) * 0.5 > 0
        assert g["schedule"] in ("contraction", "contraction+stream", "reduction", "elementwise",
                                 "fallback")


def test_every_decision_has_a_reason_and_accepted_ones_gain(report) -> None:
    assert report["decisions"]
    for d in report["decisions"]:
        assert d["reason"]
        assert not d["accepted"] or d["gain_s"] > 0


def test_totals_compare_partitions_under_one_model(report) -> None:
    t = report["totals"]
    assert t["none"]["kernels"] == 7 and t["fuseops"]["kernels"] == 3
    assert t["costfuse"]["kernels"] == len(report["groups"])
    assert t["costfuse"]["predicted_s"] == pytest.approx(
        sum(g["predicted_s"] for g in report["groups"]))
    assert t["costfuse"]["predicted_s"] <= t["none"]["predicted_s"]
    assert t["costfuse"]["intermediate_bytes"] < t["none"]["intermediate_bytes"]


def test_intermediate_bytes_counts_tensors_between_kernels() -> None:
    # rmsnorm (small, 8 x 64 floats): unfused, square / mean / add / rsqrt / mul are written and
    # read back (2 KiB + 3 x 32 B + 2 KiB); fused into one kernel nothing is.
    graph = build_graph(prepared("rmsnorm")[0])
    assert intermediate_bytes(graph, kernels_of(graph, [])) == 2048 + 3 * 32 + 2048
    assert intermediate_bytes(graph, kernels_of(graph, [graph.call_tir_names()])) == 0


def test_caps_reach_the_planner() -> None:
    capped = explain("conv_bn_relu", "h100", small=True, max_body_ops=1)
    assert all(len([o for o in g["ops"] if o["prim_func"]]) == 1 for g in capped["groups"])
    assert any("max_body_ops 1" in d["reason"] for d in capped["decisions"])


def test_format_text_lists_kernels_and_totals(report) -> None:
    text = format_text(report)
    assert "layer_norm[redu]" in text and "fuseops" in text and "decisions:" in text


def test_draw_writes_a_png(report, tmp_path) -> None:
    import matplotlib  # noqa: F401  (test extra)
    path = draw(report, str(tmp_path / "plan.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_explain_json(capsys) -> None:
    assert main(["explain", "rmsnorm", "--small", "--target", "host", "--json",
                 "--max-chain-length", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["max_chain_length"] == 3
    assert out["totals"]["costfuse"]["kernels"] > 1


def test_cli_explain_lists_the_folds_unless_told_not_to_fold(capsys) -> None:
    assert main(["explain", "conv_bn_relu", "--small", "--target", "host"]) == 0
    folded = capsys.readouterr().out
    assert "folded: bn: conv2d 3x3 + batch_norm -> conv2d 3x3 + bias" in folded
    assert main(["explain", "conv_bn_relu", "--small", "--target", "host", "--no-fold"]) == 0
    plain = capsys.readouterr().out
    assert "folded:" not in plain and "batch_norm[" in plain


def test_a_lone_reshape_is_a_view_not_a_kernel() -> None:
    # TVM's RewriteDataflowReshape turns a reshape left alone into a VM view: no kernel, no
    # bytes; fusing it into its producer moves the same tensor, so the bytes do not change.
    graph = build_graph(prepared("bert_layer")[0])
    views = [n for n in graph.nodes if n.kind == "call_tir" and n.view]
    assert views and all(n.reshape_like for n in views)
    kernels = kernels_of(graph, [])
    assert len(kernels) == len(graph.call_tir_names()) - len(views)
    alone = intermediate_bytes(graph, kernels)
    view = views[0]
    (producer,) = [p for p in graph.producers(view.name) if graph[p].kind == "call_tir"]
    assert graph.consumers[producer] == (view.name,)
    fused = kernels_of(graph, [[producer, view.name]])
    assert len(fused) == len(kernels)
    assert intermediate_bytes(graph, fused) == alone


def test_demo_reports_the_kernels_each_build_launches(capsys) -> None:
    assert main(["demo", "--model", "rmsnorm", "--small", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("none", "tvm", "costfuse")}
    # rmsnorm spelled out: six ops unfused, FuseOps leaves the reduction split, CostFuse one.
    assert (rows["none"][1], rows["tvm"][1], rows["costfuse"][1]) == ("6", "2", "1")
    # ... and the demo says so: FuseOps' two kernels merged, priced, with the measured ratio.
    assert "CostFuse decided 1 region(s) differently from FuseOps" in out
    assert "  merged [" in out and "CostFuse vs FuseOps, same schedules: " in out


def test_differences_cover_exactly_the_kernels_the_partitions_disagree_on() -> None:
    from tvm_costfuse.config import FusionConfig
    from tvm_costfuse.partition import fuseops_groups
    from tvm_costfuse.report.decided import describe, differences
    from tvm_costfuse.targets import preset

    graph = build_graph(prepared("rmsnorm")[0])
    fuseops = fuseops_groups(prepared("rmsnorm")[0])
    ours = [graph.call_tir_names()]  # one kernel, as CostFuse plans rmsnorm
    diffs = differences(graph, preset("h100"), FusionConfig.resolve(), fuseops, ours)
    theirs = set(kernels_of(graph, fuseops)) - set(kernels_of(graph, ours))
    assert [set(d.fuseops) for d in diffs] == [theirs] and diffs[0].verb == "merged"
    assert {n for k in diffs[0].costfuse for n in k} == {n for k in theirs for n in k}
    assert diffs[0].fuseops_s > 0 and diffs[0].costfuse_s > 0
    assert describe(graph, diffs[0]).startswith("merged [")
    assert differences(graph, preset("h100"), FusionConfig.resolve(), fuseops, fuseops) == []


def test_the_default_demo_shows_two_decisions_that_differ_from_fuseops(capsys) -> None:
    # The README's main job: each default model must have something to show, FuseOps' kernel
    # split, then a decode step's attention fused whole (the ratios it measures are the
    # demo's output, not this test's claim).
    assert main(["demo", "--repeat", "1"]) == 0
    first, second = capsys.readouterr().out.split("\n\nmodel ")
    assert first.startswith("model elementwise_chain,")
    assert "CostFuse decided 1 region(s) differently from FuseOps" in first
    assert "  split [" in first
    assert second.startswith("decode_attention,")
    assert "CostFuse decided 1 region(s) differently from FuseOps" in second
    assert "  merged [" in second
    kernels = {ln.split()[0]: ln.split()[1] for ln in second.splitlines()
               if ln.split() and ln.split()[0] in ("tvm", "costfuse")}
    assert kernels["costfuse"] == "1" and int(kernels["tvm"]) > 1


def test_a_reshape_left_as_a_view_is_no_difference() -> None:
    from tvm_costfuse.config import FusionConfig
    from tvm_costfuse.partition import fuseops_groups
    from tvm_costfuse.report.decided import differences
    from tvm_costfuse.targets import preset

    mod = prepared("bert_layer")[0]
    graph = build_graph(mod)
    fuseops = fuseops_groups(mod)
    without_reshapes = [[n for n in g if not graph[n].reshape_like] for g in fuseops]
    assert without_reshapes != fuseops  # FuseOps does fuse reshapes into bert_layer's kernels
    assert differences(graph, preset("h100"), FusionConfig.resolve(), fuseops,
                       without_reshapes) == []


def test_differences_price_the_kernels_the_plan_priced() -> None:
    """A fused attention is priced whole, views included, as the plan prices it: stripped of
    its reshapes it was no attention to the cost model (the demo printed 5.0 -> 34.7 us, "a
    loss", for a kernel the plan had priced at 1.8 us)."""
    from tvm_costfuse.config import FusionConfig
    from tvm_costfuse.cost.analytical import estimate
    from tvm_costfuse.cost.extract import group_features
    from tvm_costfuse.models import corpus
    from tvm_costfuse.partition import fuseops_groups
    from tvm_costfuse.pipelines import prepare
    from tvm_costfuse.planner import plan_greedy
    from tvm_costfuse.report.decided import differences
    from tvm_costfuse.targets import preset

    mod = prepare(corpus.load("gpt2", small=True)[0])  # attention with views fused in
    graph = build_graph(mod)
    desc, config = preset("host"), FusionConfig.resolve()
    ours = [list(g) for g in plan_greedy(graph, desc, config).groups]
    planned = set(kernels_of(graph, ours))
    diffs = differences(graph, desc, config, fuseops_groups(mod), ours)
    assert diffs
    for d in diffs:
        assert set(d.costfuse) <= planned  # whole kernels of the plan, not their cores
        assert d.costfuse_s == pytest.approx(sum(
            estimate(group_features(graph, k), desc, config.register_budget).seconds
            for k in d.costfuse))
