"""Seconds one core spends per element of a transpose, gathering or tiled, on this host.

A transpose that moves the innermost axis runs as register tiles alone
(``schedules/transpose.py``), but fused into another kernel (an elementwise op after it, a
concatenation, a convolution's padded input plane) it is inlined into that kernel's loads,
and each vector of the output gathers its lanes from input rows apart. The cost model prices
those elements at this figure (``analytical._gathers``); a streamed copy's bandwidth says
nothing of it (1 x 56 x 56 x 128 channels-last to NCHW, with the multiply below: 1.52 ns per
element on a rocketlake core; as a stream of 29 GB/s its 8 bytes would take 0.27 ns).

The kernel: that transpose with a multiply after it, so that FuseOps makes one kernel of the
two and the fallback rule inlines the transpose, as it does in a model. Only 4-byte
permutations are marked as gathering (``schedules.transpose.gathers``).

Alone, the same transpose runs as the tile rule's register tiles, and that too costs more than
the stream of its bytes: 0.14 ns an element on a rocketlake core for an image that stays in
L2, where a streamed copy moves an element in 0.09 ns (2026-12-08). The cost model prices a lone one at ``transpose_s``, timed on
an image that fits in L2 (``analytical._transposes``).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from .kernel_time import kernel_seconds, one_kernel

#: The NHWC image the kernel turns NCHW: 1.6 MB in, 1.6 MB out (past L2, within an LLC).
SHAPE = (1, 56, 56, 128)
#: The image the lone transpose turns NCHW: 400 KB in, 400 KB out (within a 1 MiB L2).
TILED_SHAPE = (1, 24, 32, 128)


def program(shape=SHAPE, fused: bool = True) -> tvm.IRModule:
    """``transpose(x, NHWC -> NCHW) * 2``; without the multiply where not ``fused``."""
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.permute_dims(x, [0, 3, 1, 2])
            if fused:
                y = relax.op.multiply(bb.emit(y), relax.const(2.0, "float32"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def measure(cores: int, target: tvm.target.Target, repeat: int, ms: int) -> dict:
    """``{"gather_s": seconds per gathered element per core, "transpose_s": the same of the
    lone tiled transpose}``: each kernel's time over its elements, times the cores it ran
    on. The whole kernel's time, its stream (and multiply) included: the model adds it to a
    group's compute term beside its memory term, so these kernels themselves are priced a
    few percent over."""
    gathered = kernel_seconds(one_kernel(program(), target), repeat, ms)
    tiled = kernel_seconds(one_kernel(program(TILED_SHAPE, fused=False), target), repeat, ms)
    return {"gather_s": gathered * cores / math.prod(SHAPE),
            "transpose_s": tiled * cores / math.prod(TILED_SHAPE)}
