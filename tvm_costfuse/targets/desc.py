"""Target descriptions: the machine figures the cost model prices a fusion group with.

One frozen :class:`TargetDesc` per target. The GPU presets (:data:`H100`, :data:`H200`,
:data:`A100`) carry vendor datasheet figures; the host CPU's is built in :mod:`.machine`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import tvm

CUDA, CPU = "cuda", "cpu"
KiB, MiB = 1 << 10, 1 << 20
#: FLOPs of a CPU's FMA peak that one vectorized float32 exp (``schedules/fast_math``) costs
#: where ``math_s`` was not measured. ``calibrate.math_seconds`` against ``fp32_flops`` on one
#: znver4 core (2026-12-07): 0.249 ns per exp at 116.6 GFLOP/s with AVX-512 code, 29 FLOPs;
#: 52.8 with AVX2 code (the same peak, half the lanes per polynomial), 122 with SSE2 code (no
#: FMA, floor a library call). The AVX-512 figure, rounded: a host calibrated once measures it.
EXP_FLOPS = 30.0
#: Bytes of DRAM stream per element that one gathered transpose element costs where
#: ``gather_s`` was not measured: ``calibrate``'s ``gather_s`` against its ``dram_bw`` per core
#: on a rocketlake host (2026-12-07): 1.52 ns at 22.9 GB/s on one core, 35 bytes; 1.29 ns at
#: 23.8 GB/s a core on two, 31. An uncalibrated host's DRAM default is 4 GB/s a core.
GATHER_BYTES = 32.0
#: The same for an element of a lone transpose that moves the innermost axis (the tile rule's
#: kernel) where ``transpose_s`` was not measured: 0.139 ns on one rocketlake core against
#: 14.2 GB/s (2026-12-08), 2 bytes.
TRANSPOSE_BYTES = 2.0


@dataclasses.dataclass(frozen=True)
class TargetDesc:
    """Machine figures for one target. Rates are per second for the whole device.

    Fields that do not apply to a kind are 0 (e.g. ``cores`` on a GPU, ``sm_count`` on a CPU)
    and cache bandwidths nobody measured are None.
    """

    name: str
    kind: str  # CUDA or CPU
    arch: str  # "sm_90" for CUDA, the LLVM CPU name ("znver4") for CPUs
    peak_flops: Mapping[str, float] = dataclasses.field(hash=False)  # by dtype, dense
    dram_bw: float  # bytes/s
    # Caches: L1 = L1 data / shared memory per SM (CUDA) or L1d per core (CPU); L2 = whole chip
    # (CUDA) or per core (CPU); L3 = last-level cache (0 on GPUs, whose LLC is L2).
    l1_bytes: int
    l2_bytes: int
    l3_bytes: int
    l1_bw: float | None  # aggregate bytes/s over all SMs / cores
    l2_bw: float | None
    l3_bw: float | None
    launch_s: float  # per-kernel launch overhead
    launch_s_graph: float  # the same under CUDA graphs (== launch_s on CPUs)
    # CPU: a kernel that stays serial pays the VM's dispatch only; ``launch_s`` is that plus
    # waking and joining the thread pool, paid per parallel loop nest. None: ``launch_s``.
    launch_s_serial: float | None = None
    # CUDA execution resources.
    regs_per_thread: int = 0  # max 32-bit registers per thread
    regs_per_sm: int = 0
    sm_count: int = 0
    max_threads_per_sm: int = 0
    max_threads_per_block: int = 0
    warp_size: int = 0
    smem_per_block: int = 0  # static shared memory per block (what dlight schedules for)
    # CPU execution resources.
    cores: int = 0
    vector_bits: int = 0
    vector_regs: int = 0
    # Seconds one core spends per vectorized float32 exp (``calibrate.math_seconds``); None:
    # not measured (:meth:`exp_seconds` derives it).
    math_s: float | None = None
    # The depthwise kernels' shares of the FMA peak over their K term, measured here
    # (``calibrate``): NCHW stride 1, NCHW stride 2, NHWC stride 1, NHWC stride 2. None: not
    # measured (``schedules/efficiency.py``'s fitted shares).
    depthwise_shares: tuple[float, float, float, float] | None = None
    # Seconds one core spends per element of a transpose whose loads gather (the output's
    # innermost axis is not the input's; ``measurement/gather.py``); None: not measured
    # (:meth:`gather_seconds` derives it).
    gather_s: float | None = None
    # The same for a lone transpose, as register tiles (``measurement/gather.py``); None: not
    # measured (:meth:`transpose_seconds` derives it).
    transpose_s: float | None = None
    source: str = "datasheet"  # where the figures came from, e.g. "sysfs+calibrated"

    def __post_init__(self):
        if self.kind not in (CUDA, CPU):
            raise ValueError(f"kind must be {CUDA!r} or {CPU!r}, not {self.kind!r}")
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; dtypes without a figure use float32's."""
        return self.peak_flops.get(str(dtype), self.peak_flops["float32"])

    def exp_seconds(self) -> float:
        """Seconds one core (CPU) spends per float32 exp: ``math_s`` where measured, else
        :data:`EXP_FLOPS` at the per-core FP32 peak. GPUs: 0, as nobody has timed their
        special-function units here."""
        if self.math_s is not None:
            return self.math_s
        if self.kind == CUDA:
            return 0.0
        return EXP_FLOPS / (self.peak("float32") / max(1, self.cores))

    def gather_seconds(self) -> float:
        """Seconds one core (CPU) spends per element of a gathering transpose: ``gather_s``
        where measured, else :data:`GATHER_BYTES` at the per-core DRAM bandwidth. GPUs: 0
        (nobody has timed one here; dlight's transposes go through shared memory)."""
        if self.gather_s is not None:
            return self.gather_s
        if self.kind == CUDA:
            return 0.0
        return GATHER_BYTES / (self.dram_bw / max(1, self.cores))

    def transpose_seconds(self) -> float:
        """Seconds one core (CPU) spends per element of a lone transpose moving the innermost
        axis: ``transpose_s`` where measured, else :data:`TRANSPOSE_BYTES` at the per-core
        DRAM bandwidth. GPUs: 0, as :meth:`gather_seconds`."""
        if self.transpose_s is not None:
            return self.transpose_s
        if self.kind == CUDA:
            return 0.0
        return TRANSPOSE_BYTES / (self.dram_bw / max(1, self.cores))

    @property
    def parallel_units(self) -> int:
        """Independent processors a kernel spreads over: SMs on a GPU, cores on a CPU."""
        return self.sm_count if self.kind == CUDA else self.cores

    @property
    def key(self) -> str:
        """``<kind>-<chip>``, as TVM names the kind: ``llvm-znver4``, ``cuda-sm_90`` (GPUs of one
        architecture share it): the folder name of this target's records."""
        kind = "cuda" if self.kind == CUDA else "llvm"
        return f"{kind}-{self.arch}" if self.arch else kind

    def tvm_target(self) -> tvm.target.Target:
        """The ``tvm.target.Target`` to compile for (dict form: 0.27 rejects string flags)."""
        if self.kind == CUDA:
            return tvm.target.Target(
                {
                    "kind": "cuda",
                    "arch": self.arch,
                    "max_num_threads": self.max_threads_per_block,
                    "max_threads_per_block": self.max_threads_per_block,
                    "thread_warp_size": self.warp_size,
                    "registers_per_block": self.regs_per_sm,
                    "max_shared_memory_per_block": self.smem_per_block,
                    "l2_cache_size_bytes": self.l2_bytes,
                }
            )
        return tvm.target.Target({"kind": "llvm", "mcpu": self.arch, "num-cores": self.cores})

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["peak_flops"] = dict(self.peak_flops)
        return d

    def replace(self, **changes) -> TargetDesc:
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------- GPU presets
# Vendor datasheet values (NVIDIA H100/H200/A100 datasheets, Hopper/Ampere whitepapers): FP32
# is non-tensor, FP16/BF16 is tensor-core dense (half the sparse figure). Exceptions, marked
# "est.": shared-memory bandwidth = 128 B/clk/SM x boost clock x SMs; L2 bandwidth from
# published microbenchmarks (approximate); launch overheads are typical host-side
# cuLaunchKernel costs with and without CUDA graphs, not datasheet figures.
# Same on sm_80 and sm_90.
_SM_LIMITS = {
    "regs_per_thread": 255,
    "regs_per_sm": 65536,
    "max_threads_per_sm": 2048,
    "max_threads_per_block": 1024,
    "warp_size": 32,
    "smem_per_block": 48 * KiB,
}
_GPU_LAUNCH = {"launch_s": 4e-6, "launch_s_graph": 1e-6}  # est.

H100 = TargetDesc(
    name="h100",
    kind=CUDA,
    arch="sm_90",  # H100 SXM5 80 GB
    peak_flops={"float32": 67e12, "float16": 989.4e12, "bfloat16": 989.4e12},
    dram_bw=3.35e12,  # HBM3
    l1_bytes=256 * KiB,
    l2_bytes=50 * MiB,
    l3_bytes=0,
    l1_bw=128 * 1.98e9 * 132,  # est.: shared memory
    l2_bw=5.5e12,  # est.
    l3_bw=None,
    sm_count=132,
    **_GPU_LAUNCH,
    **_SM_LIMITS,
)
# Same GH100 die and clocks as H100 SXM; 141 GB HBM3e at 4.8 TB/s.
H200 = H100.replace(name="h200", dram_bw=4.8e12)
A100 = TargetDesc(
    name="a100",
    kind=CUDA,
    arch="sm_80",  # A100 SXM4 80 GB (HBM2e); the 40 GB part has 1.555 TB/s
    peak_flops={"float32": 19.5e12, "float16": 312e12, "bfloat16": 312e12},
    dram_bw=2.039e12,
    l1_bytes=192 * KiB,
    l2_bytes=40 * MiB,
    l3_bytes=0,
    l1_bw=128 * 1.41e9 * 108,  # est.: shared memory
    l2_bw=4.8e12,  # est.
    l3_bw=None,
    sm_count=108,
    **_GPU_LAUNCH,
    **_SM_LIMITS,
)
GPU_PRESETS = {d.name: d for d in (H100, H200, A100)}
CUDA_ARCH_DEFAULT = {"sm_90": "h100", "sm_80": "a100"}




def cuda_target(arch: str = "sm_90") -> tvm.target.Target:
    """CUDA target for ``arch`` with the per-block limits of every sm_70+ GPU.

    ``Target({"kind": "cuda", "arch": ...})`` alone carries only ``max_num_threads`` (1024) and
    ``thread_warp_size`` (32); dlight's GEMV rules then warn about the missing shared-memory
    limit. Static shared memory above 48 KiB needs an opt-in TVM does not emit, so 48 KiB is
    the usable limit. There is no H200 tag in TVM 0.27; ``nvidia/nvidia-h100`` is ``sm_90a``.
    """
    return tvm.target.Target({
        "kind": "cuda",
        "arch": arch,
        "max_num_threads": _SM_LIMITS["max_threads_per_block"],
        "max_threads_per_block": _SM_LIMITS["max_threads_per_block"],
        "max_shared_memory_per_block": _SM_LIMITS["smem_per_block"],
        "registers_per_block": _SM_LIMITS["regs_per_sm"],
        "thread_warp_size": _SM_LIMITS["warp_size"],
    })
