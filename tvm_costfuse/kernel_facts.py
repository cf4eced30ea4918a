"""What a PrimFunc computes, read off its blocks: FLOPs, reduction extents, math library
work, a contraction's geometry, pooling windows, and where it reduces. The graph's nodes carry
these facts (``graph.Node``); the cost model's features read them there, so that what a group
is priced as follows the blocks the schedule rules see (a block with an init is a reduction
to both, whatever its extents).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, s_tir

from .schedules._common import is_spatial, uses
from .schedules.efficiency import Geometry
from .schedules.efficiency import describe as contraction_geometry
from .schedules.fast_math import is_integer_power
from .schedules.math_calls import MATH_COST
from .schedules.transpose import classify

__all__ = ["KernelFacts", "has_reshape_pattern", "kernel_facts"]

_CALL = re.compile(r"\bT\.([a-z0-9_]+)\(")
_DATA_PAR, _COMM_REDUCE = tvm.tirx.IterVar.DataPar, tvm.tirx.IterVar.CommReduce


def _is_pool(block) -> bool:
    """A reduction block that reads a window: some index joins a reduced var with a spatial
    one (``y * 2 + ry``), and no product of two loaded values is accumulated (a convolution's
    is). For a sum the spatial var must have an extent above 1: a global (adaptive) average
    pool joins vars of extent 1 and is a row reduction to the rules; a max pool is a window
    to them whatever its output size. A row reduction indexes its reduced vars alone."""
    if isinstance(getattr(block.body, "value", None), tvm.tirx.Max):
        spatial = [iv.var for iv in block.iter_vars if iv.iter_type == _DATA_PAR]
    else:
        spatial = [iv.var for iv in block.iter_vars if iv.iter_type == _DATA_PAR and not (
            isinstance(iv.dom.extent, tvm.tirx.IntImm) and int(iv.dom.extent) == 1)]
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == _COMM_REDUCE]
    if not any(uses(i, r) and any(uses(i, v) for v in spatial)
               for ld in _reads(block.body) for i in ld.indices for r in reduce):
        return False
    products = []
    tvm_ffi.structural_walk(block.body, (tvm.tirx.Mul, products.append))
    return not any(_reads(m.a) and _reads(m.b) for m in products)


def _reads(expr) -> list:
    found: list = []
    tvm_ffi.structural_walk(expr, (tvm.ir.expr.TensorLoad, found.append))
    return found


def _block_facts(func: tvm.tirx.PrimFunc) -> tuple[int, float, bool, bool, bool]:
    """(largest product of reduction-axis extents over the PrimFunc's blocks, 1 if none; math
    work per invocation in exp-equivalents: each block's weighted calls times its
    iterations; a pooling window among them (:func:`_is_pool`); the last one reducing; any
    one reducing, whatever its extents: unit or symbolic).

    Limits: a block's iterations are the product of its iteration-variable extents, so a loop
    written inside a block body (hand-written, opaque blocks) or a nested block counts once
    per outer iteration. Relax's legalized operators (every zoo model) have none. ``pow`` to
    a constant 2, 3 or 4 is free: ``fast_math`` makes it multiplies. A kernel written as
    plain loops (no blocks) has no reduction the graph can see: (1, 0.0, False, False, False)."""
    if not isinstance(func.body, s_tir.SBlockRealize):
        return 1, 0.0, False, False, False
    best, calls, pool = 1, 0.0, False
    # Every block below the body's (root) block, read from the IR: names need not be unique
    # in hand-written TIR (an inner block may be called "root" too), so no lookup by name.
    root = func.body.block
    blocks: list = []
    tvm_ffi.structural_walk(root.body, (s_tir.SBlock, blocks.append))
    for block in blocks:
        extent = iterations = 1
        for iv in block.iter_vars:
            n = int(iv.dom.extent) if isinstance(iv.dom.extent, tvm.tirx.IntImm) else 1
            iterations *= n
            if int(iv.iter_type) == 2:  # CommReduce
                extent *= n
        best = max(best, extent)
        per_iter = sum(MATH_COST.get(name, 0.0) for name in _CALL.findall(str(block.body)))
        per_iter -= MATH_COST["pow"] * _integer_powers(block.body)
        calls += per_iter * iterations
        pool = pool or _is_pool(block)
    # a reduction as the rules tell one: an init or a reduced iter, whatever the extents
    ends = bool(blocks) and not is_spatial(blocks[-1])
    return best, calls, pool, ends, any(not is_spatial(b) for b in blocks)


def _integer_powers(body) -> int:
    """How many ``pow`` calls in ``body`` ``fast_math`` turns into multiplies."""
    found = []
    tvm_ffi.structural_walk(body, (tvm.ir.expr.Call,
                                   lambda c: found.append(is_integer_power(c))))
    return sum(found)


@dataclass(frozen=True)
class KernelFacts:
    """What one PrimFunc computes, as the graph's nodes carry it."""

    flops: float
    #: the largest product of reduction-axis extents over its blocks (1 if none)
    reduction_extent: int
    #: math library work per invocation, in exp-equivalents
    math: float
    #: a contraction's block as the CPU rule sees it; None for other ops
    geometry: Geometry | None
    #: a pooling window (:func:`_is_pool`)
    pool: bool
    #: the last block reduces (a max pool, a sum)
    ends_in_reduction: bool
    #: some block reduces, whatever its extents (unit or symbolic)
    reduces: bool
    #: a permutation that moves the innermost axis (``schedules.transpose.gathers``)
    moves_innermost: bool = False
    #: such a permutation that runs as register tiles alone (``schedules.transpose.tiles``)
    tiles_alone: bool = False


def kernel_facts(func: tvm.tirx.PrimFunc) -> KernelFacts:
    """The facts of one PrimFunc. The geometry is read only where a reduction does at least
    one multiply-add per reduced element (the contraction test of ``cost.features.op_class``)
    and the block is no pooling window."""
    flops = float(s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": func})))
    red, math_work, pool, ends, reduces = _block_facts(func)
    out = sum(math.prod(int(s) for s in buf.shape) if all(
        isinstance(s, tvm.tirx.IntImm) for s in buf.shape) else 0
        for buf in list(func.params)[-1:])
    geometry = contraction_geometry(func) if red > 1 and out and flops >= 1.5 * out * red \
        and not pool else None
    moves, tiled = classify(func) if not flops and red == 1 else (False, False)
    return KernelFacts(flops, red, math_work, geometry, pool, ends, reduces, moves, tiled)


def has_reshape_pattern(func: tvm.tirx.PrimFunc) -> bool:
    """TVM's ``has_reshape_pattern``, which requires a block-structured PrimFunc: a kernel
    written as plain loops (no blocks) is no reshape to it, and it fails on one."""
    if not isinstance(func.body, s_tir.SBlockRealize):
        return False
    return bool(relax.analysis.has_reshape_pattern(func))
