"""The host CPU's description: caches from ``/sys``, ISA from LLVM, cores from the affinity
mask and a calibration record measured on this CPU by
:mod:`tvm_costfuse.measurement.calibrate` (stored by :mod:`.calibration`).
"""

from __future__ import annotations

import logging
import math
import os
import re
import subprocess
from collections.abc import Mapping
from numbers import Real
from pathlib import Path

import tvm

from . import calibration as _store
from . import isa
from .calibration import calibrated_on_first_use, load_calibration
from .cpu_id import host_cpu
from .desc import CPU, KiB, MiB, TargetDesc

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
# What a record's figures must be for the cost model to use them: bandwidths and FLOP/s divide
# (> 0), and an exp that cost nothing would make every math call free (> 0); launch costs add,
# and calibrate floors them at 0 when timer noise swamps one (>= 0). l2_bw, l3_bw and math_s
# may be None (not measured; records from before math_s lack it: ``TargetDesc.exp_seconds``
# derives it from the peak); a figure a record leaves out keeps its default.
# The depthwise kernels' shares (``measurement/depthwise_shares.py``, which names its figures
# by this tuple), in the order of ``TargetDesc.depthwise_shares``, may be missing too (records
# from before them): ``efficiency.py``'s fitted shares price those kernels then.
SHARE_FIGURES = ("depthwise_s1", "depthwise_s2", "channels_last_s1", "channels_last_s2")
_POSITIVE_FIGURES = ("dram_bw", "fp32_flops", "l2_bw", "l3_bw", "math_s", "gather_s",
                     "transpose_s", *SHARE_FIGURES)
_NONNEGATIVE_FIGURES = ("launch_s", "launch_s_serial")
_OPTIONAL_FIGURES = ("l2_bw", "l3_bw", "math_s", "gather_s", "transpose_s", *SHARE_FIGURES)

_log = logging.getLogger(__name__)
_noticed: set[str] = set()  # the notices given in this process (see _notice)
_failed: set[tuple[str, int]] = set()  # (record file, cores) whose first use raised: not retried


def host_target(num_cores: int | None = None) -> tvm.target.Target:
    """LLVM target for this machine's CPU, with its real ISA.

    ``mcpu="native"`` silently becomes generic SSE2 in TVM 0.27, and string targets with flags
    are rejected, hence the dict form with the name LLVM detects.

    Parameters
    ----------
    num_cores : int, optional
        Threads the kernels may use; defaults to the cores this process may run on.
    """
    n = num_cores if num_cores is not None else len(os.sched_getaffinity(0))
    return tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": int(n)})


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


def _notice(message: str) -> None:
    """Warn once per process: host() runs for every plan, a notice per plan would bury it."""
    if message not in _noticed:
        _noticed.add(message)
        _log.warning(message)


def _calibration_record(calibration, cores: int) -> dict | None:
    """The record ``calibration`` names, or None. A calibration problem (a file that is not a
    record, a measurement that fails) costs a notice and the defaults, never the plan; a
    failed first use is not measured again in this process, as it costs seconds each time."""
    if calibration is False or calibration is None:
        return None
    if isinstance(calibration, Mapping):
        return dict(calibration)
    where = str(_store.CALIBRATION_PATH if calibration is True else calibration)
    if (where, cores) in _failed:
        return None
    try:
        if calibration is True:
            return calibrated_on_first_use(cores)
        return load_calibration(calibration, cores)
    except Exception as err:  # noqa: BLE001 -- whatever went wrong, the defaults still price
        _failed.add((where, cores))
        _notice(f"host calibration ({where}) failed, the defaults price plans: "
                f"{type(err).__name__}: {err}")
        return None


def _bad_figure(figures) -> str | None:
    """The first figure a record holds that the cost model cannot use, as ``name = value``:
    a bandwidth of 0 divided by zero and a negative or infinite one gave negative or absurd
    times. None when every figure is usable."""
    if not isinstance(figures, Mapping):
        return f"figures = {figures!r}"
    for name in _POSITIVE_FIGURES + _NONNEGATIVE_FIGURES:
        if name not in figures or (figures[name] is None and name in _OPTIONAL_FIGURES):
            continue
        value = figures[name]
        if (not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(value)
                or value < 0 or (value == 0 and name in _POSITIVE_FIGURES)):
            return f"{name} = {value!r}"
    return None


def host(num_cores: int | None = None, calibration=True, mcpu: str | None = None) -> TargetDesc:
    """This machine's CPU, or the CPU named ``mcpu`` in this machine's memory system.

    ``calibration``: True takes the default file's record, measuring it on first use
    (:mod:`.calibration`), a path reads that file, a dict
    is a :func:`tvm_costfuse.measurement.calibrate.measure` record, False uses the conservative defaults.
    A record is used only when measured on this CPU with the same core count; its figures
    replace the defaults and ``source`` says which were used ("sysfs+calibrated",
    "sysfs+default", ...). ``mcpu`` (a cross-compiled LLVM target's CPU) takes its vector
    width and registers from that CPU; a calibration of this host does not apply to it.
    """
    cores = num_cores or len(os.sched_getaffinity(0))
    target = host_target(cores) if mcpu is None else tvm.target.Target(
        {"kind": "llvm", "mcpu": mcpu, "num-cores": cores})
    bits = isa.vector_bits(target)
    lanes = bits // 32
    caches = host_caches()
    flops = cores * _DEFAULT_EFFECTIVE_HZ * lanes * 2
    figures = {
        "dram_bw": _DEFAULT_DRAM_BW_PER_CORE * cores,
        "fp32_flops": flops,
        "launch_s": _DEFAULT_LAUNCH_S,
        "launch_s_serial": _DEFAULT_LAUNCH_SERIAL_S,
        "l2_bw": None,
        "l3_bw": None,
        "math_s": None,
        "gather_s": None,
        "transpose_s": None,
    } | dict.fromkeys(SHARE_FIGURES)
    record = _calibration_record(calibration, cores) if mcpu in (None, host_cpu()) else None
    figure_source = "default"
    if record and record.get("num_cores") == cores:
        bad = _bad_figure(record.get("figures"))
        if bad is None:
            figures |= {k: v for k, v in record["figures"].items() if k in figures}
            figure_source = "calibrated"
        else:
            _notice(f"calibration record for {record.get('cpu')}, {cores} cores ignored: "
                    f"{bad} is not a positive finite number; the defaults price plans "
                    "(`costfuse calibrate` measures the host again)")
    fp32 = figures["fp32_flops"]
    return TargetDesc(
        name="host",
        kind=CPU,
        arch=mcpu or host_cpu(),
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
        vector_bits=bits,
        vector_regs=isa.vector_registers(target),
        math_s=figures["math_s"],
        gather_s=figures["gather_s"],
        transpose_s=figures["transpose_s"],
        depthwise_shares=(None if any(figures[k] is None for k in SHARE_FIGURES)
                          else tuple(float(figures[k]) for k in SHARE_FIGURES)),
        source=f"{caches['source']}+{figure_source}",
    )
