"""What an LLVM CPU target offers a schedule: cores, SIMD width, vector registers.

One derivation, read by the schedule rules (``schedules/``) and by the host's description
(:mod:`.machine`), so a kernel and its price agree on the machine. Everything is read from the
target itself (its ``mcpu``'s features and ``num-cores``), never from the machine compiling
it: an AVX2 target compiled on an AVX-512 host gets AVX2 tiles.

``tvm.target.codegen.llvm_get_vector_width`` is not used: in TVM 0.27 it answers 512 for every
x86 ``mcpu`` (haswell and generic x86-64 included).
"""

from __future__ import annotations

import functools
import os

import tvm
from tvm.target import Target


@functools.lru_cache(maxsize=64)
def _features(mcpu: str, mtriple: str) -> frozenset[str]:
    spec = {"kind": "llvm", "mcpu": mcpu} if mcpu else {"kind": "llvm"}
    if mtriple:
        spec["mtriple"] = mtriple
    return frozenset(tvm.target.codegen.llvm_get_cpu_features(Target(spec)))


def cpu_features(target: Target) -> frozenset[str]:
    """LLVM's feature names (``avx2``, ``avx512f``...) for the target's ``mcpu``."""
    attrs = target.attrs
    return _features(str(attrs.get("mcpu", "") or ""), str(attrs.get("mtriple", "") or ""))


def vector_bits(target: Target) -> int:
    """SIMD register width in bits: 512 with AVX-512F, 256 with AVX2, else 128."""
    features = cpu_features(target)
    return 512 if "avx512f" in features else 256 if "avx2" in features else 128


def vector_lanes(target: Target, dtype: str) -> int:
    """SIMD lanes for ``dtype`` on ``target`` (AVX-512 float32: 16, AVX2: 8)."""
    return max(vector_bits(target) // tvm.DataType(dtype).bits, 1)


def vector_registers(target: Target) -> int:
    """Architectural vector registers: 32 with AVX-512 (zmm0-31), else 16 (ymm0-15)."""
    return 32 if vector_bits(target) >= 512 else 16


def num_cores(target: Target) -> int:
    """Cores the target declares (``num-cores``), else the cores this process may use."""
    n = target.attrs.get("num-cores", None)
    if n is not None and int(n) > 0:
        return int(n)
    return len(os.sched_getaffinity(0))
