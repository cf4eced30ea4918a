"""Fold weight-only work into the weights, before anything is legalized or fused.

An inference-mode batch norm after a convolution is an affine map per output channel, so it
folds into the convolution's weights and a bias; parallel convolutions of one input whose
outputs are summed (the branches of reparameterizable blocks: RepVGG, MobileOne, a residual
identity) are one convolution, their kernels zero-padded to the largest, centred by their
padding, the identity as a centre tap. Both are exact up to rounding (the folded constants are
computed in float64, then rounded once). TVM's pipelines do neither: ``FoldConstant`` evaluates
only subgraphs of constants alone, and a legalized batch norm stays a kernel of four
elementwise ops (a square root per element) that fusion can merely hide in an epilogue, while
three branch convolutions stay three contractions reading the same input.

The pass works on high-level Relax (``R.nn.conv2d``, ``R.nn.batch_norm``, ``R.add``...), before
LegalizeOps; :func:`fold_weights` returns the module and one :class:`Fold` note per rewritten
binding, which ``costfuse explain`` prints. A form is extended through a binding only where its
value has no other use, so folding never duplicates a convolution.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm import relax

__all__ = ["Fold", "FoldWeights", "fold_weights"]

_FLOATS = ("float32", "float64", "float16")


@dataclass(frozen=True)
class Fold:
    """One binding rewritten: its name and what it became."""

    binding: str
    what: str

    def __str__(self) -> str:
        return f"{self.binding}: {self.what}"


@dataclass(frozen=True)
class _Affine:
    """``y = conv2d(x, weight) + bias`` per output channel, or with ``weight`` None the
    identity ``y = x * scale + bias``. ``parts`` names the ops folded in since the last sum,
    ``branches`` the summed branches before it (each its ops, joined)."""

    x: relax.Expr
    dtype: str
    channels: int  # output channels
    weight: np.ndarray | None = None  # OIHW, float64
    scale: np.ndarray | None = None  # identity form only
    bias: np.ndarray | None = None
    strides: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    parts: tuple[str, ...] = ()
    branches: tuple[str, ...] = ()
    sources: tuple[relax.Var, ...] = ()  # bindings whose forms this one absorbed
    name: str = "folded"  # the first convolution's binding: the folded one is named after it

    @property
    def folded(self) -> bool:
        """Does emitting this form remove work: a batch norm (four elementwise ops once
        legalized, a square root among them), a summed branch, or more channel-wise ops than
        the one convolution, multiply and add it becomes? A form already folded is not."""
        emitted = sum((self.weight is not None, self.scale is not None, self.bias is not None))
        return bool(self.branches) or "batch_norm" in self.parts or len(self.parts) > emitted

    def summed(self, other: _Affine, **fields) -> _Affine:
        """``self + other`` with ``fields`` of the merged kernel, their histories joined."""
        def branches(f: _Affine) -> tuple[str, ...]:
            head = f.branches
            if f.parts or not head:
                head += (" + ".join(f.parts) or "identity",)
            return head
        return replace(self, parts=(), branches=branches(self) + branches(other),
                       sources=self.sources + other.sources, **fields)

    def times(self, vec: np.ndarray, part: str) -> _Affine:
        if self.weight is not None:
            weight, scale = self.weight * vec[:, None, None, None], None
        else:
            weight, scale = None, self._scale() * vec
        bias = None if self.bias is None else self.bias * vec
        return replace(self, weight=weight, scale=scale, bias=bias, parts=self.parts + (part,))

    def plus(self, vec: np.ndarray, part: str | None) -> _Affine:
        bias = vec if self.bias is None else self.bias + vec
        return replace(self, bias=bias, parts=self.parts + ((part,) if part else ()))

    def _scale(self) -> np.ndarray:
        return np.ones(self.channels) if self.scale is None else self.scale

    def as_conv(self, like: _Affine) -> _Affine | None:
        """The identity as a 1x1 convolution shaped like ``like`` (None: it cannot be)."""
        if self.weight is not None:
            return self
        if self.channels != like.channels or like.strides != (1, 1):
            return None
        per_group = self.channels // like.groups
        weight = np.zeros((self.channels, per_group, 1, 1))
        weight[np.arange(self.channels), np.arange(self.channels) % per_group, 0, 0] = self._scale()
        return replace(self, weight=weight, scale=None, groups=like.groups, dilation=like.dilation,
                       name=like.name)


def _shape(expr: relax.Expr) -> tuple[int | str, ...] | None:
    """``expr``'s shape; a symbolic dimension (a dynamic batch) by its name."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values)


def _dtype(expr: relax.Expr) -> str:
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else ""


def _merge(a: _Affine, b: _Affine, out_hw: tuple[int, int], in_hw: tuple[int, int]) -> _Affine | None:
    """``a + b`` as one convolution of their common input, or None where no kernel is both."""
    if a.weight is None and b.weight is None:
        bias = _sum(a.bias, b.bias)
        return a.summed(b, scale=a._scale() + b._scale(), bias=bias)
    a, b = a.as_conv(b), b.as_conv(a)
    if a is None or b is None:
        return None
    if (a.strides, a.dilation, a.groups) != (b.strides, b.dilation, b.groups):
        return None
    if a.weight.shape[:2] != b.weight.shape[:2]:
        return None
    top = max(a.padding[0], b.padding[0])
    left = max(a.padding[1], b.padding[1])
    kernel, pads = [0, 0], list(a.padding)
    shifts = {}
    for f in (a, b):
        for axis, lo in ((0, top), (1, left)):
            gap = lo - f.padding[axis]
            if gap % f.dilation[axis]:
                return None
            shifts[id(f), axis] = gap // f.dilation[axis]
            kernel[axis] = max(kernel[axis], shifts[id(f), axis] + f.weight.shape[2 + axis])
    for axis, lo in ((0, top), (1, left)):
        # the far padding that keeps a's output extent with the grown kernel
        extra = kernel[axis] - shifts[id(a), axis] - a.weight.shape[2 + axis]
        pads[axis + 2] = a.padding[axis + 2] + extra * a.dilation[axis]
        pads[axis] = lo
        span = in_hw[axis] + lo + pads[axis + 2] - a.dilation[axis] * (kernel[axis] - 1) - 1
        if span < 0 or span // a.strides[axis] + 1 != out_hw[axis]:
            return None
    weight = np.zeros(a.weight.shape[:2] + tuple(kernel))
    for f in (a, b):
        dy, dx = shifts[id(f), 0], shifts[id(f), 1]
        kh, kw = f.weight.shape[2:]
        weight[:, :, dy:dy + kh, dx:dx + kw] += f.weight
    return a.summed(b, weight=weight, bias=_sum(a.bias, b.bias), padding=tuple(pads))


def _sum(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return b
    return a if b is None else a + b


class _Analysis:
    """The affine form of every binding of one function (where it has one)."""

    def __init__(self, func: relax.Function):
        self.values = relax.analysis.get_var2val(func)
        self.uses: dict[relax.Var, int] = {}
        for value in self.values.values():
            for var in relax.analysis.free_vars(value):
                self.uses[var] = self.uses.get(var, 0) + 1
        for var in relax.analysis.free_vars(func.body):
            self.uses[var] = self.uses.get(var, 0) + 1
        self.forms: dict[relax.Var, _Affine] = {}
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

    def _operand(self, expr: relax.Expr) -> _Affine | None:
        """The form of an operand this binding may absorb: one with no other use."""
        form = self.forms.get(expr) if isinstance(expr, relax.Var) else None
        if form is not None and self.uses.get(expr, 0) == 1:
            return replace(form, sources=form.sources + (expr,))
        return None

    def _channel(self, expr: relax.Expr, out_shape: tuple[int, ...]) -> np.ndarray | None:
        """A constant that varies at most along the channels of an NCHW ``out_shape``."""
        value = self.constant(expr)
        if value is None or value.ndim > 4:
            return None
        full = value.reshape((1,) * (4 - value.ndim) + value.shape)
        if full.shape[0] != 1 or full.shape[2:] != (1, 1) or full.shape[1] not in (1, out_shape[1]):
            return None
        return np.broadcast_to(full[0, :, 0, 0], (out_shape[1],)).copy()

    def _form(self, var: relax.Var, value: relax.Expr) -> _Affine | None:
        out = _shape(var)
        if out is None or len(out) != 4 or not isinstance(out[1], int) or _dtype(var) not in _FLOATS:
            return None
        if isinstance(value, relax.TupleGetItem):
            return self._batch_norm(value, out)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        name, args = value.op.name, value.args
        if name == "relax.nn.conv2d":
            return self._conv(var, value, out)
        if name in ("relax.add", "relax.subtract", "relax.multiply", "relax.divide"):
            return self._binary(name, args, out)
        return None

    def _conv(self, var: relax.Var, call: relax.Call, out: tuple[int, ...]) -> _Affine | None:
        attrs = call.attrs
        weight = self.constant(call.args[1])
        if (weight is None or (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW")
                or (attrs.out_layout or "NCHW") != "NCHW"
                or _dtype(call.args[0]) != _dtype(call)):
            return None
        pad = [int(p) for p in attrs.padding]
        pad = pad * 4 if len(pad) == 1 else pad * 2 if len(pad) == 2 else pad
        return _Affine(x=call.args[0], dtype=_dtype(call), channels=out[1], weight=weight,
                       strides=tuple(int(s) for s in attrs.strides), padding=tuple(pad),
                       dilation=tuple(int(d) for d in attrs.dilation), groups=int(attrs.groups),
                       parts=(f"conv2d {weight.shape[2]}x{weight.shape[3]}",), name=var.name)

    def _batch_norm(self, item: relax.TupleGetItem, out: tuple[int, ...]) -> _Affine | None:
        tup = item.tuple_value
        call = self.values.get(tup) if isinstance(tup, relax.Var) else None
        if (item.index != 0 or not isinstance(call, relax.Call)
                or call.op != tvm.ir.Op.get("relax.nn.batch_norm")):
            return None
        attrs = call.attrs
        if attrs.training or int(attrs.axis) not in (1, -3):
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

    def _identity(self, expr: relax.Expr, out: tuple[int, ...]) -> _Affine:
        return _Affine(x=expr, dtype=_dtype(expr), channels=out[1])

    def _binary(self, name: str, args, out: tuple[int, ...]) -> _Affine | None:
        short = name.split(".")[-1]
        for this, other in ((args[0], args[1]), (args[1], args[0])):
            if name in ("relax.subtract", "relax.divide") and not this.same_as(args[0]):
                break
            vec = self._channel(other, out)
            if vec is None:
                continue
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

    def _sum_branches(self, args, out: tuple[int, ...]) -> _Affine | None:
        forms = []
        for arg in args:  # a branch, or the input itself (a residual identity)
            forms.append(self._operand(arg) or self._identity(arg, out))
        a, b = forms
        if a is None or b is None or not a.x.same_as(b.x) or a.dtype != b.dtype:
            return None
        if not (a.weight is not None or b.weight is not None or a.folded or b.folded):
            return None  # x + x, or scaled copies of x: nothing to fold
        in_shape = _shape(a.x)
        if (in_shape is None or len(in_shape) != 4 or in_shape[0] != out[0]
                or not all(isinstance(d, int) for d in in_shape[2:] + out[2:])):
            return None
        return _merge(a, b, out[2:], in_shape[2:])


def _describe(form: _Affine) -> str:
    """``2 branches summed (conv2d 3x3 + batch_norm; conv2d 1x1 + batch_norm) -> conv2d 3x3
    + bias``; ``conv2d 3x3 + batch_norm -> conv2d 3x3 + bias``."""
    what = " + ".join(form.parts)
    if form.branches:
        summed = f"{len(form.branches)} branches summed ({'; '.join(form.branches)})"
        what = f"{summed} + {what}" if what else summed
    if form.weight is None:
        return f"{what} -> multiply-add"
    kh, kw = form.weight.shape[2:]
    return f"{what} -> conv2d {kh}x{kw}" + (" + bias" if form.bias is not None else "")


def _steps(form: _Affine) -> list:
    """The folded form as Relax calls on its input, in order: one convolution plus a bias, or
    one multiply-add."""
    dtype = form.dtype
    channel = (1, form.channels, 1, 1)
    steps = []
    if form.weight is not None:
        weight = relax.const(form.weight.astype(dtype))
        steps.append(lambda y: relax.op.nn.conv2d(
            y, weight, strides=form.strides, padding=form.padding, dilation=form.dilation,
            groups=form.groups, out_dtype=dtype))
    elif form.scale is not None and not np.all(form.scale == 1.0):
        scale = relax.const(form.scale.reshape(channel).astype(dtype))
        steps.append(lambda y: relax.op.multiply(y, scale))
    if form.bias is not None:
        bias = relax.const(form.bias.reshape(channel).astype(dtype))
        steps.append(lambda y: relax.op.add(y, bias))
    return steps


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, forms: dict[relax.Var, _Affine]):
        super().__init__(mod)
        self.forms = forms

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        form = self.forms.get(binding.var)
        if form is None:
            super().visit_var_binding_(binding)
            return
        value = self.visit_expr(form.x)
        steps = _steps(form)
        for step in steps[:-1]:  # the convolution keeps the name of the one it replaces
            value = self.builder_.emit(step(value), form.name)
        if steps:
            value = steps[-1](value)
        name = binding.var.name
        if isinstance(binding.var, relax.DataflowVar):
            new = self.builder_.emit(value, name)
        else:
            new = self.builder_.emit_output(value, name)
        self.set_var_remap(binding.var, new)


def fold_weights(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[Fold]]:
    """Fold batch norms into convolutions and sum parallel convolution branches of one input
    into one, in every Relax function of ``mod``; return the module and what was folded."""
    notes: list[Fold] = []
    out = mod.clone()  # the caller's module stays as it was
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        forms = {v: f for v, f in _Analysis(func).forms.items() if f.folded}
        absorbed = {s for f in forms.values() for s in f.sources}
        final = {v: f for v, f in forms.items() if v not in absorbed}
        if not final:
            continue
        rewriter = _Rewriter(out, final)
        new = rewriter.visit_expr(func)
        out = rewriter.builder_.get()  # carries what the builder added; swap the function in
        out[gvar] = relax.analysis.remove_all_unused(new)
        notes += [Fold(v.name, _describe(f)) for v, f in final.items()]
    return out, notes


@tvm.transform.module_pass(opt_level=0, name="CostFuseFoldWeights")
def FoldWeights(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """:func:`fold_weights` as a module pass (what the pipelines run before legalizing)."""
    return fold_weights(mod)[0]
