"""Attention for one query row per head (``schedules/attention_decode.py``), a grouping only
CostFuse forms: a decode step's rotary, concat onto the KV cache, GQA repeat and transpose
computed inside the attention kernel. Differential checks against the unfused program and
NumPy over adversarial extents (a cache of one token, key rows a whole number of vectors and
one past it, head dims that are no whole number of vectors, GQA ratios 1-6, a long cache),
seeded random draws beside them; the kernel's structure on fixed AVX2 / AVX-512 targets; the
planner forms the group and prices it as this kernel."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import tvm
import tvm_ffi
from conftest import compacted, fused_kernel, kernels
from tvm import s_tir, tirx
from tvm_costfuse.schedules import Attention, attention, schedule_pass
from tvm_costfuse.schedules.attention import ATTENTION_CARD
from tvm_costfuse.schedules.classes import ScheduleClass

from tvm_costfuse import FusionConfig, build_graph, plan_greedy
from tvm_costfuse.cost.analytical import estimate
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.partition import ApplyPartition
from tvm_costfuse.pipelines import build_pipeline
from tvm_costfuse.targets import host, host_target
from tvm_costfuse.testing import attention_program
from tvm_costfuse.testing import decode_attention_program as _program

TARGET = host_target(2)
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})

# (kv heads, query heads per kv head, past tokens, head dim, rotary)
EDGES = [
    (1, 1, 1, 8, True),  # two keys, a head dim of half an AVX-512 vector
    (2, 6, 1023, 64, True),  # Qwen2-like: 1024 keys, a whole number of vectors
    (2, 6, 1024, 64, True),  # one key past it: the usual decode step
    (4, 2, 15, 16, False),  # 16 keys: the max and sum in vector partials
    (1, 3, 100, 80, True),  # head dim 80: five AVX-512 vectors, ten AVX2 ones
    (2, 1, 63, 40, True),  # head dim 40: no whole number of vectors on either ISA
    (1, 4, 7, 128, True),  # head dim 128: eight accumulator vectors
    (3, 2, 31, 24, True),
    (1, 1, 2000, 32, False),  # a long cache
]


def _draws(n: int, seed: int) -> list[tuple]:
    rng = random.Random(seed)
    return [(rng.choice((1, 2, 3)), rng.choice((1, 2, 3, 4, 6)), rng.randrange(1, 1500),
             rng.choice((8, 16, 24, 32, 40, 48, 64, 80, 96, 128)), rng.random() < 0.7)
            for _ in range(n)]


def _numpy(inputs: dict, group: int) -> np.ndarray:
    """The step without rotary (``rotary=False``): the new key and value appended."""
    q = inputs["q"].astype(np.float64)
    k = np.concatenate([inputs["cache_k"], inputs["k"]], axis=2).astype(np.float64)
    v = np.concatenate([inputs["cache_v"], inputs["v"]], axis=2).astype(np.float64)
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    sc = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]) + inputs["mask"]
    sc = np.exp(sc - sc.max(-1, keepdims=True))
    return (sc / sc.sum(-1, keepdims=True)) @ v


def _check(case: tuple) -> None:
    kv, group, past, d, rotary = case
    mod, inputs = _program(kv, group, past, d, rotary)
    everything = kernels(mod)
    with TARGET:
        assert Attention().apply(fused_kernel(mod, everything), TARGET, False) is not None
    fused = tvm.compile(mod, TARGET, relax_pipeline=build_pipeline(
        TARGET, ApplyPartition([everything]), schedule_pass(TARGET)))
    unfused = tvm.compile(mod, TARGET, relax_pipeline=build_pipeline(
        TARGET, None, schedule_pass(TARGET)))
    got, want = run(fused, inputs)[0], run(unfused, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=str(case))
    assert got.shape == (1, kv * group, 1, d)  # NumPy's own check: test_without_rotary...


@pytest.mark.parametrize("case", EDGES, ids=lambda c: "x".join(map(str, c)))
def test_fused_decode_attention_matches_the_unfused_program(case) -> None:
    _check(case)


@pytest.mark.parametrize("case", _draws(8, seed=30), ids=lambda c: "x".join(map(str, c)))
def test_random_decode_steps_match_the_unfused_program(case) -> None:
    _check(case)


def test_without_rotary_matches_numpy() -> None:
    mod, inputs = _program(2, 3, 37, 24, rotary=False)
    fused = tvm.compile(mod, TARGET, relax_pipeline=build_pipeline(
        TARGET, ApplyPartition([kernels(mod)]), schedule_pass(TARGET)))
    want = _numpy(inputs, 3)
    np.testing.assert_allclose(run(fused, inputs)[0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_one_parallel_loop_over_heads_reading_the_cache_in_place(target) -> None:
    mod, _ = _program(2, 6, 1024, 64)
    group = kernels(mod)
    assert group_features(build_graph(mod), group).schedule_on("cpu") == ScheduleClass.ATTENTION
    with target:
        sch = Attention().apply(fused_kernel(mod, group), target, False)
    assert sch is not None
    func = sch.mod["main"]
    loops = []
    tvm_ffi.structural_walk(func.body, (tirx.For, loops.append), order="pre")
    parallel = [lp for lp in loops if lp.kind == tirx.ForKind.PARALLEL]
    assert len(parallel) == 1 and int(parallel[0].extent) == 12  # the query heads
    lanes = 16 if target is AVX512 else 8
    assert lanes in {int(lp.extent) for lp in loops if lp.kind == tirx.ForKind.VECTORIZED}
    # no copy of the cache: each buffer, cut to what one iteration of its nest uses (as
    # lowering allocates it), holds at most one head's key row of partial sums
    sizes = {name: math.prod(shape) for name, (_, shape) in compacted(func).items()}
    assert sizes and max(sizes.values()) <= 1025 * lanes, sizes


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize(("past", "tail"), [(1024, True), (1023, False)])
def test_the_cache_row_max_and_sum_reduce_in_vector_partials(target, past, tail) -> None:
    """A step's keys are the cache and the new token, past + 1: a ragged row, whose max and
    sum once ran as scalar chains. Now vector partials over the whole vectors and a scalar
    tail block for the last key (``ragged.py``); 1024 keys need no tail."""
    mod, _ = _program(2, 6, past, 64)
    with target:
        sch = Attention().apply(fused_kernel(mod, kernels(mod)), target, False)
    assert sch is not None
    func = sch.mod["main"]
    names, vectorized = set(), set()
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: names.add(b.name_hint)))
    loops = []
    tvm_ffi.structural_walk(func.body, (tirx.For, loops.append), order="pre")
    for lp in loops:
        if lp.kind == tirx.ForKind.VECTORIZED:
            tvm_ffi.structural_walk(lp.body, (s_tir.SBlock, lambda b: vectorized.add(
                b.name_hint)))
    for stat in ("T_softmax_maxelem", "T_softmax_expsum"):
        assert f"{stat}_rf_update" in vectorized
        assert (f"{stat}_tail_update" in names) is tail


def test_planner_forms_one_attention_group_with_the_cache_copies() -> None:
    mod, _ = _program(2, 6, 1024, 64)
    graph = build_graph(mod)
    plan = plan_greedy(graph, host(2, calibration=False), FusionConfig())
    attention = [g for g in plan.groups
                 if group_features(graph, g).schedule_on("cpu") == ScheduleClass.ATTENTION]
    assert len(attention) == 1
    kinds = [graph[n].prim_func or "" for n in attention[0]]
    assert sum(k.startswith("matmul") for k in kinds) == 2
    assert sum(k.startswith("concatenate") for k in kinds) >= 2  # K and V read from the cache


def test_one_query_row_keeps_its_own_share(monkeypatch) -> None:
    """The attention card prices a prefill kernel's contractions at 0.85 of peak (what the
    per-head matmuls reach) and a decode step's, one query row per head, at 0.55: the decode
    kernel reaches far less than either (``schedules/attention.py``); the analytical model
    prices the decode step by that share."""
    def features(mod):
        f = group_features(build_graph(mod), kernels(mod))
        assert f.schedule_on("cpu") == ScheduleClass.ATTENTION
        return f

    decode = features(_program(2, 6, 1024, 64)[0])
    prefill = features(attention_program(1, 4, 64, 32)[0])
    for f, rows in ((decode, {1}), (prefill, {64})):  # the rows each kernel's geometry reads
        assert {w.geometry.gemm.m for w in f.op_work if w.contraction} == rows
    assert [ATTENTION_CARD.share(w, 16, 32) for w in decode.op_work if w.contraction] == [
        0.55, 0.55]
    assert [ATTENTION_CARD.share(w, 16, 32) for w in prefill.op_work if w.contraction] == [
        None, None]
    assert ATTENTION_CARD.contraction_rate("cpu", 1.0) == 0.85
    target = host(1, calibration=False)
    at_055 = estimate(decode, target).breakdown["compute"]
    monkeypatch.setattr(attention, "_ONE_ROW_SHARE", 0.85)
    assert estimate(decode, target).breakdown["compute"] < at_055
