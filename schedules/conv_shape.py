"""Which block vars of a convolution block play which role (the conv kernel's analysis).

Matches ``C[n, f, (y,) x] += P[n, g(f) + rc, (y * s + ry,) x * s + rx * d] * W[f, rc, (ry,) rx]``
as the PyTorch and ONNX importers legalize NC(H)W conv1d/conv2d: the weight read at plain vars
with the output channel first, the input at affine window expressions, a grouped input channel
through ``f // (channels per group)``. Kept apart from ``conv.py`` (the schedule) so each
stays one job.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import ir, s_tir, tirx


@dataclass(frozen=True)
class ConvShape:
    """The block vars of a convolution and its two loads."""

    channel: tirx.Var  # output channel: the weight's first index, vectorized
    width: tirx.Var  # the output's last index (image row / sequence): blocked into registers
    height: tirx.Var | None  # the output index before ``width`` when the input reads it
    weight: ir.TensorLoad
    data: ir.TensorLoad
    per_group: int  # output channels per group (all of them when not grouped)
    window: tuple[int, int, int]  # (taps, stride, dilation) along the width


def _vars(expr) -> list[tirx.Var]:
    found: list = []
    tvm_ffi.structural_walk(expr, (tirx.Var, found.append), order="post")
    return found


def _mentions(exprs, var) -> bool:
    return any(v.same_as(var) for e in exprs for v in _vars(e))


def _group_size(exprs, channel) -> int | None:
    """``k`` of a ``channel // k`` in ``exprs`` (a grouped conv's input channel), else None."""
    sizes: list[int] = []

    def visit(node):
        if (isinstance(node, tirx.FloorDiv) and isinstance(node.a, tirx.Var)
                and node.a.same_as(channel) and isinstance(node.b, tirx.IntImm)):
            sizes.append(int(node.b))

    for e in exprs:
        tvm_ffi.structural_walk(e, (tirx.FloorDiv, visit), order="post")
    return sizes[0] if len(set(sizes)) == 1 else None


def analyze(block: s_tir.SBlock, store, lhs, rhs) -> ConvShape | None:
    """Roles for ``store = store + lhs * rhs`` when it is an NC(H)W convolution with an
    OI(H)W weight parameter read at plain vars; None otherwise (matmuls, depthwise, NHWC)."""
    kinds = {iv.var: iv.iter_type for iv in block.iter_vars}
    extents = {iv.var: iv.dom.extent for iv in block.iter_vars}
    if not all(isinstance(e, tirx.IntImm) for e in extents.values()):
        return None
    out = list(store.indices)
    if len(out) < 3 or not all(isinstance(i, tirx.Var | tirx.IntImm) for i in out):
        return None
    for weight, data in ((lhs, rhs), (rhs, lhs)):
        idx = list(weight.indices)
        if len(idx) != len(out) or not isinstance(idx[0], tirx.Var):
            continue
        channel = idx[0]  # the rest: reduction vars, or 0 where normalize dropped a unit one
        if not (kinds.get(channel) == tirx.IterVar.DataPar and _has_var(out, channel)
                and all(isinstance(i, tirx.IntImm) or kinds.get(i) == tirx.IterVar.CommReduce
                        for i in idx[1:])):
            continue
        width = out[-1]
        if not isinstance(width, tirx.Var) or width.same_as(channel):
            continue
        if not _mentions(data.indices, width) or _mentions(weight.indices, width):
            continue
        if any(isinstance(i, tirx.Var) and i.same_as(channel) for i in data.indices):
            return None  # depthwise: the input channel is the output channel
        per_group = int(extents[channel])
        if _mentions(data.indices, channel):
            per_group = _group_size(data.indices, channel)
            if per_group is None:
                return None
        height = out[-2] if isinstance(out[-2], tirx.Var) and not out[-2].same_as(channel) \
            and _mentions(data.indices, out[-2]) else None
        window = _window(data, width, extents)
        if window is None:
            return None
        return ConvShape(channel, width, height, weight, data, per_group, window)
    return None


def _coefficient(expr, var) -> int | None:
    """The constant ``c`` of ``expr = c * var + (terms without var)``; None if not linear."""
    if isinstance(expr, tirx.Var):
        return 1 if expr.same_as(var) else 0
    if isinstance(expr, tirx.IntImm):
        return 0
    if isinstance(expr, tirx.Add | tirx.Sub):
        a, b = _coefficient(expr.a, var), _coefficient(expr.b, var)
        if a is None or b is None:
            return None
        return a + b if isinstance(expr, tirx.Add) else a - b
    if isinstance(expr, tirx.Mul):
        for x, c in ((expr.a, expr.b), (expr.b, expr.a)):
            if isinstance(c, tirx.IntImm):
                k = _coefficient(x, var)
                return None if k is None else k * int(c)
    return None if _mentions([expr], var) else 0


def _window(data, width, extents) -> tuple[int, int, int] | None:
    """(taps, stride, dilation) of the input's last index ``width * s + r * d``."""
    last = data.indices[-1]
    stride = _coefficient(last, width)
    taps = [v for v in _vars(last) if not v.same_as(width) and v in extents]
    if stride is None or stride < 1 or len({id(v) for v in taps}) > 1:
        return None
    if not taps:
        return 1, stride, 1
    dilation = _coefficient(last, taps[0])
    return (int(extents[taps[0]]), stride, dilation) if dilation else None


def _has_var(indices, var) -> bool:
    return any(isinstance(i, tirx.Var) and i.same_as(var) for i in indices)
