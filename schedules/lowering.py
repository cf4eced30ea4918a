"""TVM's TIR lowering with the kernels' register tiles on the stack: the ``"costfuse"`` TIR
pipeline.

Our CPU rules accumulate each output tile in a buffer of its own (``cache_write(.., "local")``
in the contraction, convolution, depthwise and chain kernels), allocated inside the parallel
tile loop. TVM's ``LowerTVMBuiltin`` keeps an allocation on the stack only where its scope is
``global`` and it is under 1 KiB (``runtime::kMaxStackAlloca``); every other becomes a
``TVMBackendAllocWorkspace`` / ``TVMBackendFreeWorkspace`` pair, here once per tile (a 16 x 2
vector tile is 2 KiB). Marked ``disable_lower_builtin`` (TVM's annotation for allocations it
must leave alone), the buffer is an ``alloca`` that TVM's code generator places at the kernel's
entry and LLVM keeps in registers: resnet50 1.08x, mobilenet_v2 1.07x, bert 1.03x end to end
(znver4, 1 thread; ``docs/log/2026-12-06f.md``).

Marked are constant-size buffers of at most :data:`STACK_BYTES` each, :data:`FUNCTION_BYTES`
per function, in functions whose device is the CPU (as ``LowerTVMBuiltin`` decides: the
``device_type`` the packed API records). Larger buffers (a chain's per-block plane of hundreds
of KiB) stay workspace allocations, and so does everything in a GPU build, whose host code
allocates device memory.

``tvm.compile`` takes the pipeline by name: ``tvm.compile(mod, target,
relax_pipeline=tvm_costfuse.pipeline(target), tir_pipeline="costfuse")``. Without it a build
is the same program, with the workspace calls.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

__all__ = ["FUNCTION_BYTES", "STACK_BYTES", "TIR_PIPELINE", "register_tir_pipeline",
           "stack_tiles"]

#: the name ``tvm.compile(..., tir_pipeline=...)`` takes
TIR_PIPELINE = "costfuse"

# Largest buffer put on the stack (a register tile is 0.5-4 KiB), and most per function: a
# kernel's frame stays far below the smallest thread stacks a built library may run on
# (musl's 128 KiB).
STACK_BYTES = 32 * 1024
FUNCTION_BYTES = 64 * 1024
_CPU = 1  # kDLCPU

_ANNOTATION = "disable_lower_builtin"  # tvm::tirx::transform::kDisableLowerTVMBuiltin


def _bytes(buffer) -> int | None:
    size = buffer.dtype.bits * buffer.dtype.lanes // 8
    for extent in buffer.shape:
        if not isinstance(extent, tirx.IntImm):
            return None
        size *= int(extent)
    return size


def _device_types(func: tirx.PrimFunc) -> set[int]:
    found: set[int] = set()

    def visit(stmt):
        if stmt.attr_key == "device_type" and isinstance(stmt.value, tirx.IntImm):
            found.add(int(stmt.value))

    tvm_ffi.structural_walk(func.body, (tirx.AttrStmt, visit))
    return found


@tirx.transform.prim_func_pass(opt_level=0, name="CostFuseStackTiles")
def stack_tiles(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
    """Mark the CPU function's constant-size buffers for the stack (module docstring). Runs
    after TVM's lowering (the packed API records each function's device), before
    ``LowerTVMBuiltin``."""
    if _device_types(func) != {_CPU}:
        return func
    room = [FUNCTION_BYTES]

    def on_stack(alloc: tirx.AllocBuffer) -> tirx.AllocBuffer:
        size = _bytes(alloc.buffer)
        if (size is None or size > min(STACK_BYTES, room[0]) or _ANNOTATION in alloc.annotations
                or alloc.buffer.scope() not in ("local", "global")):
            return alloc
        room[0] -= size
        return tirx.AllocBuffer(alloc.buffer, annotations={
            **alloc.annotations, _ANNOTATION: tirx.IntImm("int32", 1)}, span=alloc.span)

    body = tvm_ffi.structural_map(func.body, (tirx.AllocBuffer, on_stack))
    return func if body.same_as(func.body) else func.with_body(body)


def _pipeline():
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    lower, finalize_host, finalize_device = default_s_tir_pipeline()

    @tvm.transform.module_pass(opt_level=0, name="CostFuseTIRPipeline")
    def _lower(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return stack_tiles(lower(mod))

    return _lower, finalize_host, finalize_device


def register_tir_pipeline() -> None:
    """Register :data:`TIR_PIPELINE` with TVM's TIR pipelines (idempotent)."""
    from tvm.tirx import compilation_pipeline

    if TIR_PIPELINE not in compilation_pipeline.PIPELINE_MAP:
        compilation_pipeline.register_tir_pipeline(TIR_PIPELINE, _pipeline)
