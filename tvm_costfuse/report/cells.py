"""One compare cell: a (model, strategy, target) with what was counted, predicted and measured,
and the register figures of its kernels as the backend compilers report them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from ..measurement.cuda_source import cuda_source, kernel_sources
from ..measurement.registers import cpu_spill_report, find_nvcc, ptxas_report

__all__ = ["CSV_FIELDS", "Cell", "KernelRegs", "cpu_regs", "cuda_regs", "is_shape_func",
           "kernel_regs"]

# The host PrimFuncs Relax's VMShapeLower adds to a model with symbolic shapes (``shape_func``,
# then ``shape_func1``... as names repeat): they compute the shapes at run time. The VM calls
# them like kernels, in every strategy alike, but no fusion forms them and no plan counts them.
_SHAPE_FUNC = re.compile(r"shape_func\d*")


def is_shape_func(symbol: str) -> bool:
    """Whether a called or compiled function is the VM's shape computation, not a kernel."""
    return _SHAPE_FUNC.fullmatch(symbol) is not None


@dataclass(frozen=True)
class KernelRegs:
    """Backend-reported resources of one compiled kernel."""

    kernel: str
    registers: int | None  # CUDA: ptxas; CPU: None (LLVM reports spills only)
    spill_bytes: int  # CUDA: spill stores; CPU: bytes of Spill instructions


@dataclass(frozen=True)
class Cell:
    """One (model, strategy, target) result; ``error`` is set when it failed."""

    model: str
    strategy: str
    target: str
    error: str = ""
    kernels: int | None = None
    intermediate_bytes: int | None = None
    predicted_s: float | None = None
    flops: float | None = None
    min_bytes: int | None = None  # compulsory traffic: model inputs, weights, outputs
    roofline_s: float | None = None
    measured_s: float | None = None
    roofline_fraction: float | None = None
    built_kernels: int | None = None
    launched_kernels: int | None = None  # measured targets: kernel calls of one run of `main`
    max_registers: int | None = None
    spilling_kernels: int | None = None
    spill_bytes: int | None = None
    max_mismatch: float | None = None
    numerics: str = ""  # "ok", "MISMATCH", or "" when not measured
    compile_s: float | None = None
    note: str = ""
    kernel_regs: tuple[KernelRegs, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        return not self.error


CSV_FIELDS = [f.name for f in fields(Cell) if f.name != "kernel_regs"]


def cuda_regs(ex) -> tuple[tuple[KernelRegs, ...], str]:
    kernels = list(kernel_sources(ex))
    if find_nvcc() is None:
        return tuple(KernelRegs(k, None, 0) for k in kernels), "no nvcc: registers unknown"
    # One nvcc call for the whole unit: ptxas allocates registers per entry all the same.
    report = ptxas_report(cuda_source(ex))
    rows = []
    for k in kernels + [k for k in report if k not in kernels]:
        r = report.get(k)
        rows.append(KernelRegs(k, r.registers if r else None, r.spill_store_bytes if r else 0))
    return tuple(rows), ""


def cpu_regs(ex) -> tuple[tuple[KernelRegs, ...], str]:
    try:
        report = cpu_spill_report(ex)
    except ImportError as err:
        return (), str(err)
    return tuple(KernelRegs(k, None, s.spill_bytes) for k, s in report.items()
                 if not is_shape_func(k)), ""


# What each target kind's build says about its kernels' registers: ptxas per CUDA kernel,
# spills counted in the CPU assembly.
_REGS_BY_KIND = {"cuda": cuda_regs, "llvm": cpu_regs}


def kernel_regs(ex, kind: str) -> tuple[tuple[KernelRegs, ...], str]:
    """The register report of a module built for a TVM target of ``kind`` (``llvm``, ``cuda``)."""
    if kind not in _REGS_BY_KIND:
        raise ValueError(f"registers are read for {' and '.join(_REGS_BY_KIND)} builds, "
                         f"not {kind!r}")
    return _REGS_BY_KIND[kind](ex)
