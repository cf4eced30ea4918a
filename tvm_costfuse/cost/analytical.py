"""The analytical cost model: a kernel's time from first principles, with its breakdown.

time = launch + max(memory, compute) + (1 - overlap) * min(memory, compute)

- memory: bytes crossing the group boundary once, each tensor at last-level-cache bandwidth
  if it fits there, else at DRAM bandwidth; intermediates are free only when the group's
  schedule keeps them on chip (the fallback and the CPU contraction rule's streamed prologue
  and epilogue passes materialize them: 2x their bytes), plus spill traffic;
- compute: FLOPs (plus recomputation of inlined producers) at the rates on the kernel's card,
  scaled by the parallelism the group exposes (output elements vs cores x lanes or SMs x warps);
- registers: live values per thread (CUDA) or vector registers per loop body (CPU); over the
  budget the excess spills to local memory and costs traffic.

Every constant below is named with the reason for its value; the learned model corrects them
from measurements (``tuning_logs/``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..schedules._common import MIN_PARALLEL_ITERS, contraction_parallel
from ..schedules.card import Card
from ..schedules.classes import ScheduleClass as SC
from ..schedules.efficiency import Geometry, fraction_of_peak
from .features import GroupFeatures, OpWork

# What each kind of kernel reaches (share of peak, how it runs contractions, registers, loop
# nests) is on its card, beside its rule (``schedules/card.py``; ``schedules.catalog`` lists
# them, with the measurements behind each number).

# An operand a kernel reads again per tile (``Card.rereads``) costs nothing more while it fits
# this share of one core's L2: it is served from there, as the tile's own loads. The channel
# chains' 0.8 MB input images (112 x 112, read 12 times) ran 1.18-1.82x faster chained than
# split on a 1 MiB L2 (docs/log/2026-12-06g.md); priced from the L3 they would lose.
_REREAD_L2_SHARE = 1.0
# Memory and compute overlap well in streaming loops (hardware prefetch, warps hiding latency).
_OVERLAP = 0.8
# Registers a CUDA thread needs on top of its card's base: 2 per live value, ~1.2 per
# accumulator (ptxas).
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
    every family (docs/log/2026-12-02.md, "Decisions on one footing")."""
    corrected = ["analytical" in e.breakdown for e in estimates if e.seconds > 0]
    if all(corrected) or not any(corrected):
        return [e.seconds for e in estimates]
    return [e.breakdown.get("analytical", e.seconds) for e in estimates]


def _cuda_registers(f: GroupFeatures, target) -> tuple[int, int]:
    base = f.card_on("cuda").cuda_registers
    need = base + _CUDA_REGS_PER_LIVE * f.live_values + _CUDA_REGS_PER_ACC * f.accumulators
    return int(need), max(0, int(need) - target.regs_per_thread)


def _cpu_registers(f: GroupFeatures, target) -> tuple[int, int]:
    tile = int(_CPU_TILE_FRACTION * target.vector_regs) if f.card_on("cpu").register_tile else 0
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
    at DRAM speed there, small kernels 2-3x too slow (docs/log/2026-12-01b.md)."""
    if not kind_model(target).private_l2 or not target.l2_bw or not target.l3_bytes:
        return 0, None
    return target.l2_bytes * max(1, target.cores), target.l2_bw


def _cuda_full_parallelism(dtype_bytes: int, target) -> int:
    """Enough threads to fill every SM at half occupancy; fewer leave SMs idle."""
    return target.sm_count * target.max_threads_per_sm // 2


def _cpu_full_parallelism(dtype_bytes: int, target) -> int:
    """4 vectors per core keep the FMA pipes busy."""
    lanes = max(1, target.vector_bits // (8 * dtype_bytes))
    return target.cores * lanes * 4


def _parallel_efficiency(elems: int, dtype_bytes: int, target) -> float:
    """Share of the machine a loop over ``elems`` outputs keeps busy."""
    return min(1.0, max(elems, 1) / kind_model(target).full_parallelism(dtype_bytes, target))


def _work(f: GroupFeatures) -> tuple[OpWork, ...]:
    """Per-op work; one entry for the whole group when the features carry no per-op split."""
    return f.op_work or (OpWork(f.contraction_flops > 0, f.flops, f.out_elems, False, f.math),)


def launch_seconds(f: GroupFeatures, target, card: Card) -> float:
    """Fixed cost of one kernel. CUDA: the launch. CPU: the VM's dispatch, plus one thread-pool
    wake-up and join per parallel loop nest: a kernel whose loops are all too small to
    parallelize pays dispatch only, and a kernel whose schedule leaves several nests (the
    fallback; a contraction with a streamed prologue or epilogue pass) pays the pool per nest,
    so fusing into it saves less than a whole launch."""
    return kind_model(target).launch(f, target, card)


def _cuda_launch(f: GroupFeatures, target, card: Card) -> float:
    return target.launch_s


_BY_BYTES = (SC.CONTRACTION, SC.CONTRACTION_STREAM)


def _cpu_launch(f: GroupFeatures, target, card: Card) -> float:
    serial = target.launch_s_serial if target.launch_s_serial is not None else target.launch_s
    # The thresholds our CPU rules parallelize at (below them a loop nest stays serial): the
    # contraction rule's tile loop also by the bytes it reads (here the group's inputs, its
    # epilogue's among them); the attention and chain rules by multiply-adds alone.
    read = f.bytes_in if card.cls in _BY_BYTES else 0
    parallel = any(contraction_parallel(w.flops / 2, read) if w.contraction
                   else w.elems >= MIN_PARALLEL_ITERS for w in _work(f))
    if not parallel:
        return serial
    return serial + card.nests(f) * max(0.0, target.launch_s - serial)


@dataclass(frozen=True)
class KindModel:
    """What the formulas take from the target's kind: one record per kind, so that no
    formula asks which kind it prices."""

    #: the cards' column (``Card.efficiency[...]``, ``Card.card_on(...)``)
    card_column: str
    #: (registers a thread or loop body needs, registers over the file)
    registers: Callable[[GroupFeatures, object], tuple[int, int]]
    #: output elements that keep the whole machine busy
    full_parallelism: Callable[[int, object], int]
    #: the fixed cost of one kernel
    launch: Callable[[GroupFeatures, object, Card], float]
    #: the cores' own L2 serves what fits in it (a GPU's L2 is its last-level cache)
    private_l2: bool
    #: ``FusionConfig.register_budget`` caps a group's registers (a GPU thread's; CPU register
    #: tiles are fixed by the rules)
    caps_registers: bool
    #: rates per block from the rule's tile geometry, and idle cores of a short tile grid
    tiles_cores: bool


_KIND_MODELS = {
    "cpu": KindModel("cpu", _cpu_registers, _cpu_full_parallelism,
                     _cpu_launch, private_l2=True, caps_registers=False, tiles_cores=True),
    "cuda": KindModel("cuda", _cuda_registers,
                      _cuda_full_parallelism, _cuda_launch, private_l2=False,
                      caps_registers=True, tiles_cores=False),
}


def kind_model(target) -> KindModel:
    """The :class:`KindModel` of a target description's kind; ValueError for a kind with none."""
    if target.kind not in _KIND_MODELS:
        raise ValueError(f"the cost model prices {' and '.join(_KIND_MODELS)} targets, "
                         f"not {target.kind!r}")
    return _KIND_MODELS[target.kind]


def registers(f: GroupFeatures, target) -> tuple[int, int]:
    """(registers per thread or vector registers per loop body, registers over the file)."""
    return kind_model(target).registers(f, target)


def weights_stream(f: GroupFeatures, llc_bytes: int) -> bool:
    """Do the module's weights together pass half the last-level cache (the share a tensor
    is taken to stay cached in)? Then each comes from DRAM on every call of the model, not
    from the tier its own size would fit (a decode step's 9 MB projection among 169 MB of
    weights)."""
    return f.module_constant_bytes > llc_bytes // 2


def _gathers(f: GroupFeatures, target, card: Card) -> float:
    """Seconds of a CPU kernel's gathered transpose elements (``gathered_elems``) at the
    host's gather cost, over its cores. A transpose moving the innermost axis, inlined into an
    elementwise or copy kernel or a convolution's padded input plane, loads each element from
    its own input row: densenet121 channels-last ran six such convolutions 4.4 ms slower than
    the same convolutions on an NCHW input, with the transposes priced as free copies. The
    GEMM rule packs a transposed operand into panels in one pass (its share is fitted so), and
    the attention rules read K and V where they lie: neither pays it."""
    if not f.gathered_elems or target.kind != "cpu" or card.cls == SC.ATTENTION:
        return 0.0
    if any(w.contraction and w.geometry is not None and Geometry.of(w.geometry).gemm
           for w in f.op_work):
        return 0.0
    return f.gathered_elems * target.gather_seconds() / max(1, target.cores)


def _transposes(f: GroupFeatures, target) -> float:
    """Seconds of a lone CPU transpose moving the innermost axis (``transposed_elems``) at the
    host's tiled-transpose cost, over its cores. Its bytes alone priced such a kernel at the
    stream's 0.09 ns an element in L2, where the tiles take 0.14 ns (rocketlake); a
    channels-last plan keeps one around every op that stays NCHW (shufflenet_v2's data
    movement ran 456 us, priced 239; docs/log/2026-12-08.md)."""
    if not f.transposed_elems or target.kind != "cpu":
        return 0.0
    return f.transposed_elems * target.transpose_seconds() / max(1, target.cores)


def estimate(f: GroupFeatures, target, register_budget: int | None = None) -> Estimate:
    """Analytical time of one kernel computing the group described by ``f`` on ``target``."""
    if f.is_view:  # TVM makes a lone reshape a view: no launch, nothing moves
        zero = {"launch": 0.0, "memory": 0.0, "compute": 0.0, "spill": 0.0}
        return Estimate(0.0, zero, 0, 0, confidence=0.5)
    model = kind_model(target)
    kind = model.card_column
    regs, over = model.registers(f, target)
    if register_budget is not None and model.caps_registers:
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
    if weights_stream(f, llc_bytes):
        memory += sum(s / target.dram_bw - seconds_to_move(s) for s in f.constant_sizes)
    card = f.card_on(kind)
    reread, times = card.rereads(f)
    if reread > _REREAD_L2_SHARE * target.l2_bytes:
        memory += times * seconds_to_move(reread)
    if card.materializes:
        # Intermediates are written, then read: the fallback keeps every block; the CPU
        # contraction rule streams its prologue into a packed operand and leaves an epilogue it
        # cannot inline as its own pass.
        memory += 2 * seconds_to_move(f.bytes_internal)
    # Each spilled register is stored and reloaded once per output element.
    spill_bytes = 2 * 4 * over * f.out_elems
    spill = spill_bytes / llc_bw

    peak = target.peak(f"float{8 * f.dtype_bytes}")
    # Each op keeps its own loop's parallelism inside the kernel (fusing a scalar reduction
    # with a wide op does not parallelize the reduction). An epilogue is computed in the
    # contraction's register tile; a CPU prologue streams in its own loop nest.
    rate, stream_rate = peak * card.efficiency[kind], peak * card.prologue_share(kind)
    contraction_rate = card.contraction_rate(kind, peak)
    lanes = max(1, target.vector_bits // (8 * f.dtype_bytes))

    def rate_of(w: OpWork) -> float:
        if not model.tiles_cores:
            return contraction_rate
        own = card.share(w, lanes, target.vector_regs)
        if own is not None:  # the kind's own share for this block
            return peak * own
        if card.tiles_by_geometry and w.geometry is not None:  # the rule's own tile
            return peak * fraction_of_peak(w.geometry, lanes, target.vector_regs,
                                           target.depthwise_shares)[1]
        return contraction_rate

    # Math calls in exp-equivalents (``schedules.math_calls.MATH_COST``) at the host's exp.
    math_seconds = target.exp_seconds() / max(1, target.cores)
    full = model.full_parallelism(f.dtype_bytes, target)
    compute = sum([
        (w.flops / (rate_of(w) if w.contraction else stream_rate if w.in_prologue else rate)
         + w.math * math_seconds) / min(1.0, max(w.elems, 1) / full)
        for w in _work(f)
    ])
    items = card.parallel_items(f) if model.tiles_cores else None
    if items is not None:  # a tiling with fewer parallel iterations than cores idles some
        cores = max(1, target.cores)
        compute /= items / (cores * -(-items // cores))
    compute += _gathers(f, target, card) + _transposes(f, target)
    if card.recomputes:  # inlined producers evaluated per use
        compute += f.recompute_flops / rate / _parallel_efficiency(
            f.out_elems, f.dtype_bytes, target)

    body = max(memory, compute) + (1 - _OVERLAP) * min(memory, compute)
    launch = model.launch(f, target, card)
    seconds = launch + body + spill
    breakdown = {"launch": launch, "memory": memory, "compute": compute, "spill": spill}
    return Estimate(seconds, breakdown, regs, spill_bytes, confidence=0.5)
