"""The channel chain (``schedules/chain.py``): a 1x1 conv feeding a depthwise conv in one
kernel tiled over channel blocks, a grouping only CostFuse forms. Differential checks against
the unfused program over adversarial extents (1x1 and odd images, strides 2, channel counts no
block divides, batch 2, 5x5 and 7x7 windows, no padding, SiLU / ReLU6 / no activation) and
seeded random draws; the kernel's structure on fixed AVX2 / AVX-512 targets; the card claims
what the rule takes, and the planner forms the group."""

from __future__ import annotations

import random

import numpy as np
import pytest
import tvm
import tvm_ffi
from conftest import fused_kernel, kernels
from tvm import s_tir, tirx
from tvm_costfuse.schedules import schedule_pass
from tvm_costfuse.schedules.chain import ChannelChain
from tvm_costfuse.schedules.classes import ScheduleClass

from tvm_costfuse import FusionConfig, build_graph, plan_greedy
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.partition import ApplyPartition
from tvm_costfuse.pipelines import build_pipeline
from tvm_costfuse.targets import host, host_target
from tvm_costfuse.testing import channel_chain_program

TARGET = host_target(2)
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})

# (batch, channels, expanded, height, width, kernel, stride, padding, activation)
EDGES = [
    (1, 2, 8, 1, 1, 3, 1, 1, "relu6"),  # a 1x1 image: every tap but the centre is padding
    (1, 3, 6, 2, 3, 3, 2, 1, "silu"),  # smaller than one vector, stride 2
    (1, 4, 13, 7, 7, 3, 1, 1, "relu6"),  # 13 channels: no block of several divides them
    (2, 8, 24, 9, 11, 3, 2, 1, "silu"),  # batch 2, odd and unequal sides, stride 2
    (1, 16, 96, 17, 17, 5, 2, 2, "relu6"),  # 5x5, stride 2, odd side
    (1, 5, 40, 12, 12, 3, 1, 0, "relu6"),  # no padding: the activation writes the plane
    (1, 8, 16, 33, 33, 3, 1, 1, "none"),  # a bias alone between the convolutions
    (1, 6, 12, 16, 16, 7, 1, 3, "silu"),  # 7x7
    (1, 24, 144, 56, 56, 3, 1, 1, "relu6"),  # MobileNetV2's third block
    (1, 16, 96, 112, 112, 3, 2, 1, "silu"),  # its second: a deinterleaved plane, blocks of 8
    (2, 12, 24, 14, 14, 3, 2, 1, "relu6"),  # batch 2 with a deinterleaved plane
    (1, 4, 16, 30, 30, 3, 2, 1, "silu"),  # a 32-wide plane row: unrolled on AVX-512
    (1, 6, 20, 6, 6, 3, 2, 1, "relu6"),  # an 8-wide plane row: unrolled on AVX2
    (1, 3, 1, 14, 14, 3, 1, 1, "silu"),  # one expanded channel: declined by both
]


def _draws(n: int, seed: int) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.choice((3, 3, 5))
        out.append((rng.choice((1, 1, 2)), rng.randrange(2, 40), rng.randrange(1, 70),
                    rng.randrange(1, 40), rng.randrange(1, 40), k, rng.choice((1, 2)),
                    rng.choice((k // 2, k // 2, 0)), rng.choice(("relu6", "silu", "none"))))
    return [c for c in out if c[3] + 2 * c[7] >= c[5] and c[4] + 2 * c[7] >= c[5]]


def _check(case: tuple) -> None:
    batch, channels, expanded, height, width, k, stride, padding, act = case
    mod, inputs = channel_chain_program(batch, channels, expanded, height, width, k, stride,
                                        padding, act)
    everything = kernels(mod)
    with TARGET:
        taken = ChannelChain().apply(fused_kernel(mod, everything), TARGET, False) is not None
    claimed = group_features(build_graph(mod), everything).schedule_on("cpu")
    # the card claims what the rule takes; both take every pair with an output image of more
    # than one row and column and more than one channel (a unit axis leaves the depthwise
    # conv no row to vectorize, or no channel loop to block)
    assert (claimed == ScheduleClass.CONTRACTION_CHAIN) == taken, (case, claimed)
    rows, cols = ((n + 2 * padding - k) // stride + 1 for n in (height, width))
    assert taken == (rows > 1 and cols > 1 and expanded > 1), case
    fused = tvm.compile(mod, TARGET, relax_pipeline=build_pipeline(
        TARGET, ApplyPartition([everything]), schedule_pass(TARGET)))
    unfused = tvm.compile(mod, TARGET, relax_pipeline=build_pipeline(
        TARGET, None, schedule_pass(TARGET)))
    got, want = run(fused, inputs)[0], run(unfused, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=str(case))


@pytest.mark.parametrize("case", EDGES, ids=lambda c: "x".join(map(str, c)))
def test_chain_matches_the_unfused_program(case) -> None:
    _check(case)


@pytest.mark.parametrize("case", _draws(10, seed=29), ids=lambda c: "x".join(map(str, c)))
def test_random_chains_match_the_unfused_program(case) -> None:
    _check(case)


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_one_parallel_loop_over_channel_blocks(target) -> None:
    mod, _ = channel_chain_program(1, 24, 144, 56, 56, stride=2)
    with target:
        sch = ChannelChain().apply(fused_kernel(mod, kernels(mod)), target, False)
    assert sch is not None
    loops = []
    tvm_ffi.structural_walk(sch.mod["main"].body, (tirx.For, loops.append), order="pre")
    parallel = [lp for lp in loops if lp.kind == tirx.ForKind.PARALLEL]
    assert [int(lp.extent) for lp in parallel] == [144 // 8]
    lanes = 16 if target is AVX512 else 8
    assert lanes in {int(lp.extent) for lp in loops if lp.kind == tirx.ForKind.VECTORIZED}


# (image side, window, unrolled on AVX2, unrolled on AVX-512): the plane row of a stride-2
# chain has (side + window - 1) // 2 half-columns, unrolled when they are at most one vector,
# twice them a whole number of vectors, and the pad (window // 2) odd
SHORT_ROWS = [(14, 3, True, True), (30, 3, False, True), (6, 3, True, False),
              (14, 5, False, False), (56, 3, False, False), (28, 5, False, False),
              (12, 5, False, False)]


@pytest.mark.parametrize("case", SHORT_ROWS, ids=lambda c: f"{c[0]}x{c[0]}k{c[1]}")
@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_a_short_deinterleaved_row_is_copied_unrolled(target, case) -> None:
    """``depthwise.unroll_short_row``: LLVM's loop vectorizer made the 8 half-columns of a
    14-wide image a gather and a scatter; unrolled, the SLP vectorizer shuffles whole
    vectors. Other lengths keep their loop, and so does an even pad (a 5x5 window), which
    the loop vectorizer shuffles and which unrolled stayed scalar."""
    side, k, on_avx2, on_avx512 = case
    mod, _ = channel_chain_program(1, 16, 64, side, side, k, stride=2, padding=k // 2)
    with target:
        sch = ChannelChain().apply(fused_kernel(mod, kernels(mod)), target, False)
    assert sch is not None
    loops = []
    tvm_ffi.structural_walk(sch.mod["main"].body, (tirx.For, loops.append), order="pre")
    half = [lp for lp in loops if int(lp.extent) == (side + k - 1) // 2
            and isinstance(lp.body, tirx.For) and int(lp.body.extent) == 2
            and lp.body.kind == tirx.ForKind.UNROLLED]  # half-column -> parity
    unrolled = on_avx512 if target is AVX512 else on_avx2
    assert [lp.kind for lp in half] == [
        tirx.ForKind.UNROLLED if unrolled else tirx.ForKind.SERIAL]


def test_a_pointwise_depthwise_pair_is_no_chain() -> None:
    # a 1x1 "depthwise" window has no taps to tile: the card and the rule both decline it
    mod, _ = channel_chain_program(1, 8, 16, 8, 8, kernel=1)
    everything = kernels(mod)
    assert group_features(build_graph(mod), everything).schedule_on("cpu") != (
        ScheduleClass.CONTRACTION_CHAIN)
    with TARGET:
        assert ChannelChain().apply(fused_kernel(mod, everything), TARGET, False) is None


def test_planner_forms_the_chain() -> None:
    mod, _ = channel_chain_program(1, 24, 144, 56, 56, stride=2)
    graph = build_graph(mod)
    plan = plan_greedy(graph, host(2, calibration=False), FusionConfig())
    chains = [g for g in plan.groups if group_features(graph, g).schedule_on("cpu")
              == ScheduleClass.CONTRACTION_CHAIN]
    assert len(chains) == 1
    assert sum((graph[n].prim_func or "").startswith("conv2d") for n in chains[0]) == 2


def test_the_learned_model_prices_an_unmeasured_chain_analytically() -> None:
    # The chain's one-hot is all zeros (classes.UNLEARNED): no row of another class lies near
    # a chain, and the measured chains are the zoo's (mobilenetv2's), none near a 5 x 5 window
    # over 40 -> 240 channels at 20 x 20; so the analytical price stands, marked as a fallback
    from tvm_costfuse.cost import learned
    from tvm_costfuse.cost.analytical import estimate

    mod, _ = channel_chain_program(1, 40, 240, 20, 20, kernel=5)
    features = group_features(build_graph(mod), kernels(mod))
    target = host(2, calibration=False)
    got = learned.load_learned(target)(features, target)
    assert got.breakdown.get("fallback") == 1.0
    assert got.seconds == estimate(features, target).seconds


def test_the_depthwise_write_back_rows_are_unrolled() -> None:
    """As ``depthwise.py``'s (``finish_tile``): with the rows of the tile's write-back rolled, a
    SiLU epilogue on 28-wide rows ran 1.8x slower (40 -> 240 channels, 5 x 5 at 28 x 28,
    znver4). The init's rows were unrolled either way (``decompose_reduction`` copies the
    kind of the unrolled row loop)."""
    mod, _ = channel_chain_program(1, 40, 240, 28, 28, 5, stride=1, padding=2, act="silu")
    with AVX512:
        sch = ChannelChain().apply(fused_kernel(mod, kernels(mod)), AVX512, False)
    assert sch is not None
    names: list[str] = []
    tvm_ffi.structural_walk(sch.mod["main"].body,
                            (s_tir.SBlock, lambda b: names.append(b.name_hint)))
    depthwise = [n for n in names if n.startswith("group_conv2d")
                 and n.endswith(("_init", "_local"))]
    assert len(depthwise) == 2, names  # the accumulators' init and their write-back
    for name in depthwise:
        rows = sch.get_loops(sch.get_sblock(name))[-2]
        assert int(sch.get(rows).extent) > 1 and sch.get(rows).kind == tirx.ForKind.UNROLLED


def test_the_pointwise_share_charges_the_lanes_an_image_leaves_idle() -> None:
    """A 7 x 7 image's 49 pixels take three vectors of 16 and a one-pixel tail: its 1x1 conv
    is priced at 49 / 64 of the share of an image that fills its vectors (28 x 28 = 49 x 16),
    the same channels and reduction; AVX2's 8 lanes leave 49 / 56."""
    from tvm_costfuse.schedules.chain import CHAIN_CARD

    def share(side: int, lanes: int) -> float:
        mod, _ = channel_chain_program(1, 32, 192, side, side)
        f = group_features(build_graph(mod), kernels(mod))
        work = next(w for w in f.op_work if w.contraction)
        return CHAIN_CARD.share(work, lanes, 32 if lanes == 16 else 16)

    for lanes, fill in ((16, 49 / 64), (8, 49 / 56)):
        assert share(7, lanes) == pytest.approx(fill * share(28, lanes), rel=1e-6)
