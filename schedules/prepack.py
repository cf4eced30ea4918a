"""Weight pre-packing for CPU contractions: a constant operand is stored tile-major at compile time.

Why: the contraction rule streams its vector operand (a linear layer's ``(K, N)`` weight) one
``vtile``-wide row slice per reduction step, i.e. ``vtile * 4`` bytes out of every ``N * 4``. A
9.4 MB weight is then touched a few lines per 4 KiB page across thousands of pages, and how
those lines land in the physically indexed L2 depends on where the allocator put the weight:
the same compiled kernel (mlp_gelu's 3072x768 matmul) measured 5.8 or 7.7-8.8 ms depending on
the build, and 5.8-7.5 ms over twelve fresh allocations: most of the 8-13% that separate builds
of one plan differed by (``lab/build_spread.py``). Stored as ``(N / vtile, K, vtile)``, each
tile's panel is one contiguous stream: 5.45-5.54 ms over ten allocations.

How:

1. :func:`mark_constant_weights` (before scheduling) lists, per PrimFunc, the parameters bound
   to a Relax constant at every call site, in the ``layout_free_buffers`` attribute that
   meta-schedule uses for the same purpose. TVM's ``AttachAttrLayoutFreeBuffers`` also marks
   weights passed as function inputs; packing those would need a repacking kernel on every
   call, so only constants are marked here.
2. The contraction rule (:func:`pack_streamed_operand`) transforms such a parameter's layout to
   tile-major (``transform_layout`` on the parameter: the PrimFunc now takes the packed shape).
3. :func:`pack_constants` (after scheduling) replaces each such constant argument at the call
   sites with its packed copy, so the built model has the same kernels reading packed weights.

TVM's own route (a ``meta_schedule.layout_rewrite_preproc`` block, ``SplitLayoutRewritePreproc``
and ``FoldConstant``) is not used: ``SplitLayoutRewritePreproc`` visits every PrimFunc of the
module and fails on ones that are not a root block of blocks (``cumsum`` legalizes to one).
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

__all__ = ["layout_free", "mark_constant_weights", "pack_constants", "pack_leading_operand",
           "pack_streamed_operand", "packed"]

LAYOUT_FREE = "layout_free_buffers"
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@tvm.transform.module_pass(opt_level=0, name="CostFuseMarkConstantWeights")
def mark_constant_weights(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """A copy of ``mod`` where each PrimFunc's ``layout_free_buffers`` lists the argument
    positions that are a Relax constant in every ``call_tir`` of it (weights bound into the
    model). A PrimFunc also used any other way (``call_tir_inplace``, a direct call) gets an
    empty list, as does one with no constant argument: a marking already there (TVM's
    ``AttachAttrLayoutFreeBuffers`` marks function inputs too) is replaced, never kept."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    constant_at: dict[str, set[int]] = {}
    uses: dict[str, int] = {}  # every reference to a GlobalVar
    call_tir_uses: dict[str, int] = {}

    def visit(expr) -> None:
        if isinstance(expr, tvm.ir.GlobalVar):
            uses[expr.name_hint] = uses.get(expr.name_hint, 0) + 1
        elif isinstance(expr, relax.Call) and expr.op.same_as(call_tir):
            name = expr.args[0].name_hint
            call_tir_uses[name] = call_tir_uses.get(name, 0) + 1
            args = expr.args[1].fields
            here = {i for i, a in enumerate(args) if isinstance(a, tvm.ir.expr.GenericConst)}
            constant_at[name] = constant_at.get(name, here) & here

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    out = tvm.IRModule({}, attrs=mod.attrs, global_infos=mod.global_infos)
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            name = gv.name_hint
            only_call_tir = uses.get(name, 0) == call_tir_uses.get(name, 0)
            marked = sorted(constant_at.get(name, ())) if only_call_tir else []
            if marked:
                func = func.with_attr(LAYOUT_FREE, marked)
            elif func.attrs is not None and LAYOUT_FREE in func.attrs:
                func = func.without_attr(LAYOUT_FREE)
        out[gv] = func
    return out


def layout_free(sch: s_tir.Schedule) -> list:
    """The buffers (parameters) the function's ``layout_free_buffers`` names."""
    func = sch.mod["main"]
    attrs = func.attrs
    if attrs is None or LAYOUT_FREE not in attrs:
        return []
    return [func.params[int(i)] for i in attrs[LAYOUT_FREE]]


def pack_streamed_operand(sch: s_tir.Schedule, block, buffer, vtile: int) -> bool:
    """Store ``buffer`` (a parameter read by ``block`` with the vectorized output index last)
    as ``(n / vtile, ..., vtile)`` when it is a constant weight; whether it did."""
    if not any(p.same_as(buffer) for p in layout_free(sch)):
        return False
    shape = [int(s) for s in buffer.shape] if all(
        isinstance(s, tirx.IntImm) for s in buffer.shape) else None
    if not shape or len(shape) < 2 or shape[-1] % vtile or shape[-1] == vtile:
        return False  # dynamic, 1-D, ragged, or already one tile wide: nothing to gain
    blocks: list = []
    tvm_ffi.structural_walk(sch.mod["main"].body, (s_tir.SBlock, blocks.append), order="post")
    if sum(r.source.same_as(buffer) for b in blocks for r in b.reads) != 1:
        return False  # another block reads it: packing would slow that block down
    at = next(i for i, r in enumerate(sch.get(block).reads) if r.source.same_as(buffer))
    sch.transform_layout(block, ("read", at), tirx.IndexMap.from_func(
        lambda *idx: (idx[-1] // vtile, *idx[:-1], idx[-1] % vtile), ndim=len(shape)))
    return True


def _trailing_shape(shape, tile: int) -> tuple[int, ...]:
    return (shape[-1] // tile, *shape[:-1], tile)


def _leading_shape(shape, tile: int) -> tuple[int, ...]:
    return (-(-shape[0] // tile), *shape[1:], tile)


def pack_leading_operand(sch: s_tir.Schedule, block, buffer, tile: int) -> bool:
    """Store the constant weight ``buffer`` (read only by ``block``, vectorized along its first
    index: a convolution's output channels) as ``(ceil(n / tile), ..., tile)``: each output
    channel tile's weights are one contiguous panel; whether it did. Refused where that shape
    equals the :func:`pack_streamed_operand` one (every dimension equal), which
    :func:`pack_constants` could not tell apart."""
    if not any(p.same_as(buffer) for p in layout_free(sch)):
        return False
    if not all(isinstance(s, tirx.IntImm) for s in buffer.shape) or len(buffer.shape) < 2:
        return False
    shape = [int(s) for s in buffer.shape]
    if shape[0] % tile or _leading_shape(shape, tile) == _trailing_shape(shape, tile):
        return False
    blocks: list = []
    tvm_ffi.structural_walk(sch.mod["main"].body, (s_tir.SBlock, blocks.append), order="post")
    if sum(r.source.same_as(buffer) for b in blocks for r in b.reads) != 1:
        return False
    at = next(i for i, r in enumerate(sch.get(block).reads) if r.source.same_as(buffer))
    sch.transform_layout(block, ("read", at), tirx.IndexMap.from_func(
        lambda *idx: (idx[0] // tile, *idx[1:], idx[0] % tile), ndim=len(shape)))
    return True


def packed(value: np.ndarray, tile: int, leading: bool = False) -> np.ndarray:
    """``value`` in the layout :func:`pack_streamed_operand` (``leading``:
    :func:`pack_leading_operand`) gives its parameter."""
    if leading:
        n, *rest = value.shape
        return np.ascontiguousarray(np.moveaxis(value.reshape(n // tile, tile, *rest), 1, -1))
    *outer, n = value.shape
    return np.ascontiguousarray(np.moveaxis(value.reshape(*outer, n // tile, tile), -2, 0))


@tvm.transform.module_pass(opt_level=0, name="CostFusePackConstants")
def pack_constants(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Pass each packed parameter its packed constant: where a ``call_tir`` argument is a
    constant whose shape differs from the PrimFunc parameter's, the parameter must be the
    tile-major layout of it (anything else is an error, never a silent reshape).

    The schedule changed packed PrimFuncs' signatures under their old GlobalVar, whose type
    (what call sites are checked against) still has the old shapes: every marked PrimFunc is
    re-added under a fresh GlobalVar, without the marking. A constant that something else
    still reads unpacked stays in the module beside its packed copy."""
    marked = {gv: func for gv, func in mod.functions.items()
              if isinstance(func, tirx.PrimFunc) and func.attrs is not None
              and LAYOUT_FREE in func.attrs}
    if not marked:
        return mod
    rest = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv not in marked},
                        attrs=mod.attrs, global_infos=mod.global_infos)
    mutator = _Repack(rest, marked)
    for gv, func in list(rest.functions.items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


# At module level, its state on the instance: a ``mutator`` class defined per call stays alive
# once it has visited (TVM's side keeps its callbacks), and with it the closure it reads, here
# every packed constant of the build: 150 MB per build of a decode step, 23 GB over one
# `costfuse regret` run (docs/log/2026-12-06i.md).
@relax.expr_functor.mutator
class _Repack(relax.PyExprMutator):
    """Calls of ``marked`` PrimFuncs re-pointed at their unmarked copies, with packed
    constants (one copy per constant and layout)."""

    def __init__(self, mod: tvm.IRModule, marked: dict) -> None:
        super().__init__(mod)
        self.marked = marked
        self.cache: list[tuple[relax.Expr, int, bool, relax.Expr]] = []
        self.renamed: dict[str, tvm.ir.GlobalVar] = {}

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(_CALL_TIR) or call.args[0] not in self.marked:
            return call
        old = call.args[0]
        func = self.marked[old]
        if old.name_hint not in self.renamed:
            self.renamed[old.name_hint] = self.builder_.add_func(
                func.without_attr(LAYOUT_FREE), old.name_hint)
        args = list(call.args[1].fields)
        for i, (arg, param) in enumerate(zip(args, func.params, strict=False)):
            args[i] = _packed_argument(old.name_hint, i, arg, param, self.cache)
        return relax.Call(call.op, [self.renamed[old.name_hint], relax.Tuple(args),
                                    *call.args[2:]], call.attrs, call.ty_args)


def _packed_argument(kernel: str, index: int, arg, param, cache) -> relax.Expr:
    """``arg`` as parameter ``param`` takes it: itself, or its tile-major packing."""
    if getattr(param, "shape", None) is None or not all(
            isinstance(d, tvm.tirx.IntImm) for d in param.shape):
        return arg  # a scalar, or a symbolic shape (never packed)
    want = tuple(int(d) for d in param.shape)
    if not isinstance(arg, tvm.ir.expr.GenericConst):
        shape = getattr(arg.ty, "shape", None)
        dims = getattr(shape, "values", None)
        if dims is not None and all(isinstance(d, tvm.tirx.IntImm) for d in dims):
            have = tuple(int(d) for d in dims)
            if len(have) == len(want) and have != want:
                raise ValueError(f"{kernel}: parameter {index} has shape {want}, its argument "
                                 f"{have}: only constants are packed")
        return arg
    have = tuple(arg.value.shape)
    if want == have:
        return arg
    tile = want[-1]
    trailing = have[-1] % tile == 0 and want == _trailing_shape(have, tile)
    # both shapes agree only where every dimension is equal (a square Linear weight):
    # pack_leading_operand refuses that case, so it is the trailing packing
    leading = not trailing and have[0] % tile == 0 and want == _leading_shape(have, tile)
    if not (trailing or leading):
        raise ValueError(f"{kernel}: parameter {index} has shape {want}, its constant "
                         f"argument {have}: not the tile-major packing of it")
    for seen, seen_tile, seen_leading, done in cache:  # one copy per (constant, layout)
        if seen.same_as(arg) and seen_tile == tile and seen_leading == leading:
            return done
    done = relax.const(packed(arg.value.numpy(), tile, leading))
    cache.append((arg, tile, leading, done))
    return done
