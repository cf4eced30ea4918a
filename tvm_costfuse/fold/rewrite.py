"""Finding the foldable forms among a function's bindings, and rewriting the function with them."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm import relax

from .forms import CONVS, Affine, describe, merge, steps

__all__ = ["Fold", "FoldWeights", "fold_weights"]

# numpy computes the folded constants; it has no bfloat16, so such models stay as written
_FLOATS = ("float32", "float64", "float16")
_CONV_OPS = {op: axes for axes, (op, *_rest) in CONVS.items()}


@dataclass(frozen=True)
class Fold:
    """One binding rewritten: its name and what it became."""

    binding: str
    what: str

    def __str__(self) -> str:
        return f"{self.binding}: {self.what}"


def _shape(expr: relax.Expr) -> tuple[int | str, ...] | None:
    """``expr``'s shape; a symbolic dimension (a dynamic batch) by its name."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values)


def _dtype(expr: relax.Expr) -> str:
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else ""


class _Analysis:
    """The affine form of every binding of one function (where it has one)."""

    def __init__(self, func: relax.Function):
        self.values = relax.analysis.get_var2val(func)
        self.uses: dict[relax.Var, int] = {}
        reads = [b.value for block in func.body.blocks for b in block.bindings]  # match casts too
        for value in [*reads, func.body.body]:  # and what the function returns
            for var in relax.analysis.free_vars(value):
                self.uses[var] = self.uses.get(var, 0) + 1
        self.forms: dict[relax.Var, Affine] = {}
        for block in func.body.blocks:
            for binding in block.bindings:
                if isinstance(binding, relax.VarBinding):
                    form = self._form(binding.var, binding.value)
                    if form is not None:
                        self.forms[binding.var] = form

    def constant(self, expr: relax.Expr) -> np.ndarray | None:
        """``expr``'s value when it is a constant (through reshapes of one)."""
        if isinstance(expr, tvm.ir.expr.GenericConst):
            return expr.value.numpy().astype(np.float64)
        if isinstance(expr, relax.Var) and expr in self.values:
            value = self.values[expr]
            if isinstance(value, relax.Call) and value.op == tvm.ir.Op.get("relax.reshape"):
                inner = self.constant(value.args[0])
                shape = _shape(expr)
                if inner is not None and shape is not None:
                    return inner.reshape(shape)
        return None

    def _operand(self, expr: relax.Expr) -> Affine | None:
        """The form of an operand this binding may absorb: one with no other use."""
        form = self.forms.get(expr) if isinstance(expr, relax.Var) else None
        if form is not None and self.uses.get(expr, 0) == 1:
            return replace(form, sources=form.sources + (expr,))
        return None

    def _channel(self, expr: relax.Expr, out_shape: tuple) -> np.ndarray | None:
        """A constant that varies at most along the channels (axis 1) of ``out_shape``."""
        shape = _shape(expr)
        if shape is None or not all(isinstance(d, int) for d in shape) or (
                int(np.prod(shape)) > out_shape[1]):
            return None  # not read into float64 to learn that it is no channel vector
        value = self.constant(expr)
        rank = len(out_shape)
        if value is None or value.ndim > rank:
            return None
        full = value.reshape((1,) * (rank - value.ndim) + value.shape)
        if (full.shape[0] != 1 or any(d != 1 for d in full.shape[2:])
                or full.shape[1] not in (1, out_shape[1])):
            return None
        return np.broadcast_to(full.reshape(-1), (out_shape[1],)).copy()

    def _form(self, var: relax.Var, value: relax.Expr) -> Affine | None:
        out = _shape(var)
        if (out is None or len(out) - 2 not in CONVS or not isinstance(out[1], int)
                or _dtype(var) not in _FLOATS):
            return None
        if isinstance(value, relax.TupleGetItem):
            return self._batch_norm(value, out)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        name, args = value.op.name, value.args
        if _CONV_OPS.get(name) == len(out) - 2:
            return self._conv(var, value, out)
        if name in ("relax.add", "relax.subtract", "relax.multiply", "relax.divide"):
            return self._binary(name, args, out)
        return None

    def _conv(self, var: relax.Var, call: relax.Call, out: tuple) -> Affine | None:
        attrs = call.attrs
        axes = len(out) - 2
        _op, data_layout, kernel_layout, _make = CONVS[axes]
        weight = self.constant(call.args[1])
        layouts = (attrs.data_layout, attrs.kernel_layout)
        if (weight is None or layouts != (data_layout, kernel_layout)
                or (attrs.out_layout or data_layout) != data_layout
                or _dtype(call.args[0]) != _dtype(call)):
            return None
        pad = [int(p) for p in attrs.padding]  # relax keeps 2 x axes: the low sides, the high
        strides = tuple(int(v) for v in attrs.strides)
        dilation = tuple(int(v) for v in attrs.dilation)
        if len(pad) != 2 * axes or len(strides) != axes or len(dilation) != axes:
            return None
        kernel = "x".join(str(k) for k in weight.shape[2:])
        return Affine(x=call.args[0], dtype=_dtype(call), rank=len(out), channels=out[1],
                      weight=weight, strides=strides, padding=tuple(pad), dilation=dilation,
                      groups=int(attrs.groups), parts=(f"conv{axes}d {kernel}",), name=var.name,
                      taps=int(np.prod(weight.shape[2:])))

    def _batch_norm(self, item: relax.TupleGetItem, out: tuple[int, ...]) -> Affine | None:
        tup = item.tuple_value
        call = self.values.get(tup) if isinstance(tup, relax.Var) else None
        if (item.index != 0 or not isinstance(call, relax.Call)
                or call.op != tvm.ir.Op.get("relax.nn.batch_norm")):
            return None
        attrs = call.attrs
        if attrs.training or int(attrs.axis) not in (1, 1 - len(out)):
            return None
        gamma, beta, mean, var = (self.constant(a) for a in call.args[1:5])
        if any(v is None or v.shape != (out[1],) for v in (gamma, beta, mean, var)):
            return None
        scale = (gamma if attrs.scale else np.ones(out[1])) / np.sqrt(var + float(attrs.epsilon))
        shift = (beta if attrs.center else 0.0) - mean * scale
        data = call.args[0]
        # the convolution folds in only where this item is all that is read of the tuple: a
        # read moving mean keeps the batch norm (and its input) alive
        items = [(v, e.index) for v, e in self.values.items()
                 if isinstance(e, relax.TupleGetItem) and e.tuple_value.same_as(tup)]
        private = (self.uses.get(tup, 0) == len(items)
                   and sum(i == 0 for _, i in items) == 1
                   and all(i == 0 or not self.uses.get(v, 0) for v, i in items))
        form = (private and self._operand(data)) or self._identity(data, out)
        return form.times(scale, "batch_norm").plus(shift, None)

    def _identity(self, expr: relax.Expr, out: tuple) -> Affine:
        return Affine(x=expr, dtype=_dtype(expr), rank=len(out), channels=out[1])

    def _binary(self, name: str, args, out: tuple[int, ...]) -> Affine | None:
        short = name.split(".")[-1]
        for this, other in ((args[0], args[1]), (args[1], args[0])):
            if name in ("relax.subtract", "relax.divide") and not this.same_as(args[0]):
                break
            vec = self._channel(other, out)
            if vec is None:
                continue
            if _shape(this) != out:
                return None  # the constant widens the operand (1 channel + 5): no form of it
            form = self._operand(this)
            if form is None:
                return None
            if name == "relax.add":
                return form.plus(vec, short)
            if name == "relax.subtract":
                return form.plus(-vec, short)
            if name == "relax.multiply":
                return form.times(vec, short)
            if not np.all(vec):
                return None  # x / 0 is inf or nan, a folded weight times 0 is not
            return form.times(1.0 / vec, short)
        if name != "relax.add" or _shape(args[0]) != out or _shape(args[1]) != out:
            return None
        return self._sum_branches(args, out)

    def _sum_branches(self, args, out: tuple[int, ...]) -> Affine | None:
        forms = []
        for arg in args:  # a branch, or the input itself (a residual identity)
            forms.append(self._operand(arg) or self._identity(arg, out))
        a, b = forms
        if a is None or b is None or not a.x.same_as(b.x) or a.dtype != b.dtype:
            return None
        if not (a.weight is not None or b.weight is not None or a.folded or b.folded):
            return None  # x + x, or scaled copies of x: nothing to fold
        in_shape = _shape(a.x)
        if (in_shape is None or len(in_shape) != len(out) or in_shape[0] != out[0]
                or not all(isinstance(d, int) for d in in_shape[2:] + out[2:])):
            return None
        return merge(a, b, out[2:], in_shape[2:])


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, forms: dict[relax.Var, Affine]):
        super().__init__(mod)
        self.forms = forms

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        form = self.forms.get(binding.var)
        if form is None:
            super().visit_var_binding_(binding)
            return
        value = self.visit_expr(form.x)
        calls = steps(form)
        for call in calls[:-1]:  # the convolution keeps the name of the one it replaces
            value = self.builder_.emit(call(value), form.name)
        if calls:
            value = calls[-1](value)
        name = binding.var.name
        if self.builder_.current_block_is_dataflow() and not isinstance(
                binding.var, relax.DataflowVar):
            new = self.builder_.emit_output(value, name)  # a dataflow block's output
        else:
            new = self.builder_.emit(value, name)
        self.set_var_remap(binding.var, new)


def fold_weights(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[Fold]]:
    """Fold batch norms into convolutions and sum parallel convolution branches of one input
    into one, in every Relax function of ``mod``; return the module and what was folded."""
    notes: list[Fold] = []
    out = mod.clone()  # the caller's module stays as it was
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        forms = {v: f for v, f in _Analysis(func).forms.items()
                 if f.folded and f.representable()}
        absorbed = {s for f in forms.values() for s in f.sources}
        final = {v: f for v, f in forms.items() if v not in absorbed}
        if not final:
            continue
        rewriter = _Rewriter(out, final)
        new = rewriter.visit_expr(func)
        out = rewriter.builder_.get()  # carries what the builder added; swap the function in
        out[gvar] = relax.analysis.remove_all_unused(new)
        notes += [Fold(v.name, describe(f)) for v, f in final.items()]
    return out, notes


@tvm.transform.module_pass(opt_level=0, name="CostFuseFoldWeights")
def FoldWeights(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """:func:`fold_weights` as a module pass (what the pipelines run before legalizing)."""
    return fold_weights(mod)[0]
