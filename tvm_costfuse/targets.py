"""Target descriptions: the machine figures the cost model prices a fusion group with.

One frozen :class:`TargetDesc` per target. GPU presets (:data:`H100`, :data:`H200`,
:data:`A100`) carry vendor datasheet figures; :func:`host` describes the CPU this process runs
on, from ``/sys`` (caches), LLVM (CPU name, vector features), ``os.sched_getaffinity`` (cores)
and, when present, a calibration record measured by :mod:`tvm_costfuse.calibrate`.

Look-ups: :func:`preset` by name, :func:`for_target` from a ``tvm.target.Target``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import tvm

CUDA, CPU = "cuda", "cpu"
KiB, MiB = 1 << 10, 1 << 20


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
    source: str = "datasheet"  # where the figures came from, e.g. "sysfs+calibrated"

    def __post_init__(self):
        if self.kind not in (CUDA, CPU):
            raise ValueError(f"kind must be {CUDA!r} or {CPU!r}, not {self.kind!r}")
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; dtypes without a figure use float32's."""
        return self.peak_flops.get(str(dtype), self.peak_flops["float32"])

    @property
    def parallel_units(self) -> int:
        """Independent processors a kernel spreads over: SMs on a GPU, cores on a CPU."""
        return self.sm_count if self.kind == CUDA else self.cores

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
_PRESETS = {d.name: d for d in (H100, H200, A100)}
_CUDA_ARCH_DEFAULT = {"sm_90": "h100", "sm_80": "a100"}


# ---------------------------------------------------------------------------- the host CPU
_SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
# Documented fallbacks when neither sysfs nor lscpu report a cache: small, common x86 sizes.
_DEFAULT_CACHES = {"l1_bytes": 32 * KiB, "l2_bytes": 512 * KiB, "l3_bytes": 8 * MiB}
# Conservative figures when no calibration matches this CPU: per core, a shared VM's share of
# DRAM bandwidth, one vector FMA per cycle at an effective 1 GHz under load, and the cost of
# a Relax VM call_tir with thread-pool fork/join (measured 6-11 us on a busy 2-vCPU Zen 4; the
# upper end, since under-counting launches under-rates fusion). `calibrate` replaces them.
_DEFAULT_DRAM_BW_PER_CORE = 4e9
_DEFAULT_EFFECTIVE_HZ = 1e9
_DEFAULT_LAUNCH_S = 1e-5
# A serial call_tir costs the VM's dispatch alone: calibrate measured 0.14 us on a quiet
# 2-vCPU Zen 4 (against 6.3 us for a parallel one); rounded up.
_DEFAULT_LAUNCH_SERIAL_S = 2e-7


def host_cpu() -> str:
    """LLVM's name for this CPU (``mcpu="native"`` silently means generic SSE2 in TVM 0.27)."""
    return str(tvm.target.codegen.llvm_get_system_cpu())


def host_cpu_model() -> str:
    """The ``model name`` line of /proc/cpuinfo ("" when absent)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _host_features() -> set[str]:
    target = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu()})
    return set(tvm.target.codegen.llvm_get_cpu_features(target))


def host_vector_bits(features: set[str] | None = None) -> int:
    features = _host_features() if features is None else features
    return 512 if "avx512f" in features else 256 if "avx2" in features else 128


def _parse_size(text: str) -> int:
    """'32K', '1024K', '32 MiB', '64 KiB (2 instances)' -> bytes."""
    m = re.match(r"\s*([\d.]+)\s*([KMG]?)", text)
    if not m:
        raise ValueError(f"cannot parse cache size {text!r}")
    return int(float(m.group(1)) * {"": 1, "K": KiB, "M": MiB, "G": 1 << 30}[m.group(2)])


def _sysfs_caches() -> dict[str, int]:
    found = {}
    for index in sorted(_SYSFS_CACHE.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and 1 <= level <= 3:
            found[f"l{level}_bytes"] = size
    return found


def _lscpu_caches() -> dict[str, int]:
    """lscpu prints totals over instances ("64 KiB (2 instances)"): divide L1/L2 per core."""
    try:
        out = subprocess.run(
            ["lscpu"], check=False, capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for key, name in (
        ("L1d cache", "l1_bytes"),
        ("L2 cache", "l2_bytes"),
        ("L3 cache", "l3_bytes"),
    ):
        m = re.search(rf"^{key}:\s*(.+)$", out, re.MULTILINE)
        if not m:
            continue
        size = _parse_size(m.group(1).replace("iB", "").replace("B", ""))
        inst = re.search(r"\((\d+) instances?\)", m.group(1))
        found[name] = size // int(inst.group(1)) if inst and name != "l3_bytes" else size
    return found


def host_caches() -> dict:
    """Cache sizes of cpu0 (L1d, L2 per core; L3 shared) and where they came from."""
    caches = _sysfs_caches()
    source = "sysfs"
    if len(caches) < 2:  # no L1/L2 in sysfs (containers, some VMs): ask lscpu, then defaults
        caches = _lscpu_caches() | caches
        source = "lscpu"
        if len(caches) < 2:
            caches = _DEFAULT_CACHES | caches
            source = "default-caches"
    caches.setdefault("l3_bytes", 0)
    caches.setdefault("l2_bytes", _DEFAULT_CACHES["l2_bytes"])
    caches.setdefault("l1_bytes", _DEFAULT_CACHES["l1_bytes"])
    return caches | {"source": source}


def _calibration_record(calibration) -> dict | None:
    if calibration is False or calibration is None:
        return None
    if isinstance(calibration, Mapping):
        return dict(calibration)
    from . import calibrate  # calibrate imports this module

    return calibrate.load(None if calibration is True else calibration)


def host(num_cores: int | None = None, calibration=True) -> TargetDesc:
    """This machine's CPU.

    ``calibration``: True reads the default calibration file, a path reads that file, a dict
    is a :func:`tvm_costfuse.calibrate.measure` record, False uses the conservative defaults.
    A record is used only when measured on this CPU with the same core count; its figures
    replace the defaults and ``source`` says which were used ("sysfs+calibrated",
    "sysfs+default", ...).
    """
    cores = num_cores or len(os.sched_getaffinity(0))
    features = _host_features()
    vector_bits = host_vector_bits(features)
    lanes = vector_bits // 32
    caches = host_caches()
    flops = cores * _DEFAULT_EFFECTIVE_HZ * lanes * 2
    figures = {
        "dram_bw": _DEFAULT_DRAM_BW_PER_CORE * cores,
        "fp32_flops": flops,
        "launch_s": _DEFAULT_LAUNCH_S,
        "launch_s_serial": _DEFAULT_LAUNCH_SERIAL_S,
        "l2_bw": None,
        "l3_bw": None,
    }
    record = _calibration_record(calibration)
    figure_source = "default"
    if record and record.get("num_cores") == cores:
        figures |= record["figures"]
        figure_source = "calibrated"
    fp32 = figures["fp32_flops"]
    return TargetDesc(
        name="host",
        kind=CPU,
        arch=host_cpu(),
        # No native FP16 arithmetic assumed: TVM's LLVM code widens half types to float32.
        peak_flops={"float32": fp32, "float16": fp32, "bfloat16": fp32},
        dram_bw=figures["dram_bw"],
        l1_bytes=caches["l1_bytes"],
        l2_bytes=caches["l2_bytes"],
        l3_bytes=caches["l3_bytes"],
        l1_bw=None,
        l2_bw=figures["l2_bw"],
        l3_bw=figures["l3_bw"],
        launch_s=figures["launch_s"],
        launch_s_graph=figures["launch_s"],
        launch_s_serial=figures["launch_s_serial"],
        cores=cores,
        vector_bits=vector_bits,
        vector_regs=32 if vector_bits == 512 else 16,
        source=f"{caches['source']}+{figure_source}",
    )


# ---------------------------------------------------------------------------- look-ups
def preset_names() -> list[str]:
    return [*_PRESETS, "host"]


def preset(name: str) -> TargetDesc:
    """A target description by name, case-insensitive: h100, h200, a100 or host."""
    key = name.strip().lower()
    if key == "host":
        return host()
    if key not in _PRESETS:
        raise ValueError(f"unknown target {name!r}; valid names: {', '.join(preset_names())}")
    return _PRESETS[key]


def for_target(target, gpu: str | None = None) -> TargetDesc:
    """The description for a ``tvm.target.Target`` (or its dict / string / tag form).

    llvm -> :func:`host` (with the target's ``num-cores`` when set); cuda -> the preset named
    ``gpu`` when given, else by arch (sm_90/sm_90a -> h100, sm_80 -> a100).
    """
    target = tvm.target.Target(target)
    kind = target.kind.name
    if kind == "llvm":
        cores = target.attrs.get("num-cores")
        return host(num_cores=int(cores) if cores else None)
    if kind == "cuda":
        if gpu is not None:
            return preset(gpu)
        arch = re.sub(r"[a-z]$", "", str(target.attrs.get("arch", "")))  # sm_90a -> sm_90
        if arch not in _CUDA_ARCH_DEFAULT:
            raise ValueError(
                f"no preset for CUDA arch {arch!r}; known: {sorted(_CUDA_ARCH_DEFAULT)} "
                f"(pass gpu= one of {', '.join(_PRESETS)})"
            )
        return _PRESETS[_CUDA_ARCH_DEFAULT[arch]]
    raise ValueError(f"no target description for TVM target kind {kind!r} (llvm or cuda)")
