"""Sibling matmuls on one input, found and rewritten as one matmul (the horizontal
contraction; whether a set is combined is :mod:`.horizontal`'s decision).

Q/K/V projections and a SwiGLU MLP's gate and up projections are matmuls of one activation by
constant weights. As separate kernels each is dispatched (and, at several threads, wakes the
pool) on its own and each streams the shared input. Concatenating their weights along the
output columns at compile time makes them one contraction with a wider output; each
sibling's value is then a ``strided_slice`` of its columns, which the planner fuses into its
consumers or leaves as a copy like any other injective op. Biases concatenate the same way.
Every output column's dot product runs over the same reduction in order: where one rule
schedules both sides the outputs are bit-equal (the corpus' projections); a sibling narrower
than a vector may be scheduled by another rule than the combined matmul, equal within rounding.

Only static shapes, and sets alike in having a bias or not (a bias-less K projection beside
biased Q and V stays apart from them): a zero bias would be an extra add.

TVM's ``CombineParallelMatmul`` does the rewrite without a decision, ends in a ``split`` whose
tuple output no consumer can read in place (it stays a copy kernel), and finds no siblings in
imported models: the torch frontend reshapes the shared activation once per projection and
writes a bias add as ``add(bias, matmul)``. Hence a rewrite of our own, in the style of
:mod:`.fold`, that sees through reshapes of one value and takes either operand order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

__all__ = ["Siblings", "combine_siblings", "constant_bytes", "find_siblings", "sibling_program"]

_FLOATS = ("float32", "float64", "float16")
_MATMUL = "relax.matmul"


@dataclass
class Branch:
    """One sibling: ``var = lhs @ weight (+ bias)``; ``matmul`` is its matmul's var (``var``
    itself when it has no bias)."""

    var: relax.Var
    matmul: relax.Var
    lhs: relax.Var
    constant: relax.Expr  # the weight as the model holds it: K x N, or N x K transposed
    transposed: bool
    bias: np.ndarray | None  # N

    @property
    def width(self) -> int:
        return _shape(self.constant)[0 if self.transposed else 1]

    @property
    def weight(self) -> np.ndarray:
        """K x N, read only where the set is combined (a model's weights are large)."""
        value = self.constant.value.numpy()
        return value.T if self.transposed else value

    @property
    def shape(self) -> tuple[int, ...]:
        return _shape(self.lhs)

    @property
    def dtype(self) -> str:
        return _dtype(self.var)


@dataclass
class Siblings:
    """Matmuls of one value by constant weights, in program order."""

    branches: list[Branch] = field(default_factory=list)
    combine: bool = True
    why: str = ""
    #: the cost model's seconds for the set apart and combined, where it priced them
    prices: tuple[float, float] | None = None

    @property
    def widths(self) -> list[int]:
        return [b.width for b in self.branches]

    def __str__(self) -> str:
        names = ", ".join(b.var.name for b in self.branches)
        verdict = "one matmul" if self.combine else "left apart"
        return f"{names} ({'+'.join(map(str, self.widths))} columns): {verdict}; {self.why}"


def _shape(expr: relax.Expr) -> tuple[int, ...] | None:
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


class _Analysis:
    def __init__(self, func: relax.Function):
        self.values = relax.analysis.get_var2val(func)
        self.users: dict[relax.Var, list[relax.Var]] = {}
        self.block: dict[relax.Var, int] = {}
        for i, block in enumerate(func.body.blocks):
            for b in block.bindings:
                self.block[b.var] = i
                for var in relax.analysis.free_vars(b.value):
                    self.users.setdefault(var, []).append(b.var)
        for var in relax.analysis.free_vars(func.body.body):
            self.users.setdefault(var, []).append(None)

    def _call(self, expr, name: str) -> relax.Call | None:
        value = self.values.get(expr) if isinstance(expr, relax.Var) else None
        if isinstance(value, relax.Call) and value.op == tvm.ir.Op.get(name):
            return value
        return None

    def root(self, expr: relax.Expr) -> relax.Expr:
        """``expr`` seen through reshapes: equal roots and equal shapes are equal values."""
        while (call := self._call(expr, "relax.reshape")) is not None:
            expr = call.args[0]
        return expr

    def weight(self, expr: relax.Expr) -> tuple[relax.Expr, bool] | None:
        """A 2-d constant right operand, or one transpose of it: (the constant, transposed)."""
        transposed = False
        transpose = self._call(expr, "relax.permute_dims")
        if transpose is not None:
            axes = transpose.attrs.axes
            if axes is not None and [int(a) for a in axes] != [1, 0]:
                return None
            expr, transposed = transpose.args[0], True
        shape = _shape(expr)
        if not isinstance(expr, tvm.ir.expr.GenericConst) or shape is None or len(shape) != 2:
            return None
        return expr, transposed

    def bias(self, matmul: relax.Var, width: int) -> tuple[relax.Var, np.ndarray] | None:
        """``(var, bias)`` where the matmul's one use adds a constant vector of its columns."""
        users = self.users.get(matmul, [])
        if len(users) != 1 or users[0] is None or self.block.get(users[0]) != self.block[matmul]:
            return None  # the slice takes the add's place: in the combined matmul's block
        add = self._call(users[0], "relax.add")
        if add is None or _shape(users[0]) != _shape(matmul):
            return None
        other = add.args[1] if add.args[0].same_as(matmul) else add.args[0]
        if not isinstance(other, tvm.ir.expr.GenericConst):
            return None
        value = other.value.numpy()
        if value.size != width or (value.ndim and value.shape[-1] != width):
            return None
        return users[0], value.reshape(width)

    def branch(self, var: relax.Var, call: relax.Call) -> Branch | None:
        lhs, rhs = call.args
        out, shape = _shape(var), _shape(lhs)
        dtype = _dtype(var)
        found = self.weight(rhs)
        if (found is None or out is None or shape is None or dtype not in _FLOATS
                or _dtype(lhs) != dtype or _dtype(found[0]) != dtype
                or not isinstance(lhs, relax.Var)):
            return None
        branch = Branch(var, var, lhs, *found, None)
        if shape[-1] != _shape(found[0])[1 if branch.transposed else 0]:
            return None
        biased = self.bias(var, branch.width)
        if biased is not None and biased[1].dtype == np.dtype(dtype):
            return Branch(biased[0], var, lhs, *found, biased[1])
        return branch


def find_siblings(func: relax.Function) -> list[Siblings]:
    """Sets of two or more matmuls of one value by constant weights, within one dataflow
    block (a binding outside dataflow may have effects between them)."""
    analysis = _Analysis(func)
    found: list[Siblings] = []
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        sets: dict[tuple, Siblings] = {}
        for b in block.bindings:
            call = b.value
            if not (isinstance(call, relax.Call) and call.op == tvm.ir.Op.get(_MATMUL)):
                continue
            branch = analysis.branch(b.var, call)
            if branch is None:
                continue
            lhs = call.args[0]
            key = (analysis.root(lhs), _shape(lhs), _dtype(lhs), branch.bias is not None)
            sets.setdefault(key, Siblings()).branches.append(branch)
        found += [s for s in sets.values() if len(s.branches) > 1]
    return found


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    """Emits each combined matmul at its first sibling's place, and each sibling's value as
    a slice of its columns where the sibling was bound."""

    def __init__(self, mod: tvm.IRModule, sets: list[Siblings]):
        super().__init__(mod)
        self.first = {s.branches[0].matmul: s for s in sets}
        self.slices: dict[relax.Var, tuple[Siblings, int, int]] = {}
        self.dropped: set[relax.Var] = set()
        for s in sets:
            start = 0
            for b in s.branches:
                width = b.width
                self.slices[b.var] = (s, start, start + width)
                if b.matmul is not b.var:
                    self.dropped.add(b.matmul)
                start += width
        self.combined: dict[int, relax.Var] = {}

    def _emit_combined(self, s: Siblings) -> None:
        first = s.branches[0]
        weight = relax.const(np.concatenate([b.weight for b in s.branches], axis=1))
        lhs = self.visit_expr(first.lhs)
        value = relax.op.matmul(lhs, weight, out_dtype=_dtype(first.var))
        name = f"{first.var.name}_siblings"
        if first.bias is not None:
            value = self.builder_.emit(value, name + "_matmul")
            bias = relax.const(np.concatenate([b.bias for b in s.branches]))
            value = relax.op.add(value, bias)
        self.combined[id(s)] = self.builder_.emit(value, name)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var = binding.var
        s = self.first.get(var)
        if s is not None:
            self._emit_combined(s)
        if var in self.dropped:
            return
        if var not in self.slices:
            super().visit_var_binding_(binding)
            return
        s, begin, end = self.slices[var]
        combined = self.combined[id(s)]
        axis = len(_shape(combined)) - 1
        value = relax.op.strided_slice(combined, axes=[axis], begin=[begin], end=[end])
        if self.builder_.current_block_is_dataflow() and not isinstance(
                var, relax.DataflowVar):
            new = self.builder_.emit_output(value, var.name)
        else:
            new = self.builder_.emit(value, var.name)
        self.set_var_remap(var, new)


def combine_siblings(mod: tvm.IRModule, decide=None) -> tuple[tvm.IRModule, list[Siblings]]:
    """Every sibling set of ``mod``'s Relax functions, and the module with those ``decide``
    accepts combined (``decide(siblings)`` sets ``combine`` and ``why``; None: combine all)."""
    out = mod.clone()
    found: list[Siblings] = []
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        sets = find_siblings(func)
        for s in sets:
            if decide is not None:
                decide(s)
        found += sets
        chosen = [s for s in sets if s.combine]
        if not chosen:
            continue
        rewriter = _Rewriter(out, chosen)
        new = rewriter.visit_expr(func)
        out = rewriter.builder_.get()
        out[gvar] = relax.analysis.remove_all_unused(new)
    return out, found


def sibling_program(shape: tuple[int, ...], dtype: str, widths: list[int], bias: bool,
                    combined: bool) -> tvm.IRModule:
    """The siblings alone: ``x @ W_i (+ b_i)`` over an input of ``shape`` (zero weights: only
    the shapes are priced); ``combined``: rewritten by :func:`combine_siblings`, each sibling's
    slice an output of its own (a copy kernel unless the plan fuses it)."""
    x = relax.Var("x", relax.TensorType(shape, dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for n in widths:
                w = relax.const(np.zeros((shape[-1], n), dtype))
                y = bb.emit(relax.op.matmul(x, w, out_dtype=dtype))
                if bias:
                    y = bb.emit(relax.op.add(y, relax.const(np.zeros(n, dtype))))
                outs.append(y)
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    return combine_siblings(mod)[0] if combined else mod


def constant_bytes(mod: tvm.IRModule) -> int:
    """Bytes of the distinct constant tensors in ``mod``'s Relax functions (before
    legalizing: ``OpGraph.constant_bytes`` counts the same after it)."""
    seen: dict = {}

    def visit(expr) -> None:
        if isinstance(expr, tvm.ir.expr.GenericConst) and expr not in seen:
            shape, dtype = _shape(expr), _dtype(expr)
            bits = tvm.DataType(dtype).bits if dtype else 0
            seen[expr] = int(np.prod(shape)) * ((bits + 7) // 8) if shape is not None else 0

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return sum(seen.values())
