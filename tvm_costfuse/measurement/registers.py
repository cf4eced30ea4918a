"""Register-pressure ground truth: what the backend compilers report per kernel.

- CUDA: ``nvcc --resource-usage`` (ptxas) gives registers, spill bytes, stack frame and shared
  memory per kernel (:func:`ptxas_report`, parser :func:`parse_resource_usage`). No GPU needed.
- x86: TVM's assembly has no spill comments, so :func:`cpu_spill_report` re-emits TVM's LLVM IR
  with llvmlite (same LLVM major) in verbose mode and counts ``# N-byte Spill`` / ``Reload``
  lines per kernel. Needs ``pip install 'tvm_costfuse[llvm]'``.
- :func:`cuda_register_report` compiles a (zoo) model for sm_90 and lists both per kernel.

These measure what a fusion choice did to register pressure; nothing here changes IR.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

import tvm

from .. import models
from ..targets import cuda_target
from . import cuda_source as cuda

__all__ = [
    "KernelResources",
    "KernelRow",
    "SpillCount",
    "count_asm_spills",
    "cpu_spill_report",
    "cuda_register_report",
    "find_nvcc",
    "parse_resource_usage",
    "ptxas_report",
]


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one kernel (all sizes in bytes)."""

    registers: int
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_frame_bytes: int = 0
    shared_memory_bytes: int = 0

    @property
    def spills(self) -> bool:
        """Whether registers spilled to local memory."""
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


@dataclass(frozen=True)
class SpillCount:
    """Spill/reload instructions that LLVM's register allocator inserted in one kernel."""

    spills: int = 0
    reloads: int = 0
    spill_bytes: int = 0
    reload_bytes: int = 0

    def __add__(self, other: SpillCount) -> SpillCount:
        return SpillCount(
            self.spills + other.spills,
            self.reloads + other.reloads,
            self.spill_bytes + other.spill_bytes,
            self.reload_bytes + other.reload_bytes,
        )


@dataclass(frozen=True)
class KernelRow:
    """One line of :func:`cuda_register_report`."""

    kernel: str
    threads: int | None  # __launch_bounds__ (threads per block), None when absent
    resources: KernelResources

    @property
    def func(self) -> str:
        """The PrimFunc (fused group) that launches this kernel. A PrimFunc with several
        top-level blocks that no rule could merge launches ``k_kernel``, ``k_kernel_1``..."""
        return re.sub(r"_kernel(?:_\d+)?$", "", self.kernel)


# ---------------------------------------------------------------------------------------------
# CUDA: ptxas resource usage
# ---------------------------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_resource_usage(text: str) -> dict[str, KernelResources]:
    """Per-kernel resources from ``nvcc/ptxas --resource-usage`` output (CUDA 12/13 format).

    Only entry functions (kernels) are reported; ``Function properties`` of device functions
    that are not entries are ignored. Lines of other tools (warnings, ``Compile time``) may be
    mixed in.
    """
    fields: dict[str, dict[str, int]] = {}
    entry: str | None = None  # the kernel the next "Used ..." line belongs to
    props_for: str | None = None  # the function the next stack-frame line belongs to
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            entry = props_for = m.group(1)
            fields[entry] = {}
        elif m := _PROPS.search(line):
            props_for = m.group(1)
        elif m := _FRAME.search(line):
            if props_for is not None and props_for == entry:
                frame, stores, loads = map(int, m.groups())
                fields[entry].update(
                    stack_frame_bytes=frame, spill_store_bytes=stores, spill_load_bytes=loads
                )
            props_for = None
        elif (m := _USED.search(line)) and entry is not None:
            fields[entry]["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                fields[entry]["shared_memory_bytes"] = int(s.group(1))
            entry = None
    return {k: KernelResources(**v) for k, v in fields.items() if "registers" in v}


def find_nvcc() -> str | None:
    """Path of ``nvcc`` (PATH, then ``$CUDA_HOME/bin``, then ``/usr/local/cuda/bin``)."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\(\s*\d+\s*\)\s*")


def ptxas_report(
    cuda_source: str,
    arch: str = "sm_90",
    *,
    strip_launch_bounds: bool = False,
    maxrregcount: int | None = None,
    timeout: float = 600.0,
) -> dict[str, KernelResources]:
    """Compile CUDA C to a cubin with ``nvcc -O3 --resource-usage`` and parse the report.

    Parameters
    ----------
    cuda_source : str
        A whole translation unit, e.g. ``cuda_source.cuda_source(ex)``.
    arch : str
        ``sm_XX`` to compile for.
    strip_launch_bounds : bool
        Remove ``__launch_bounds__(n)``. TVM emits it on every kernel and it overrides
        ``-maxrregcount`` (ptxas then ignores the cap).
    maxrregcount : int, optional
        Register cap per thread; requires ``strip_launch_bounds`` when the source has launch
        bounds, since it would silently have no effect.

    Raises
    ------
    FileNotFoundError
        No ``nvcc``.
    RuntimeError
        nvcc failed; the message holds its output.
    """
    if maxrregcount is not None and not strip_launch_bounds and _LAUNCH_BOUNDS.search(cuda_source):
        raise ValueError(
            "maxrregcount has no effect on kernels with __launch_bounds__: "
            "pass strip_launch_bounds=True"
        )
    nvcc = find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (CUDA toolkit needed for ptxas_report)")
    if strip_launch_bounds:
        cuda_source = _LAUNCH_BOUNDS.sub("", cuda_source)
    with tempfile.TemporaryDirectory(prefix="costfuse_ptxas_") as tmp:
        src = os.path.join(tmp, "kernels.cu")
        with open(src, "w") as f:
            f.write(cuda_source)
        # -w: TVM's code triggers thousands of harmless warnings (unused cse_v*, float literals).
        cmd = [
            nvcc,
            "-cubin",
            f"-arch={arch}",
            "-O3",
            "--resource-usage",
            "-w",
            "-o",
            os.path.join(tmp, "kernels.cubin"),
            src,
        ]
        if maxrregcount is not None:
            cmd.append(f"-maxrregcount={int(maxrregcount)}")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed ({proc.returncode}):\n{out[-4000:]}")
    return parse_resource_usage(out)


# ---------------------------------------------------------------------------------------------
# x86: spills in LLVM's verbose assembly
# ---------------------------------------------------------------------------------------------

# `vmovups %zmm1, 128(%rsp)  # 64-byte Spill`, `... # 32-byte Folded Reload`
_SPILL = re.compile(r"#\s*(\d+)-byte (?:Folded )?(Spill|Reload)\b")
_ASM_LABEL = re.compile(r"^(?:\.L)?([A-Za-z_$.][\w$.]*):")
_DEFINE = re.compile(r"^define ([^@]*)@\"?([\w$.]+)\"?\(", re.MULTILINE)
_LAMBDA = re.compile(r"__tvm_parallel_lambda(?:\.\d+)?")
_TARGET_CPU = re.compile(r'"target-cpu"="([^"]+)"')


def _kernel_of(func: str) -> str | None:
    """TVM kernel a generated function belongs to: ``__tvm_ffi_k`` (packed wrapper) and
    ``k_compute_`` (body) both give ``k``; other ``__`` helpers give None."""
    if func.startswith("__tvm_ffi_"):
        return func[len("__tvm_ffi_") :]
    if func.startswith("__"):
        return None
    return func.split("_compute_")[0]


def _function_owners(llvm_ir: str) -> dict[str, str]:
    """Defined function -> kernel; parallel lambdas go to the kernel whose body launches them
    (TVM names them all ``__tvm_parallel_lambda[.N]``)."""
    defs = list(_DEFINE.finditer(llvm_ir))
    owners: dict[str, str] = {}
    for i, m in enumerate(defs):
        linkage, name = m.groups()
        kernel = _kernel_of(name)
        # weak: TVM's `__tvm_ffi_main` alias of a one-function module and fp16 helpers
        if kernel is None or "weak " in linkage:
            continue
        owners[name] = kernel
        body = llvm_ir[m.end() : defs[i + 1].start() if i + 1 < len(defs) else len(llvm_ir)]
        for lam in set(_LAMBDA.findall(body)):
            owners.setdefault(lam, kernel)
    return owners


def count_asm_spills(asm: str, owners: dict[str, str] | None = None) -> dict[str, SpillCount]:
    """Spill/Reload comment lines per function of verbose x86 assembly.

    ``owners`` maps function names to the key to count under (functions not in it are
    skipped); None counts every labelled function under its own name.
    """
    counts: dict[str, SpillCount] = {}
    current: str | None = None
    for line in asm.splitlines():
        if (m := _ASM_LABEL.match(line)) and (owners is None or m.group(1) in owners):
            if owners is not None or not line.startswith(".L"):
                current = owners[m.group(1)] if owners is not None else m.group(1)
                counts.setdefault(current, SpillCount())
            continue
        if current is None or "#" not in line:
            continue
        if m := _SPILL.search(line):
            size = int(m.group(1))
            one = SpillCount(1, 0, size, 0) if m.group(2) == "Spill" else SpillCount(0, 1, 0, size)
            counts[current] = counts[current] + one
    return counts


def _llvm_ir(ex_or_llvm_ir) -> str:
    if isinstance(ex_or_llvm_ir, str):
        return ex_or_llvm_ir
    stack = [getattr(ex_or_llvm_ir, "mod", ex_or_llvm_ir)]
    while stack:
        m = stack.pop()
        if m.kind == "llvm":
            return m.inspect_source("ll")
        stack.extend(m.imports)
    raise ValueError("no llvm module in this executable")


def _emit_assembly(machine, module) -> str:
    """Verbose assembly of ``module`` as text.

    llvmlite's ``emit_assembly`` decodes strict UTF-8, but LLVM's verbose comments quote data
    bytes raw (``.byte 255  # \\xff`` in DWARF location lists of a float constant such as
    -FLT_MAX), so the bytes are decoded here with undecodable ones replaced: only ASCII comment
    text (``# N-byte Spill``) and labels are matched.
    """
    emit = getattr(machine, "_emit_to_memory", None)
    if emit is None:  # a llvmlite without the raw-bytes entry point
        return machine.emit_assembly(module)
    return emit(module, use_object=False).decode("utf-8", errors="replace")


def cpu_spill_report(ex_or_llvm_ir, mcpu: str | None = None) -> dict[str, SpillCount]:
    """Spills and reloads per kernel of a CPU build, counted in LLVM's verbose assembly.

    Parameters
    ----------
    ex_or_llvm_ir : VMExecutable, Module or str
        A CPU build (its ``llvm`` module's IR is used) or LLVM IR text.
    mcpu : str, optional
        CPU to generate code for; default: the ``"target-cpu"`` TVM wrote into the IR, else
        this machine's. Functions carrying their own ``target-cpu`` attribute keep it, so pass
        the ``mcpu`` the module was built with.

    Returns
    -------
    dict
        Kernel name (TVM's PrimFunc name, e.g. ``fused_matmul_add``) -> :class:`SpillCount`;
        every kernel appears, spill-free ones with zeros.
    """
    try:
        import llvmlite.binding as llvm
    except ImportError as err:
        raise ImportError(
            "cpu_spill_report needs llvmlite: pip install 'tvm_costfuse[llvm]'"
        ) from err
    ir = _llvm_ir(ex_or_llvm_ir)
    if mcpu is None:
        found = _TARGET_CPU.search(ir)
        mcpu = found.group(1) if found else tvm.target.codegen.llvm_get_system_cpu()
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        module = llvm.parse_assembly(ir)
    except RuntimeError as err:  # IR of a newer LLVM than llvmlite's
        raise RuntimeError(
            f"llvmlite (LLVM {llvm.llvm_version_info[0]}) cannot parse TVM's IR (LLVM "
            f"{tvm.target.codegen.llvm_version_major()}): install a matching llvmlite"
        ) from err
    target = llvm.Target.from_triple(module.triple or llvm.get_process_triple())
    # opt=3 like TVM; the IR TVM keeps is already optimised, this only runs codegen.
    machine = target.create_target_machine(cpu=mcpu, opt=3, reloc="pic", codemodel="default")
    machine.set_asm_verbosity(True)
    owners = _function_owners(ir)
    counts = count_asm_spills(_emit_assembly(machine, module), owners)
    return {k: counts.get(k, SpillCount()) for k in dict.fromkeys(owners.values())}


# ---------------------------------------------------------------------------------------------
# Whole models
# ---------------------------------------------------------------------------------------------

_LAUNCH = re.compile(r"__global__ void __launch_bounds__\((\d+)\) (\w+)\(")


def cuda_register_report(
    mod_or_name: tvm.IRModule | str,
    fusion_pass: tvm.transform.Pass | None = None,
    *,
    arch: str = "sm_90",
    small: bool = False,
) -> list[KernelRow]:
    """Compile for CUDA ``arch`` (FuseOps or ``fusion_pass``, dlight rules) and ptxas it.

    Parameters
    ----------
    mod_or_name : IRModule or str
        A Relax module or a zoo model name (``small`` picks its small variant).

    Returns
    -------
    list of KernelRow
        One per kernel, in the order TVM emitted them.
    """
    if isinstance(mod_or_name, str):
        mod_or_name, _ = models.load(mod_or_name, small=small)
    ex = cuda.compile_cuda(mod_or_name, cuda_target(arch), fusion_pass)
    src = cuda.cuda_source(ex)
    report = ptxas_report(src, arch)
    threads = {name: int(n) for n, name in _LAUNCH.findall(src)}
    return [KernelRow(k, threads.get(k), report[k]) for k in _kernels_in_order(src, report)]


def _kernels_in_order(src: str, report: dict[str, KernelResources]) -> Iterable[str]:
    names = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', src)
    seen = [k for k in dict.fromkeys(names) if k in report]
    return seen + [k for k in report if k not in seen]
