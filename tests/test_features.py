"""Group features: which schedule class a group lands in per target, the CPU launch cost that
follows from it, and rows that re-price exactly as the planner priced them."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import prepared
from tvm_costfuse.schedules.catalog import card_of

from tvm_costfuse import models
from tvm_costfuse.cost.analytical import estimate, last_level_cache, launch_seconds
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.cost.features import GroupFeatures, OpWork
from tvm_costfuse.graph import build_graph
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.records.database import GroupDatabase
from tvm_costfuse.targets import host, preset
from tvm_costfuse.tuning.feedback import feature_row

HOST = host(num_cores=2, calibration=False)
H200 = preset("h200")


def _graph(name: str):
    return build_graph(prepared(name)[0])


def test_transpose_prologue_is_a_contraction_on_cuda_and_streamed_on_cpu() -> None:
    g = _graph("attention")  # K^T = permute_dims(k) feeds the scores matmul
    f = group_features(g, ["permute_dims", "matmul"])
    assert f.prologue_ops == 1 and f.prologue_compute == 0 and f.tuple_items == 0
    assert f.schedule == "contraction+prologue"
    assert f.schedule_on("cuda") == "contraction"
    assert f.schedule_on("cpu") == "contraction+stream"


def test_split_epilogue_falls_back_but_batch_norm_epilogue_does_not() -> None:
    gpt2 = _graph("gpt2_block")
    split = ["matmul", "add", "split", "split_0", "split_1", "split_2"]
    f = group_features(gpt2, split)
    assert f.tuple_items == 2  # three elements of one tuple read after the contraction
    assert f.schedule_on("cuda") == f.schedule_on("cpu") == "fallback"
    mod, _ = models.load("conv_bn_relu", small=True)
    conv = build_graph(prepare(mod, fold=False))  # the batch norm as the importer left it
    f = group_features(conv, ["conv2d", "batch_norm", "bn", "relu"])
    assert f.tuple_items == 0  # batch_norm's moving mean/var outputs are never read
    assert f.reshaping_ops == 0  # batch_norm computes: an elementwise epilogue, not a reshape
    assert f.schedule_on("cpu") == f.schedule_on("cuda") == "contraction"
    folded = group_features(_graph("conv_bn_relu"), ["conv2d", "bn", "relu"])  # a bias add
    assert folded.schedule_on("cpu") == folded.schedule_on("cuda") == "contraction"
    assert folded.flops < f.flops  # a bias add, not a batch norm per element


def test_transpose_epilogue_keeps_the_tile_on_cuda_but_falls_back_on_cpu() -> None:
    g = _graph("bert_layer")
    f = group_features(g, ["matmul", "add", "reshape", "permute_dims1"])
    assert f.reshaping_ops == 2 and f.schedule == "contraction+reshape"
    assert f.schedule_on("cuda") == "contraction"
    assert f.schedule_on("cpu") == "fallback"


def test_computing_prologue_stays_in_the_fallback_on_cuda() -> None:
    g = _graph("conv_bn_relu")
    f = dataclasses.replace(group_features(g, ["conv2d"]), prologue_ops=1, prologue_compute=1)
    assert f.schedule_on("cuda") == "fallback"
    assert f.schedule_on("cpu") == "contraction+stream"


def test_cpu_launch_pays_the_thread_pool_per_parallel_nest_only() -> None:
    f = group_features(_graph("rmsnorm"), ["add"])
    serial = dataclasses.replace(f, op_work=(OpWork(False, 100.0, 100),))
    parallel = dataclasses.replace(f, op_work=(OpWork(False, 1e6, 1 << 20),))
    elementwise, stream = card_of("elementwise"), card_of("contraction+stream")
    assert launch_seconds(serial, HOST, elementwise) == HOST.launch_s_serial
    assert launch_seconds(parallel, HOST, elementwise) == HOST.launch_s
    pool = HOST.launch_s - HOST.launch_s_serial
    two = launch_seconds(parallel, HOST, stream)
    assert abs(two - (HOST.launch_s_serial + 2 * pool)) < 1e-12
    assert launch_seconds(parallel, H200, elementwise) == H200.launch_s


def test_rows_reprice_exactly_after_a_round_trip(tmp_path) -> None:
    g = _graph("gpt2_block")
    members = ["matmul2", "permute_dims5", "reshape3"]
    row = feature_row("gpt2_block@small", g, members)
    db = GroupDatabase(tmp_path)
    db.append_row({**row, "workload_hash": "x", "run_secs": [1e-6], "measured": True,
                   "error": None, "target": "llvm"})
    back = GroupFeatures.from_row(GroupDatabase(tmp_path).rows()[0])
    f = group_features(g, members)
    assert back == f
    assert estimate(back, HOST).seconds == estimate(f, HOST).seconds
    # A row written before the context existed still loads (context fields take defaults).
    old = {k: v for k, v in row.items() if k != "context"}
    assert GroupFeatures.from_row(old).vector() == f.vector()


def test_rewrite_rows_replaces_the_log_atomically(tmp_path) -> None:
    db = GroupDatabase(tmp_path)
    for i in range(3):
        db.append_row({"model": "m", "members": [f"op{i}"], "workload_hash": str(i),
                       "run_secs": [1.0], "measured": True})
    rows = db.rows()
    db.rewrite_rows([{**r, "features": [float(i)]} for i, r in enumerate(rows)])
    again = GroupDatabase(tmp_path).rows()
    assert [r["features"] for r in again] == [[0.0], [1.0], [2.0]]
    assert not list(tmp_path.glob("*.tmp"))


def test_cpu_reduction_class_agrees_with_the_row_reduction_rule() -> None:
    """Every candidate reduction group of two small synthetic programs, plus a layer norm with
    its head split and transpose, and a reduction whose squared input is also an output: the
    features say
    ``reduction`` on CPU exactly when our row-reduction rule schedules the fused kernel (a
    second output or a transpose after the reduction makes the rule decline: fallback)."""
    from tvm_costfuse.schedules.cpu import Contraction, RowReduction

    from tvm_costfuse import FusionConfig, models
    from tvm_costfuse.pipelines import prepare
    from tvm_costfuse.targets import host_target
    from tvm_costfuse.tuning.feedback import candidate_groups, group_kernel_and_outputs

    target = host_target(2)
    seen = set()
    for name in ("synth-24", "synth-8"):  # sequence programs, (1, 32, 64) and (1, 128, 64)
        mod = prepare(models.load(name)[0], target)
        g = build_graph(mod)
        extra = {"synth-8": [["layer_norm", "reshape", "permute_dims2"]],  # a transposed norm
                 "synth-24": [["mul2", "mul3", "square2", "mean2"]]}[name]  # mul3 read outside
        for members in candidate_groups(g, HOST, FusionConfig()) + extra:
            f = group_features(g, members)
            if f.schedule != "reduction" or len(members) < 2:
                continue
            try:
                func, _ = group_kernel_and_outputs(mod, g, members)
            except ValueError:  # not convex: no kernel to schedule
                continue
            assert Contraction().apply(func, target, False) is None
            takes = RowReduction().apply(func, target, False) is not None
            assert (f.schedule_on("cpu") == "reduction") == takes, (name, members)
            assert f.schedule_on("cuda") == "reduction"
            seen.add((takes, f.n_outputs > 1, f.moves_after_reduction > 0))
    assert {(True, False, False), (False, True, False), (False, False, True)} <= seen


def test_math_work_makes_a_cpu_kernel_slower_and_leaves_cuda_as_it_was() -> None:
    g = _graph("elementwise_chain")
    cos, add = group_features(g, ["cos"]), group_features(g, ["add"])
    assert cos.math > 0 and add.math == 0
    assert group_features(g, ["cos", "add"]).math == cos.math
    no_math = dataclasses.replace(
        cos, math=0.0, op_work=tuple(w._replace(math=0.0) for w in cos.op_work))
    assert estimate(cos, HOST).breakdown["compute"] > estimate(no_math, HOST).breakdown["compute"]
    assert estimate(cos, H200).seconds == estimate(no_math, H200).seconds
    # The math term is the host's exp (``TargetDesc.exp_seconds``) times the exp-equivalents.
    terms = {}
    for exp_s in (1e-10, 3e-10):
        host = dataclasses.replace(HOST, math_s=exp_s)
        terms[exp_s] = (estimate(cos, host).breakdown["compute"]
                        - estimate(no_math, host).breakdown["compute"])
    cores = HOST.cores
    assert terms[1e-10] == pytest.approx(cos.math * 1e-10 / cores, rel=0.5)
    assert terms[3e-10] == pytest.approx(3 * terms[1e-10])


def test_nested_math_calls_are_priced_as_the_libm_calls_they_stay() -> None:
    """Fused, elementwise_chain's sigmoid -> log -> tanh... nest: only the innermost call is
    vectorized (``fast_math.MAX_NESTED``), the rest cost NESTED_CALL_FACTOR times more."""
    from tvm_costfuse.schedules.math_calls import NESTED_CALL_FACTOR

    graph = build_graph(prepared("elementwise_chain")[0])
    chain = [n.name for n in graph.nodes[:3]]  # sigmoid -> add -> log
    sigmoid, add, log = (graph[n] for n in chain)
    assert sigmoid.math and not add.math and log.math
    for n in (sigmoid, log):
        assert group_features(graph, [n.name]).math == n.math
    assert group_features(graph, chain).math == sigmoid.math + NESTED_CALL_FACTOR * log.math


def test_weights_stream_from_dram_when_the_model_s_weights_overflow_the_cache() -> None:
    """A 2 MiB weight fits the last-level cache alone, but among 300 MB of weights every call
    of the model reads it from DRAM again; the other operands keep their tiers."""
    g = _graph("gpt2_block")
    name = next(n.name for n in g.nodes if n.kind == "call_tir" and n.geometry is not None
                and any(i.startswith("%const") for i in n.inputs))
    f = group_features(g, [name])
    assert f.constant_sizes and set(f.constant_sizes) <= set(f.boundary_sizes)
    llc = last_level_cache(HOST)[0]
    small = dataclasses.replace(f, module_constant_bytes=llc // 4)
    large = dataclasses.replace(f, module_constant_bytes=4 * llc)
    memory = estimate(small, HOST).breakdown["memory"], estimate(large, HOST).breakdown["memory"]
    weights = sum(f.constant_sizes)
    cached = estimate(dataclasses.replace(small, boundary_sizes=tuple(f.constant_sizes)),
                      HOST).breakdown["memory"]  # the weights alone, at their own tier
    assert memory[1] > memory[0]
    # only the weights move: their DRAM time replaces their cached time, nothing else changes
    assert abs((memory[1] - memory[0]) - (weights / HOST.dram_bw - cached)) < 1e-12
