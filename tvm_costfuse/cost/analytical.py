"""The analytical cost model: a kernel's time from first principles, with its breakdown.

time = launch + max(memory, compute) + (1 - overlap) * min(memory, compute)

- memory: bytes crossing the group boundary once, each tensor at last-level-cache bandwidth
  if it fits there, else at DRAM bandwidth; intermediates are free only when the group's
  schedule keeps them on chip (the fallback and the CPU contraction rule's streamed prologue
  and epilogue passes materialize them: 2x their bytes), plus spill traffic;
- compute: FLOPs (plus recomputation of inlined producers) at the rate of the schedule class,
  scaled by the parallelism the group exposes (output elements vs cores x lanes or SMs x warps);
- registers: live values per thread (CUDA) or vector registers per loop body (CPU); over the
  budget the excess spills to local memory and costs traffic.

Every constant below is named with the reason for its value; the learned model corrects them
from measurements (``tuning_logs/``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..schedules._common import MIN_PARALLEL_FMAS, MIN_PARALLEL_ITERS
from ..schedules.classes import ScheduleClass as SC
from ..schedules.efficiency import fraction_of_peak
from .features import GroupFeatures

# Fraction of peak FP32 each schedule class reaches. CPU: the register-blocked micro-kernel
# (``schedules/gemm.py``) reached 0.49-0.63 of the FMA-chain peak (geomean over the 8 kernels
# of ``scripts/bench_kernels.py``, two runs, docs/benchmarks.md; Linears 0.6-0.8, attention's
# short-K batch matmuls 0.2-0.6); elementwise/reduction loops are bound by memory, their
# compute runs at vector rate with transcendental calls (erf, exp ~20 instructions each;
# priced apart, ``_MATH_CORE_SECONDS``). Row reductions (vector rfactor partials, one row
# loop): TVM's FLOP count over the time of the math-free ones came to 0.22-0.31 of the
# 114 GFLOP/s one-core FMA-chain peak (LayerNorm 197x768 and 128x768, wav2vec2's GroupNorm
# 512x3199; ``bench_kernels.py --classes reduction``, docs/benchmarks.md), where 0.05 had
# priced the scalar reduction loops before them.
# On CPU a contraction with a known block geometry (``Node.geometry``) is priced at the share
# its rule's own tile reaches (``schedules/efficiency.py``: 0.19-0.93 measured, by shape);
# the CONTRACTION entry below prices the rest (stored rows from before the geometry, symbolic
# shapes).
# Attention (``schedules/attention.py``): the share of peak its two contractions reach inside
# the fused kernel, the softmax between them priced at the row-reduction rate and its exp as
# math. Measured against the split kernels ([K^T] [Q K^T, scale, mask] [softmax] [P V], our
# schedules) on the 2-core emeraldrapids host under another worker's load (rough), 1 and 2
# threads: split / fused 1.02-1.09 on BERT's 12 x 128 x 64 heads (masked, causal) and ViT's
# 12 x 197 x 64, 1.19-1.29 on the small variants' 2 x 16 x 16; 0.55 prices them at 1.03-1.04
# and 1.29-1.44 (/tmp-free script: docs/benchmarks.md, "attention kernel").
# Long key rows (1280-16384 keys, the row block in a share of L2) keep that share: the fused
# kernel's measured / predicted time there, 0.69-1.37 by form at 1280-4096 keys (plain
# fastest, causal slowest; 1.95 at 16384 causal), spans the 0.74-0.98 of 128-197 keys, while
# the split kernels' is 1.07-1.74 (2.35): split / fused is predicted 0.93-0.96 (1 and 2
# threads) and measured 1.04-1.62, the error on the split side (most likely its scores
# tensor, 75 MiB-1 GiB there, priced under the compute by the overlap term), not in this
# share (rocketlake host, under load; docs/benchmarks.md, "Fused attention for long key rows").
# One query row per head (a decode step; ``schedules/attention_decode.py``) is priced at the
# same share, which it does not reach: measured per layer at 1 thread it ran 6.2-7.6x slower
# than this compute term on qwen2 (128 and 1024 past) and falcon, 8-9x with memory on opt and
# gpt2 (znver4, 2026-12-03, ``scripts/research/kernel_profile.py``; docs/benchmarks.md,
# "Decode steps"). Its alternative is priced further off: FuseOps' transposing copy of the
# keys (concat, rotary, GQA repeat, transpose: a gather per element) at 26x under its
# measured time, the value copy at 5x. Priced at its measured share (0.075), the fused kernel
# loses to that copy on paper and the planner keeps FuseOps' kernels, 1.45-1.88x slower as
# measured; so both stay as they are until transposing copies are priced per gather.
_EFF = {
    "cpu": {SC.CONTRACTION: 0.55, SC.CONTRACTION_STREAM: 0.55, SC.REDUCTION: 0.25,
            SC.ELEMENTWISE: 0.05, SC.FALLBACK: 0.05, SC.ATTENTION: 0.55},
    # dlight: SIMT matmul tiles reach ~50% of FP32 peak; others are memory bound.
    "cuda": {SC.CONTRACTION: 0.50, SC.REDUCTION: 0.10, SC.ELEMENTWISE: 0.10, SC.FALLBACK: 0.10},
}
# Seconds one core spends on one exp-equivalent of math library work (``schedules.math_calls.MATH_COST``).
# CPU: the vectorized exp (``schedules/fast_math``) over 1M float32 elements took 0.87 ns per
# element machine-wide on the 2-core emeraldrapids host (``scripts/research/math_cost.py``,
# whole kernel time, as for the libm exp before it): 1.74 ns per call per core. Kept in
# seconds, not FLOPs: a calibrated FMA peak says nothing about the polynomial's selects and
# casts. CUDA: not measured on a GPU; 0 leaves its estimates as they were (what a GPU's
# special-function units make of it is not known here).
_MATH_CORE_SECONDS = {"cpu": 1.74e-9, "cuda": 0.0}
# A contraction left to the fallback schedule runs as a naive loop nest: TVM_NOTES measured
# 0.7-1.9 GFLOP/s on CPU; on CUDA one thread per output element without tiling (~2% of peak).
_NAIVE_CONTRACTION = {"cpu": 1.0e9, "cuda": None}
_NAIVE_CUDA_FRACTION = 0.02
# Memory and compute overlap well in streaming loops (hardware prefetch, warps hiding latency).
_OVERLAP = 0.8
# Registers a CUDA thread needs per schedule class before counting live values (ptxas: dlight
# matmul tiles use 64; elementwise chains 12-18; reductions grow ~1.2 per accumulator).
_CUDA_BASE_REGS = {SC.CONTRACTION: 64, SC.REDUCTION: 16, SC.ELEMENTWISE: 10, SC.FALLBACK: 24}
_CUDA_REGS_PER_LIVE = 2
_CUDA_REGS_PER_ACC = 1.2
# CPU vector registers a loop body needs: contraction register tiles take ~3/4 of the file.
_CPU_TILE_FRACTION = 0.75


@dataclass(frozen=True)
class Estimate:
    """Predicted kernel time (seconds) with the terms that produced it."""

    seconds: float
    breakdown: dict[str, float] = field(default_factory=dict)
    registers: int = 0
    spill_bytes: int = 0
    confidence: float = 0.5

    def __add__(self, other: Estimate) -> Estimate:
        keys = dict.fromkeys([*self.breakdown, *other.breakdown])  # ordered, unlike a set
        return Estimate(
            self.seconds + other.seconds,
            {k: self.breakdown.get(k, 0.0) + other.breakdown.get(k, 0.0) for k in keys},
            max(self.registers, other.registers),
            self.spill_bytes + other.spill_bytes,
            min(self.confidence, other.confidence),
        )


def one_footing(estimates: Sequence[Estimate]) -> list[float]:
    """The seconds of ``estimates`` on one footing, for comparing them (a merge's parts
    against their union).

    A learned or measured answer keeps the analytical time it replaces in its breakdown
    (``"analytical"``); a fallback or analytical answer has none. Where some of the estimates
    are corrected and some are not (views, 0 s on either footing, aside), every one is read
    at its analytical time: the analytical model's bias is not the same in every class and
    size (small elementwise kernels priced at 0.6-0.75 of their time, large ones at 1.7x), so
    a corrected union weighed against uncorrected parts decides on that bias. Leave one
    family out on 2067 measured pairs, the learned model decided 86.0% right when a decision
    mixed the two, 87.6% on one footing, and was then at or above the analytical model on
    every family (docs/benchmarks.md, "Decisions on one footing")."""
    corrected = ["analytical" in e.breakdown for e in estimates if e.seconds > 0]
    if all(corrected) or not any(corrected):
        return [e.seconds for e in estimates]
    return [e.breakdown.get("analytical", e.seconds) for e in estimates]


def registers(f: GroupFeatures, target) -> tuple[int, int]:
    """(registers per thread or vector registers per loop body, registers over the file)."""
    if target.kind == "cuda":
        base = _CUDA_BASE_REGS[f.schedule_on("cuda")]
        need = base + _CUDA_REGS_PER_LIVE * f.live_values + _CUDA_REGS_PER_ACC * f.accumulators
        return int(need), max(0, int(need) - target.regs_per_thread)
    contraction = f.schedule_on(target.kind) in (SC.CONTRACTION, SC.CONTRACTION_STREAM,
                                                 SC.ATTENTION)
    tile = int(_CPU_TILE_FRACTION * target.vector_regs) if contraction else 0
    need = tile + f.live_values + f.accumulators
    return need, max(0, need - target.vector_regs)


# Where nobody measured the last-level cache's bandwidth: a few times DRAM's (L2 on H100 is
# ~1.6x HBM3; a CPU's L3 is ~4-5x its DRAM channel).
_LLC_OVER_DRAM = 3.0


def last_level_cache(target) -> tuple[int, float]:
    """(bytes, bytes/s) of the largest cache: L3 on CPUs, L2 on GPUs."""
    size, bw = (target.l3_bytes, target.l3_bw) if target.l3_bytes else (target.l2_bytes,
                                                                         target.l2_bw)
    return size, bw or target.dram_bw * _LLC_OVER_DRAM


def private_cache(target) -> tuple[int, float | None]:
    """(bytes, bytes/s) of the CPU cores' L2 together, where calibration measured its
    bandwidth (None otherwise, and on GPUs, whose L2 is the last-level cache). A VM can report
    a last-level cache far larger than its share (480 MiB on a 2-vCPU rocketlake host, whose
    "L3" stream ran at DRAM speed, 13 against 83 GB/s in L2): every intermediate was priced
    at DRAM speed there, small kernels 2-3x too slow (docs/benchmarks.md)."""
    if target.kind == "cuda" or not target.l2_bw or not target.l3_bytes:
        return 0, None
    return target.l2_bytes * max(1, target.cores), target.l2_bw


def _full_parallelism(dtype_bytes: int, target) -> int:
    """Output elements that keep the whole machine busy."""
    if target.kind == "cuda":
        # Enough threads to fill every SM at half occupancy; fewer leave SMs idle.
        return target.sm_count * target.max_threads_per_sm // 2
    lanes = max(1, target.vector_bits // (8 * dtype_bytes))
    return target.cores * lanes * 4  # 4 vectors per core keep the FMA pipes busy


def _parallel_efficiency(elems: int, dtype_bytes: int, target) -> float:
    """Share of the machine a loop over ``elems`` outputs keeps busy."""
    return min(1.0, max(elems, 1) / _full_parallelism(dtype_bytes, target))


def _work(f: GroupFeatures) -> tuple[tuple, ...]:
    """Per-op (is_contraction, FLOPs, output elements[, in_prologue[, math[, geometry]]]);
    one entry for the whole group when the features carry no per-op split."""
    return f.op_work or ((f.contraction_flops > 0, f.flops, f.out_elems, False, f.math),)


def launch_seconds(f: GroupFeatures, target, schedule: str) -> float:
    """Fixed cost of one kernel. CUDA: the launch. CPU: the VM's dispatch, plus one thread-pool
    wake-up and join per parallel loop nest: a kernel whose loops are all too small to
    parallelize pays dispatch only, and a kernel whose schedule leaves several nests (the
    fallback; a contraction with a streamed prologue or epilogue pass) pays the pool per nest,
    so fusing into it saves less than a whole launch."""
    if target.kind == "cuda":
        return target.launch_s
    serial = target.launch_s_serial if target.launch_s_serial is not None else target.launch_s
    # The thresholds our CPU rules parallelize at (below them a loop nest stays serial).
    parallel = any(w[1] / 2 >= MIN_PARALLEL_FMAS if w[0] else w[2] >= MIN_PARALLEL_ITERS
                   for w in _work(f))
    if not parallel:
        return serial
    if schedule == SC.FALLBACK:
        heavy = f.n_contractions + f.n_reductions
        nests = max(1, heavy + (1 if f.n_ops > heavy else 0))
    elif schedule == SC.ATTENTION:  # the row-block loop, and the K^T packing pass the
        nests = 2  # imported programs have (a transpose in the group or a copy of the input)
    else:
        nests = 2 if schedule == SC.CONTRACTION_STREAM else 1
    return serial + nests * max(0.0, target.launch_s - serial)


def estimate(f: GroupFeatures, target, register_budget: int | None = None) -> Estimate:
    """Analytical time of one kernel computing the group described by ``f`` on ``target``."""
    if f.is_view:  # TVM makes a lone reshape a view: no launch, nothing moves
        zero = {"launch": 0.0, "memory": 0.0, "compute": 0.0, "spill": 0.0}
        return Estimate(0.0, zero, 0, 0, confidence=0.5)
    kind = "cuda" if target.kind == "cuda" else "cpu"
    regs, over = registers(f, target)
    if register_budget is not None and target.kind == "cuda":
        over = max(over, regs - register_budget)
    llc_bytes, llc_bw = last_level_cache(target)
    l2_bytes, l2_bw = private_cache(target)

    def seconds_to_move(size: int) -> float:
        # A tensor that fits in half the cores' L2 (measured bandwidth only) or half the
        # last-level cache is served from there (its producer ran just before); a bigger one
        # streams from DRAM.
        if l2_bw and size <= l2_bytes // 2:
            return size / l2_bw
        return size / (llc_bw if size <= llc_bytes // 2 else target.dram_bw)

    sizes = f.boundary_sizes or (f.bytes_in, f.bytes_out)
    memory = sum(seconds_to_move(s) for s in sizes)
    schedule = f.schedule_on(kind)
    if schedule in (SC.FALLBACK, SC.CONTRACTION_STREAM):
        # Intermediates materialize (written, then read): the fallback keeps every block; the
        # CPU contraction rule streams its prologue into a packed operand and leaves an
        # epilogue it cannot inline as its own pass.
        memory += 2 * seconds_to_move(f.bytes_internal)
    # Each spilled register is stored and reloaded once per output element.
    spill_bytes = 2 * 4 * over * f.out_elems
    spill = spill_bytes / llc_bw

    peak = target.peak(f"float{8 * f.dtype_bytes}")
    eff = _EFF[kind][schedule]
    if schedule == SC.FALLBACK:
        contraction_rate = _NAIVE_CONTRACTION[kind] or peak * _NAIVE_CUDA_FRACTION
    elif schedule == SC.ATTENTION:  # the softmax between the contractions: row reductions
        contraction_rate, eff = peak * eff, _EFF[kind][SC.REDUCTION]
    else:
        contraction_rate = peak * _EFF[kind][SC.CONTRACTION]
    # Each op keeps its own loop's parallelism inside the kernel (fusing a scalar reduction
    # with a wide op does not parallelize the reduction).
    # An epilogue is computed in the contraction's register tile; a CPU prologue streams in its
    # own elementwise loop nest (old rows have no prologue flag: 3-tuples).
    stream_eff = _EFF[kind][SC.ELEMENTWISE] if schedule == SC.CONTRACTION_STREAM else eff
    math_seconds = _MATH_CORE_SECONDS[kind] / max(1, target.cores)
    full = _full_parallelism(f.dtype_bytes, target)
    stream_rate, rate = peak * stream_eff, peak * eff
    if kind == "cpu" and schedule in (SC.CONTRACTION, SC.CONTRACTION_STREAM):
        # (the attention kernel tiles its two contractions its own way: its rate above)
        lanes = max(1, target.vector_bits // (8 * f.dtype_bytes))

        def rate_of(w) -> float:
            if len(w) > 5 and w[5] is not None:  # the rule's own tile for this block
                return peak * fraction_of_peak(w[5], lanes, target.vector_regs)[1]
            return contraction_rate
    else:
        def rate_of(w) -> float:
            return contraction_rate
    compute = sum([
        (w[1] / (rate_of(w) if w[0] else stream_rate if w[3:4] == (True,) else rate)
         + (w[4] if len(w) > 4 else 0.0) * math_seconds)
        / min(1.0, max(w[2], 1) / full)
        for w in _work(f)
    ])
    if schedule not in (SC.CONTRACTION_STREAM, SC.ATTENTION):  # computed once, not per use
        compute += f.recompute_flops / (peak * eff) / _parallel_efficiency(
            f.out_elems, f.dtype_bytes, target)

    body = max(memory, compute) + (1 - _OVERLAP) * min(memory, compute)
    launch = launch_seconds(f, target, schedule)
    seconds = launch + body + spill
    breakdown = {"launch": launch, "memory": memory, "compute": compute, "spill": spill}
    return Estimate(seconds, breakdown, regs, spill_bytes, confidence=0.5)
