"""CUDA C out of a build: compile for CUDA without a GPU and split the source per kernel.

Codegen to CUDA C needs no GPU (only the CUDA toolkit's ``nvcc`` for register counts, see
:mod:`.registers`).
"""

from __future__ import annotations

import re

import tvm
from tvm import relax
from tvm.target import Target

from ..pipelines import build_pipeline, default_schedule
from ..targets import cuda_target

__all__ = ["compile_cuda", "cuda_module", "cuda_source", "kernel_sources"]


def compile_cuda(
    mod: tvm.IRModule,
    target: Target | None = None,
    fusion_pass: tvm.transform.Pass | None = None,
):
    """Build a Relax module for CUDA (no GPU needed); returns the ``VMExecutable``.

    ``fusion_pass`` None keeps FuseOps. A module of PrimFuncs only (no Relax function) is
    built as TIR, unscheduled functions getting the guarded dlight rules first.
    """
    target = target if target is not None else cuda_target()
    if not any(isinstance(f, relax.Function) for f in mod.functions.values()):
        with target:
            mod = default_schedule(target)(mod)
        return tvm.compile(mod, target=target)
    fusion = fusion_pass if fusion_pass is not None else relax.transform.FuseOps()
    return tvm.compile(mod, target=target, relax_pipeline=build_pipeline(target, fusion))


def cuda_module(ex) -> tvm.runtime.Module:
    """The ``cuda`` runtime module inside an executable's import tree.

    In TVM 0.27 a Relax ``VMExecutable``'s ``.mod`` imports the host ``llvm`` module, which
    imports the ``cuda`` one (``ex.mod.imports[0]`` is host code, not CUDA).
    """
    stack = [getattr(ex, "mod", ex)]
    while stack:
        m = stack.pop()
        if m.kind == "cuda":
            return m
        stack.extend(m.imports)
    raise ValueError("no CUDA module in this executable (no device kernels?)")


def cuda_source(ex) -> str:
    """All kernels' CUDA C as TVM emitted it: one translation unit."""
    return cuda_module(ex).inspect_source()


# TVM writes every kernel as `extern "C" __global__ void [__launch_bounds__(n)] name(...)`, first
# as a forward declaration (`;`) and then defined (`{` ... a `}` alone in column 0).
_KERNEL_HEAD = re.compile(
    r'^extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(.*\)\s*([;{])\s*$',
    re.MULTILINE,
)


def kernel_sources(ex_or_source) -> dict[str, str]:
    """CUDA C per kernel, each a self-contained unit: TVM's preamble plus that kernel.

    Parameters
    ----------
    ex_or_source : VMExecutable, Module or str
        A built executable, or the CUDA source of :func:`cuda_source`.

    Returns
    -------
    dict
        Kernel name (as ptxas reports it, e.g. ``fused_matmul_add_kernel``) -> source, in
        source order.
    """
    src = ex_or_source if isinstance(ex_or_source, str) else cuda_source(ex_or_source)
    heads = list(_KERNEL_HEAD.finditer(src))
    if not heads:
        return {}
    preamble = src[: heads[0].start()]
    out: dict[str, str] = {}
    for m in heads:
        if m.group(2) != "{":
            continue
        end = src.find("\n}", m.end() - 1)
        end = len(src) if end < 0 else end + 2
        out[m.group(1)] = preamble + src[m.start() : end] + "\n"
    return out
