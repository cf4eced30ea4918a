"""TVM's TIR lowering with the kernels' register tiles on the stack: the ``"costfuse"`` TIR
pipeline.

Our CPU rules accumulate each output tile in a buffer of its own (``cache_write(.., "local")``
in the contraction, convolution, depthwise and chain kernels), allocated inside the parallel
tile loop. TVM's ``LowerTVMBuiltin`` puts an allocation on the stack only where its scope is
``global`` and it is under 1 KiB (``runtime::kMaxStackAlloca``); every other one becomes a
``TVMBackendAllocWorkspace`` / ``TVMBackendFreeWorkspace`` pair, here once per tile: a 16 x 2
vector tile is 2 KiB. Marked ``disable_lower_builtin`` (TVM's own annotation for allocations it
must leave alone), the buffer is an ``alloca`` LLVM hoists to the kernel's entry and keeps in
registers. Measured end to end (znver4, 1 thread, one process, outputs bit-equal): resnet50
85.6 -> 78.6 ms (1.09x), mobilenet_v2 1.09x, bert 1.03x, a llama decode step 1.04x,
efficientnet_b0 1.005x; marking only the buffers under 1 KiB gave mobilenet_v2 1.006x, so the
tiles of 1-4 KiB are the ones that count (``docs/log/2026-12-06f.md``).

Only constant-size buffers up to :data:`STACK_BYTES` in CPU (``llvm``) functions are marked;
larger ones (a chain's per-block plane of hundreds of KiB) stay workspace allocations, which a
thread's stack could not hold, and device kernels are left as TVM lowers them.

``tvm.compile`` takes the pipeline by name: ``tvm.compile(mod, target,
relax_pipeline=tvm_costfuse.pipeline(target), tir_pipeline="costfuse")``. Without it a build
is the same program, with the workspace calls.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

__all__ = ["STACK_BYTES", "TIR_PIPELINE", "register_tir_pipeline", "stack_tiles"]

#: the name ``tvm.compile(..., tir_pipeline=...)`` takes
TIR_PIPELINE = "costfuse"

# Largest buffer put on the stack: a register tile is 0.5-4 KiB; 32 KiB leaves a worker
# thread's 8 MiB stack room for every kernel's few tiles.
STACK_BYTES = 32 * 1024

_ANNOTATION = "disable_lower_builtin"  # tvm::tirx::transform::kDisableLowerTVMBuiltin


def _bytes(buffer) -> int | None:
    size = buffer.dtype.bits * buffer.dtype.lanes // 8
    for extent in buffer.shape:
        if not isinstance(extent, tirx.IntImm):
            return None
        size *= int(extent)
    return size


def _on_stack(alloc: tirx.AllocBuffer) -> tirx.AllocBuffer:
    size = _bytes(alloc.buffer)
    if size is None or size > STACK_BYTES or _ANNOTATION in alloc.annotations:
        return alloc
    if alloc.buffer.scope() not in ("local", "global"):
        return alloc
    return tirx.AllocBuffer(alloc.buffer, annotations={
        **alloc.annotations, _ANNOTATION: tirx.IntImm("int32", 1)})


def _is_cpu(func: tirx.PrimFunc) -> bool:
    target = func.attrs.get("target") if func.attrs is not None else None
    return target is not None and target.kind.name == "llvm"


@tirx.transform.prim_func_pass(opt_level=0, name="CostFuseStackTiles")
def stack_tiles(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
    """Mark the CPU function's constant-size buffers up to :data:`STACK_BYTES` for the stack
    (module docstring). Runs after TVM's lowering, before ``LowerTVMBuiltin``."""
    if not _is_cpu(func):
        return func
    body = tvm_ffi.structural_map(func.body, (tirx.AllocBuffer, _on_stack))
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
