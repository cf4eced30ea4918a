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

from dataclasses import dataclass, field

from ..schedules._common import MIN_PARALLEL_FMAS, MIN_PARALLEL_ITERS
from ..schedules.classes import ScheduleClass as SC
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
_EFF = {
    "cpu": {SC.CONTRACTION: 0.55, SC.CONTRACTION_STREAM: 0.55, SC.REDUCTION: 0.25,
            SC.ELEMENTWISE: 0.05, SC.FALLBACK: 0.05},
    # dlight: SIMT matmul tiles reach ~50% of FP32 peak; others are memory bound.
    "cuda": {SC.CONTRACTION: 0.50, SC.REDUCTION: 0.10, SC.ELEMENTWISE: 0.10, SC.FALLBACK: 0.10},
}
# A CPU contraction that does at most this many multiply-adds per output element and per
# input element is a depthwise convolution (a 3x3 or 5x5 window over one channel;
# ``schedules/depthwise.py``): its time is the loads, the one store per output and the padded
# (stride 2: deinterleaved) input copy, not the FMAs. A 1x1 conv from 16 channels is no such
# kernel (each input element feeds every output channel): measured 0.24 of peak (16 -> 96 at
# 112 x 112; 24 -> 72 at 56 x 56: 0.43). The depthwise rate, as a fraction of the 173 GFLOP/s
# FMA-chain peak of one emeraldrapids core: the kernel (its pad pass included) ran the
# corpus's 44 depthwise shapes at 13.3 GFLOP/s geomean (stride 1: 20.3, stride 2: 7.2; TVM's
# FLOP count; ``scripts/research/depthwise_bench.py --threads 1``, load average ~2 on 2 vCPUs;
# docs/benchmarks.md).
_DEPTHWISE_MACS = 25
_DEPTHWISE_EFF = {"cpu": 0.077, "cuda": None}
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


def registers(f: GroupFeatures, target) -> tuple[int, int]:
    """(registers per thread or vector registers per loop body, registers over the file)."""
    if target.kind == "cuda":
        base = _CUDA_BASE_REGS[f.schedule_on("cuda")]
        need = base + _CUDA_REGS_PER_LIVE * f.live_values + _CUDA_REGS_PER_ACC * f.accumulators
        return int(need), max(0, int(need) - target.regs_per_thread)
    contraction = f.schedule_on(target.kind) in (SC.CONTRACTION, SC.CONTRACTION_STREAM)
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
    """Per-op (is_contraction, FLOPs, output elements[, in_prologue[, math]]); one entry for
    the whole group when the features carry no per-op split."""
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
    else:
        nests = 2 if schedule == SC.CONTRACTION_STREAM else 1
    return serial + nests * max(0.0, target.launch_s - serial)


def is_depthwise(f: GroupFeatures) -> bool:
    """One contraction with at most :data:`_DEPTHWISE_MACS` multiply-adds per output element
    and per element of its largest input: a depthwise convolution's short window over one
    channel. (A 1x1 conv whose weight outgrows the activations, 8 -> 48 channels on a 4 x 4
    map, also passes: a kernel that small is priced by its launch and memory anyway.)"""
    macs = f.contraction_flops / 2
    inputs = (f.boundary_sizes[:len(f.boundary_sizes) - f.n_outputs] if f.boundary_sizes
              else (f.bytes_in,))
    largest = max(inputs, default=0) // max(1, f.dtype_bytes)
    return f.n_contractions == 1 and 0 < macs <= _DEPTHWISE_MACS * min(f.out_elems, largest)


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

    def seconds_to_move(size: int) -> float:
        # A tensor that fits in half the last-level cache is served from it (its producer
        # ran just before); a bigger one streams from DRAM.
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
    elif _DEPTHWISE_EFF[kind] and is_depthwise(f):
        contraction_rate = peak * _DEPTHWISE_EFF[kind]
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
    compute = sum([
        (w[1] / (contraction_rate if w[0] else stream_rate if w[3:4] == (True,) else rate)
         + (w[4] if len(w) > 4 else 0.0) * math_seconds)
        / min(1.0, max(w[2], 1) / full)
        for w in _work(f)
    ])
    if schedule != SC.CONTRACTION_STREAM:  # a packed prologue is computed once, not per use
        compute += f.recompute_flops / (peak * eff) / _parallel_efficiency(
            f.out_elems, f.dtype_bytes, target)

    body = max(memory, compute) + (1 - _OVERLAP) * min(memory, compute)
    launch = launch_seconds(f, target, schedule)
    seconds = launch + body + spill
    breakdown = {"launch": launch, "memory": memory, "compute": compute, "spill": spill}
    return Estimate(seconds, breakdown, regs, spill_bytes, confidence=0.5)
