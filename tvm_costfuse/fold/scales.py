"""A scale per input channel moved from a convolution's input into its weights.

Squeeze-excite blocks (EfficientNet, MobileNetV3, RegNetY, ...) multiply a convolution's input
by a scale per channel computed from the image: ``conv(x * s, W)``. A convolution is linear in
each input channel and its zero padding stays zero when scaled, so that is ``conv(x, W * s)``
up to rounding. Scaling the input touches every one of its values, writes the product, and the
convolution reads it back; scaling the weights touches ``O * I * taps`` values. Where the
weights have fewer values than the input (a 1x1 projection of 144 channels to 24 on a 56 x 56
image: 3,456 against 451,584), the multiply moves to them and the input's full-size product is
never formed; where they have more (the same block on a 7 x 7 image with 1,152 channels to
320), the program stays as written. No fusion can do this: the product is a whole tensor that
a fused kernel would still compute per element; here it disappears.

Taken where the rewrite is exact and cheap to prove: an ungrouped convolution in the default
layouts, a multiply whose only use is that convolution, and a scale that varies at most along
the channels (so one weight tensor serves the whole batch). A constant scale becomes a constant
weight, which ``FoldConstant`` then evaluates at compile time.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .forms import CONVS, Fold

__all__ = ["move_input_scales"]

_FLOATS = ("float32", "float64", "float16", "bfloat16")
_MULTIPLY = "relax.multiply"
_CONV_RANK = {op: axes + 2 for axes, (op, *_rest) in CONVS.items()}


def _static(expr: relax.Expr) -> tuple[int, ...] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = ty.shape.values
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def _dtype(expr: relax.Expr) -> str:
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else ""


def _per_channel(scale: tuple[int, ...], data: tuple[int, ...]) -> bool:
    """Does a tensor of shape ``scale``, broadcast against ``data`` (N, C, image...), vary at
    most along C? Then, right-aligned against the weights (O, I, taps...), it varies at most
    along I: ``W * s`` is the weights scaled per input channel, one tensor for every image."""
    if len(scale) > len(data):
        return False
    full = (1,) * (len(data) - len(scale)) + scale
    return (full[0] == 1 and full[1] in (1, data[1]) and all(d == 1 for d in full[2:]))


def _moves(func: relax.Function) -> dict[relax.Var, tuple[relax.Expr, relax.Expr, Fold]]:
    """Per convolution binding that takes the move: (its unscaled input, the scale, a note)."""
    values = relax.analysis.get_var2val(func)
    uses: dict[relax.Var, int] = {}
    reads = [b.value for block in func.body.blocks for b in block.bindings]
    for value in [*reads, func.body.body]:
        for var in relax.analysis.free_vars(value):
            uses[var] = uses.get(var, 0) + 1
    found = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(binding, relax.VarBinding) and isinstance(call, relax.Call)
                    and isinstance(call.op, tvm.ir.Op) and call.op.name in _CONV_RANK):
                continue
            data, weight = call.args[0], call.args[1]
            product = values.get(data) if isinstance(data, relax.Var) else None
            if not (isinstance(product, relax.Call) and isinstance(product.op, tvm.ir.Op)
                    and product.op.name == _MULTIPLY and uses.get(data, 0) == 1):
                continue
            move = _move(binding.var, call, data, weight, product)
            if move is not None:
                found[binding.var] = move
    return found


def _move(var: relax.Var, call: relax.Call, data: relax.Expr, weight: relax.Expr,
          product: relax.Call):
    attrs = call.attrs
    rank = _CONV_RANK[call.op.name]
    _op, data_layout, kernel_layout, _make = CONVS[rank - 2]
    shape, wshape = _static(data), _static(weight)
    if (shape is None or wshape is None or len(shape) != rank or int(attrs.groups) != 1
            or (attrs.data_layout, attrs.kernel_layout) != (data_layout, kernel_layout)
            or len({_dtype(data), _dtype(weight), *map(_dtype, product.args)}) != 1
            or _dtype(data) not in _FLOATS):
        return None
    for x, s in ((product.args[0], product.args[1]), (product.args[1], product.args[0])):
        sshape = _static(s)
        if _static(x) != shape or sshape is None or not _per_channel(sshape, shape):
            continue
        weights, inputs = int(np.prod(wshape)), int(np.prod(shape))
        if weights >= inputs:
            return None  # scaling the weights would touch more values than it saves
        return x, s, Fold(var.name, f"input x scale per channel ({shape[1]}) -> weights x "
                                    f"scale ({weights:,} values scaled, not {inputs:,})")
    return None


@relax.expr_functor.mutator
class _Mover(relax.PyExprMutator):
    """Rewrites each convolution of ``moves`` to read its unscaled input with scaled weights
    (module level: a class defined per call would keep its closure alive, see prepack)."""

    def __init__(self, mod: tvm.IRModule, moves: dict):
        super().__init__(mod)
        self.moves = moves

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        move = self.moves.get(binding.var)
        if move is None:
            super().visit_var_binding_(binding)
            return
        x, s, _note = move
        call = binding.value
        weight = self.builder_.emit(
            relax.op.multiply(self.visit_expr(call.args[1]), self.visit_expr(s)),
            f"{binding.var.name}_weight")
        a = call.attrs
        make = CONVS[_CONV_RANK[call.op.name] - 2][3]
        value = make(self.visit_expr(x), weight, strides=a.strides, padding=a.padding,
                     dilation=a.dilation, groups=a.groups, data_layout=a.data_layout,
                     kernel_layout=a.kernel_layout, out_layout=a.out_layout,
                     out_dtype=a.out_dtype)
        name = binding.var.name
        if self.builder_.current_block_is_dataflow() and not isinstance(
                binding.var, relax.DataflowVar):
            new = self.builder_.emit_output(value, name)
        else:
            new = self.builder_.emit(value, name)
        self.set_var_remap(binding.var, new)


def move_input_scales(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[Fold]]:
    """Every convolution of ``mod``'s Relax functions that reads a per-channel scaled input
    and has fewer weight values than input values, rewritten to scale its weights instead;
    the module (the caller's is left as it was) and one note per convolution."""
    notes: list[Fold] = []
    out = mod
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        moves = _moves(func)
        if not moves:
            continue
        if out is mod:
            out = mod.clone()
        mover = _Mover(out, moves)
        new = mover.visit_expr(func)
        out = mover.builder_.get()
        out[gvar] = relax.analysis.remove_all_unused(new)
        notes += [note for _x, _s, note in moves.values()]
    return out, notes
