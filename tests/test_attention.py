"""The fused attention kernel (``schedules/attention.py``): numerics against the unfused
program and NumPy (plain, masked and causal forms; ragged sequence lengths; key rows longer
than L1 holds), its structure on fixed AVX2 / AVX-512 targets, the groups it declines (key
rows past ``MAX_KEYS`` among them), and that the planner forms the group (FuseOps cannot)
and prices it as this kernel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
import tvm_ffi
from conftest import compacted, fused_kernel, kernels
from tvm import relax, s_tir, tirx
from tvm_costfuse.schedules import Attention, schedule_pass
from tvm_costfuse.schedules.attention import (
    _ROW_BUFFERS,
    MAX_KEYS,
    ROW_BLOCK_BYTES,
    key_tile_vectors,
)
from tvm_costfuse.schedules.classes import ScheduleClass

from tvm_costfuse import FusionConfig, build_graph, plan_greedy
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.partition import ApplyPartition
from tvm_costfuse.pipelines import build_pipeline, prepare
from tvm_costfuse.targets import host, host_target
from tvm_costfuse.testing import attention_program as _program

TARGET = host_target(2)
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
F32 = "float32"


def _numpy(inputs: dict, form: str) -> np.ndarray:
    q, k, v = (inputs[n].astype(np.float64) for n in "qkv")
    sc = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if form == "masked":
        sc = sc + inputs["mask"]
    elif form == "transposed_bias":
        sc = sc + np.swapaxes(inputs["bias"], -1, -2)
    elif form == "causal":
        sc = np.where(np.tril(np.ones(sc.shape[-2:], bool)), sc, -1e4)
    sc = np.exp(sc - sc.max(-1, keepdims=True))
    return (sc / sc.sum(-1, keepdims=True)) @ v


def _matches_unfused_and_numpy(mod, inputs, group, form) -> None:
    """``group`` built as one kernel on this host matches the unfused build and NumPy."""
    fused = tvm.compile(mod, TARGET, relax_pipeline=build_pipeline(
        TARGET, ApplyPartition([group]), schedule_pass(TARGET)))
    unfused = tvm.compile(mod, TARGET, relax_pipeline=build_pipeline(
        TARGET, None, schedule_pass(TARGET)))
    got, want = run(fused, inputs)[0], run(unfused, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, _numpy(inputs, form), rtol=1e-4, atol=1e-5)


def _scheduled(func, target):
    with target:
        return Attention().apply(func, target, False)


def _loops(func) -> list[tirx.For]:
    found = []
    tvm_ffi.structural_walk(func.body, (tirx.For, found.append), order="pre")
    return found


@pytest.mark.parametrize(("shape", "form"), [
    ((1, 2, 16, 16), "plain"),
    ((1, 2, 16, 16), "masked"),
    ((1, 2, 16, 16), "causal"),
    ((2, 3, 7, 16), "masked"),  # fewer keys than a vector; batch 2
    ((1, 2, 197, 32), "causal"),  # ViT's 197 tokens: ragged row blocks and key vectors
    ((1, 2, 128, 64), "plain"),  # BERT's 128 tokens and head dim, 2 of its 12 heads
    ((1, 1, 3, 8), "causal"),  # rows and head dim below one register tile
    ((1, 2, 128, 64), "transposed_bias"),  # DeBERTa: a bias read [key, row] by the softmax
    ((1, 2, 37, 16), "transposed_bias"),  # the same, ragged rows and keys
    ((1, 1, 49, 32), "masked"),  # Swin's 7 x 7 windows: one key past whole vectors
])
def test_fused_kernel_matches_the_unfused_program(shape, form) -> None:
    mod, inputs = _program(*shape, form)
    group = kernels(mod)
    assert _scheduled(fused_kernel(mod, group), TARGET) is not None  # this host's rule applies
    _matches_unfused_and_numpy(mod, inputs, group, form)


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("form", ["masked", "causal"])
def test_one_parallel_row_block_loop_with_local_buffers_and_vectors(target, form) -> None:
    mod, _ = _program(1, 12, 197, 64, form)
    group = kernels(mod)
    assert group_features(build_graph(mod), group).schedule_on("cpu") == ScheduleClass.ATTENTION
    assert ScheduleClass.ATTENTION in Attention.classes
    sch = _scheduled(fused_kernel(mod, group), target)
    assert sch is not None
    func = sch.mod["main"]
    loops = _loops(func)
    parallel = [lp for lp in loops if lp.kind == tirx.ForKind.PARALLEL]
    # the K^T transpose is a streamed pass of its own; the rest one loop over the 12 heads,
    # the ragged row blocks of 197 rows serial inside it, the last one to be peeled off
    assert len(parallel) == 2
    heads = parallel[-1]
    assert int(heads.extent) == 12
    inner = _loops(heads)
    assert any("pragma_loop_partition_hint" in lp.annotations and int(lp.extent) > 1
               and lp.kind == tirx.ForKind.SERIAL for lp in inner[1:])
    vectors = {int(lp.extent) for lp in inner if lp.kind == tirx.ForKind.VECTORIZED}
    lanes = 16 if target is AVX512 else 8
    assert lanes in vectors  # scores, exp and partials along the keys
    assert any(v % lanes == 0 and v <= 64 for v in vectors)  # the P V output tile
    local = {}
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: local.update(
        {buf.name: buf.scope() for buf in b.alloc_buffers})))
    scores = [n for n in local if n.startswith("matmul_intermediate") and "_1" not in n]
    assert scores and all(local[n] == "local" for n in scores)  # the scores never reach memory
    assert all(local[n] == "local" for n in local if "softmax" in n)
    # P V reads P from the row block's buffer: formed per read, it cost a multiply and a
    # broadcast per row and key in the FMA loop
    blocks = {}
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: blocks.update({b.name_hint: b})))
    pv = next(b for n, b in blocks.items() if n.startswith("matmul1") and n.endswith("update"))
    probabilities = [r.source.name for r in pv.reads if "softmax" in r.source.name]
    assert len(probabilities) == 1 and local[probabilities[0]] == "local"
    writer = next(n for n, b in blocks.items()
                  if any(w.source.name == probabilities[0] for w in b.writes))
    in_vectors = set()
    for lp in loops:
        if lp.kind == tirx.ForKind.VECTORIZED:
            tvm_ffi.structural_walk(lp.body, (s_tir.SBlock, lambda b: in_vectors.add(
                b.name_hint)))
    assert writer in in_vectors  # P is written a vector at a time


@pytest.mark.parametrize(("shape", "form", "rows"), [
    ((1, 2, 2048, 64), "plain", 128),  # 128 queries against 2048 keys, 2 heads
    ((1, 1, 2048, 32), "masked", 100),  # a ragged last row block
    ((1, 1, 2048, 64), "causal", None),  # every query row of a 2048-token causal head
    ((1, 2, 49, 32), "plain", 200),  # SegFormer: many queries against a short ragged key row
    ((1, 1, 33, 16), "masked", 70),
])
def test_long_key_rows_match_the_unfused_program(shape, form, rows) -> None:
    """Key rows longer than L1 holds (the rule declined them once): the row block's buffers
    sit in L2, the softmax still exact; and many queries against a short ragged key row
    (the scores tile narrowed to leave one key scalar)."""
    mod, inputs = _program(*shape, form, rows=rows)
    group = kernels(mod)
    assert group_features(build_graph(mod), group).schedule_on("cpu") == ScheduleClass.ATTENTION
    assert _scheduled(fused_kernel(mod, group), TARGET) is not None
    _matches_unfused_and_numpy(mod, inputs, group, form)


@pytest.mark.parametrize(("keys", "rows", "form"), [
    (17, 5, "masked"),  # two vectors of 8 and one key: AVX2's shortest split row
    (33, 9, "causal"),  # two vectors of 16 and one key: AVX-512's
    (47, 12, "transposed_bias"),  # a bias read [key, row], 15 keys past two vectors of 16
    (65, 3, "plain"),  # rows fewer than a register tile
    (20, 6, "masked"),  # two vectors of 8 and four keys; past one of 16, short of two
])
def test_ragged_key_rows_split_into_whole_vectors_and_a_tail(keys, rows, form) -> None:
    """Adversarial key counts around two vectors of this host's lanes: the row max and row
    sum as vector partials over the whole vectors and a scalar tail (``ragged.py``), the
    softmax exact against the unfused program and NumPy."""
    mod, inputs = _program(1, 2, keys, 16, form, rows=rows)
    group = kernels(mod)
    assert _scheduled(fused_kernel(mod, group), TARGET) is not None
    _matches_unfused_and_numpy(mod, inputs, group, form)


def _blocks_in_vectors(func) -> set[str]:
    found: set[str] = set()
    for lp in _loops(func):
        if lp.kind == tirx.ForKind.VECTORIZED:
            tvm_ffi.structural_walk(lp.body, (s_tir.SBlock, lambda b: found.add(b.name_hint)))
    return found


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize(("keys", "split"), [(197, True), (49, True), (128, False)])
def test_ragged_rows_reduce_in_vector_partials(target, keys, split) -> None:
    """The row max and sum of a ragged key row reduce in vector partials (rfactor) over the
    whole vectors, then a scalar tail block folds in the last keys; a row of whole vectors
    has no tail. Before the split, a ragged row's max and sum were scalar chains: 197 keys
    ran the kernel 1.23x its time with the split (znver4, docs/log/2026-12-07e.md)."""
    mod, _ = _program(1, 2, keys, 32, "masked", rows=24)
    sch = _scheduled(fused_kernel(mod, kernels(mod)), target)
    assert sch is not None
    func = sch.mod["main"]
    names = set()
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: names.add(b.name_hint)))
    vectorized = _blocks_in_vectors(func)
    for stat in ("T_softmax_maxelem", "T_softmax_expsum"):
        partials = {n for n in names if n.startswith(stat + "_rf")}
        assert partials and partials <= vectorized
        assert any(n.startswith(stat + "_tail") for n in names) is split


@pytest.mark.parametrize(("keys", "lanes", "rows", "vectors"), [
    (49, 16, 8, 1),  # tiles of 32 keys leave 17 scalar, of 16 one
    (48, 16, 8, 2),  # whole vectors: the widest tile the register budget allows
    (128, 16, 8, 2),
    (128, 16, 4, 4),  # fewer rows per tile: room for 4 vectors
    (197, 16, 4, 4),  # every width leaves 5: the widest
    (100, 16, 4, 2),  # tiles of 64 leave 36, of 32 four
    (49, 8, 4, 2),  # tiles of 32 leave 17, of 16 and 8 one: the wider
    (7, 16, 8, 1),  # shorter than a vector
])
def test_the_scores_tile_leaves_the_fewest_keys_scalar(keys, lanes, rows, vectors) -> None:
    assert key_tile_vectors(keys, lanes, rows=rows, budget=24) == vectors


@pytest.mark.parametrize(("target", "tile_rows"), [(AVX2, 2), (AVX512, 4)],
                         ids=["avx2", "avx512"])
def test_long_rows_keep_blocks_of_register_tiles_in_the_l2_share(target, tile_rows) -> None:
    """At 4096 keys the row block still holds several P V register tiles (K^T and V are
    streamed once per block), its scores and exp buffers within ROW_BLOCK_BYTES."""
    heads, keys = 4, 4096
    mod, _ = _program(1, heads, keys, 64, "causal")
    sch = _scheduled(fused_kernel(mod, kernels(mod)), target)
    assert sch is not None
    func = sch.mod["main"]
    buffers = compacted(func)
    row_block = {n: shape for n, (scope, shape) in buffers.items()
                 if scope == "local" and shape[-1] == keys}
    assert {"matmul_intermediate_local", "T_softmax_exp_local"} <= set(row_block)
    (rows,) = {shape[-2] for shape in row_block.values()}
    assert rows == 4 * tile_rows  # _MAX_SUBTILES register tiles: 8 rows (AVX2), 16 (AVX-512)
    assert _ROW_BUFFERS * 4 * rows * keys <= ROW_BLOCK_BYTES
    parallel = [lp for lp in _loops(func) if lp.kind == tirx.ForKind.PARALLEL]
    assert int(parallel[-1].extent) == heads * keys // rows  # heads x row blocks


def test_key_rows_past_the_limit_are_declined() -> None:
    for keys, applies in ((MAX_KEYS, True), (MAX_KEYS + 128, False)):
        mod, _ = _program(1, 1, keys, 16, "plain", rows=8)
        group = kernels(mod)
        assert group_features(build_graph(mod), group).attention is applies
        assert (_scheduled(fused_kernel(mod, group), AVX512) is not None) is applies


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_whole_row_blocks_join_the_parallel_loop(target) -> None:
    mod, _ = _program(1, 12, 128, 64, "masked")
    sch = _scheduled(fused_kernel(mod, kernels(mod)), target)
    assert sch is not None
    parallel = [lp for lp in _loops(sch.mod["main"]) if lp.kind == tirx.ForKind.PARALLEL]
    assert len(parallel) == 2 and int(parallel[-1].extent) % 12 == 0
    assert int(parallel[-1].extent) > 12  # heads x row blocks


def test_rows_shorter_than_a_register_tile_and_the_cuda_class() -> None:
    mod, _ = _program(1, 1, 3, 8, "plain")
    group = kernels(mod)
    f = group_features(build_graph(mod), group)
    assert f.schedule_on("cpu") == "attention" and f.schedule_on("cuda") == "fallback"
    assert _scheduled(fused_kernel(mod, group), AVX512) is not None


def test_softmax_over_the_rows_is_no_attention() -> None:
    """Normalized over the query axis, P V's reduction axis is not the softmax's: the row
    block would need every row's scores. Neither the features nor the rule take it (8
    queries against 16 keys: on square scores the graph alone cannot tell the axes apart,
    the rule still can)."""
    mod, _ = _program(1, 2, 16, 16, "plain", softmax_axis=-2, rows=8)
    group = kernels(mod)
    assert not group_features(build_graph(mod), group).attention
    assert _scheduled(fused_kernel(mod, group), AVX2) is None


def _neither_features_nor_rule_take(emit, a_shape, b_shape) -> None:
    """``emit(bb, a, b)`` builds the group's output from two inputs; neither the features nor
    the attention rule call it attention."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(a_shape, F32))
    b = relax.Var("b", relax.TensorType(b_shape, F32))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(emit(bb, a, b))
        bb.emit_func_output(out)
    mod = prepare(bb.get())
    group = kernels(mod)
    assert not group_features(build_graph(mod), group).attention
    assert _scheduled(fused_kernel(mod, group), AVX512) is None


def test_softmax_of_input_scores_over_the_rows_is_declined() -> None:
    """The scores an input, normalized over the query axis: the softmax reads the input with
    its reduction var on the rows. Inputs are not judged by their layout (a bias read
    transposed is fine), yet neither the features nor the rule take this one."""
    _neither_features_nor_rule_take(
        lambda bb, s, v: relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-2)), v),
        (1, 2, 8, 16), (1, 2, 16, 16))


def _rotary_program(heads: int, seq: int, d: int):
    """A llama-style prefill attention: the rotary embedding of Q and K
    (``x * cos + rotate_half(x) * sin``) computed in the group, K read transposed by the
    scores; with its inputs."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((1, heads, seq, d), F32)) for n in "qkv")
    cos = relax.const(np.cos(rng.standard_normal((1, 1, seq, d))).astype(F32))
    sin = relax.const(np.sin(rng.standard_normal((1, 1, seq, d))).astype(F32))
    op = relax.op

    def rotary(x):
        half = [op.negative(op.strided_slice(x, [3], [d // 2], [d])),
                op.strided_slice(x, [3], [0], [d // 2])]
        return op.add(op.multiply(x, cos), op.multiply(op.concat(half, axis=3), sin))

    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            scores = op.matmul(rotary(q), op.permute_dims(rotary(k), [0, 1, 3, 2]))
            p = op.nn.softmax(op.multiply(scores, relax.const(1 / math.sqrt(d), F32)), axis=-1)
            out = bb.emit_output(bb.emit(op.matmul(p, v)))
        bb.emit_func_output(out)
    inputs = {n: rng.standard_normal((1, heads, seq, d)).astype(F32) for n in "qkv"}
    return prepare(bb.get()), inputs


def test_rotary_k_is_packed_reading_whole_vectors() -> None:
    """K's rotary computed as K^T is packed: vectorized along the head dim, so its four loads
    (K at d and d +- half, cos, sin) are whole vectors and its one store scatters; along the
    keys each load was a gather (llama's fused attention ran 1.42x slower alone,
    docs/log/2026-12-07e.md). Exact against the unfused program on this host."""
    mod, inputs = _rotary_program(2, 40, 32)
    group = kernels(mod)
    for target in (AVX2, AVX512):
        sch = _scheduled(fused_kernel(mod, group), target)
        assert sch is not None
        checked = []
        for lp in _loops(sch.mod["main"]):
            if lp.kind != tirx.ForKind.VECTORIZED:
                continue

            def visit(realize, lane=lp.loop_var, out=checked):
                bound = [iv.var for iv, v in zip(realize.block.iter_vars, realize.iter_values)
                         if any(x.same_as(lane) for x in _vars(v))]
                loads = []
                tvm_ffi.structural_walk(realize.block.body, (tvm.ir.expr.TensorLoad,
                                                             loads.append))
                for ld in loads:
                    if ld.source.name == "k" and bound:
                        out.append(any(x.same_as(bound[0]) for x in _vars(ld.indices[-1])))

            tvm_ffi.structural_walk(lp.body, (s_tir.SBlockRealize, visit))
        assert checked and all(checked)  # every vector of K's loads along its last axis
    fused = tvm.compile(mod, TARGET, relax_pipeline=build_pipeline(
        TARGET, ApplyPartition([group]), schedule_pass(TARGET)))
    unfused = tvm.compile(mod, TARGET, relax_pipeline=build_pipeline(
        TARGET, None, schedule_pass(TARGET)))
    np.testing.assert_allclose(run(fused, inputs)[0], run(unfused, inputs)[0],
                               rtol=1e-4, atol=1e-5)


def _vars(expr) -> list:
    found: list = []
    tvm_ffi.structural_walk(expr, (tirx.Var, found.append))
    return found


def test_transposed_bias_is_attention_for_features_and_rule() -> None:
    mod, _ = _program(1, 2, 64, 32, "transposed_bias")
    group = kernels(mod)
    assert group_features(build_graph(mod), group).attention
    assert _scheduled(fused_kernel(mod, group), AVX512) is not None


def test_two_matmuls_without_a_softmax_are_no_attention() -> None:
    _neither_features_nor_rule_take(
        lambda bb, x, w: relax.op.matmul(
            bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(x, w)))), w),
        (1, 2, 16, 16), (1, 2, 16, 16))


def test_a_second_output_is_declined() -> None:
    """The probabilities read outside the group as well (``output_attentions``): the rule
    would have to store them, so it declines and the features do not call it attention."""
    mod, _ = _program(1, 2, 16, 16, "plain", probs_out=True)
    group = kernels(mod)
    f = group_features(build_graph(mod), group)
    assert f.n_outputs == 2 and not f.attention
    assert _scheduled(fused_kernel(mod, group), AVX512) is None


@pytest.mark.parametrize("name", ["attention", "bert_layer", "gpt2_block"])
def test_planner_forms_the_attention_group(name) -> None:
    from conftest import prepared

    graph = build_graph(prepared(name)[0])
    plan = plan_greedy(graph, host(2, calibration=False), FusionConfig())
    attention = [g for g in plan.groups
                 if group_features(graph, g).schedule_on("cpu") == ScheduleClass.ATTENTION]
    assert len(attention) == 1
    kinds = [graph[n].prim_func or "" for n in attention[0]]
    assert sum(k.startswith("matmul") for k in kinds) == 2 and "softmax" in kinds


@pytest.mark.parametrize("name", ["bert", "vit_b_16", "gpt2"])
def test_corpus_attention_is_one_kernel_per_layer(name) -> None:
    """The imported (torch.export) forms: batch matmuls over merged heads with reshape views
    between them and the 4-D softmax; one attention group per layer, scores included."""
    from tvm_costfuse.models import corpus

    mod, _, _ = corpus.load(name, small=True)
    graph = build_graph(prepare(mod, TARGET))
    plan = plan_greedy(graph, host(2, calibration=False), FusionConfig())
    attention = [g for g in plan.groups
                 if group_features(graph, g).schedule_on("cpu") == ScheduleClass.ATTENTION]
    softmaxes = [n for n in graph.nodes if (n.prim_func or "").startswith("softmax")]
    assert softmaxes and len(attention) == len(softmaxes)
    for g in attention:
        assert group_features(graph, g).n_contractions == 2


def test_only_accesses_moving_along_both_loops_vote_on_the_vector_axis() -> None:
    """``reads_along``: a transpose computing along its read axis swaps (K's rotary); a
    plain transpose (one load, one store) and a row with broadcast operands keep the write's
    axis, where their vectors are whole on both sides or cost nothing."""
    from tvm.script import tirx as T
    from tvm_costfuse.schedules.attention_roles import reads_along

    @T.prim_func(s_tir=True)
    def rotary_t(x: T.Buffer((8, 32), "float32"), c: T.Buffer((8, 32), "float32"),
                 y: T.Buffer((32, 8), "float32")):
        for d, s in T.grid(32, 8):
            with T.sblock("y"):
                vd, vs = T.axis.remap("SS", [d, s])
                y[vd, vs] = x[vs, vd] * c[vs, vd] + x[vs, vd]

    @T.prim_func(s_tir=True)
    def transpose(x: T.Buffer((8, 32), "float32"), y: T.Buffer((32, 8), "float32")):
        for d, s in T.grid(32, 8):
            with T.sblock("y"):
                vd, vs = T.axis.remap("SS", [d, s])
                y[vd, vs] = x[vs, vd]

    @T.prim_func(s_tir=True)
    def broadcast(a: T.Buffer((8, 32), "float32"), g: T.Buffer((8,), "float32"),
                  b: T.Buffer((8,), "float32"), y: T.Buffer((8, 32), "float32")):
        for i, j in T.grid(8, 32):
            with T.sblock("y"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = a[vi, vj] * g[vi] + b[vi] - g[vi]

    for func, swapped in ((rotary_t, True), (transpose, False), (broadcast, False)):
        sch = s_tir.Schedule(func)
        block = sch.get_sblock("y")
        before = [sch.get(lp).loop_var.name for lp in sch.get_loops(block)]
        reads_along(sch, block)
        after = [sch.get(lp).loop_var.name for lp in sch.get_loops(block)]
        assert (after == before[::-1]) is swapped and sorted(after) == sorted(before)
