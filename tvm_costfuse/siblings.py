"""Horizontal contractions: sibling matmuls on one input as one matmul, where the cost model
says it pays.

Q/K/V projections and a SwiGLU MLP's gate and up projections are matmuls of one activation by
constant weights. As separate kernels each launches (and, at several threads, synchronizes
its pool) on its own and each streams the shared input. Concatenating their weights along the
output columns at compile time makes them one contraction with a wider output; each sibling's
value is then a slice of its columns, an injective view its consumers read in place (the
planner fuses slices like any other injective producer). Biases concatenate the same way.
The result is bit-identical per element: every output column's dot product runs over the same
reduction axis, in the schedule of one matmul, as before.

TVM's ``CombineParallelMatmul`` does the rewrite without a decision, ends in a ``split`` whose
tuple output no consumer can read in place (it stays a copy kernel), and finds no siblings in
imported models: the torch frontend reshapes the shared activation once per projection and
writes a bias add as ``add(bias, matmul)``. Hence a rewrite of our own, in the style of
:mod:`.fold`, that sees through reshapes of one value and either operand order.

Whether to combine is priced per sibling set by the analytical cost model
(:func:`price_siblings`): the separate contractions against the combined one, each legalized
and scheduled as the pipeline would, so the terms are the model's own (launches, the weight
stream, parallel grain over the wider output). A set priced slower combined stays apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import tvm
from tvm import relax

__all__ = ["CombineSiblings", "Siblings", "combine_siblings", "find_siblings", "price_siblings",
           "sibling_program"]

_FLOATS = ("float32", "float64", "float16")
_MATMUL = "relax.matmul"
# Combine only where the model prices it this much faster: the two sides read the same
# weights, and a smaller predicted difference is inside what two builds of one kernel differ
# by (a decode step's QKV projections at one thread: 0.01%, sibling GEMVs' own copies of
# their slices included).
MIN_GAIN = 0.005


@dataclass
class Branch:
    """One sibling: ``var = lhs @ weight (+ bias)``; ``matmul`` is its matmul's var (``var``
    itself when it has no bias)."""

    var: relax.Var
    matmul: relax.Var
    lhs: relax.Var
    weight: np.ndarray  # K x N, in the model's dtype
    bias: np.ndarray | None  # N


@dataclass
class Siblings:
    """Matmuls of one value by constant weights, in program order."""

    branches: list[Branch] = field(default_factory=list)
    combine: bool = True
    why: str = ""

    @property
    def widths(self) -> list[int]:
        return [b.weight.shape[1] for b in self.branches]

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
        for block in func.body.blocks:
            for b in block.bindings:
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

    def weight(self, expr: relax.Expr) -> np.ndarray | None:
        """A 2-d constant right operand (through one transpose of a constant), K x N."""
        transpose = self._call(expr, "relax.permute_dims")
        if transpose is not None:
            inner = transpose.args[0]
            axes = transpose.attrs.axes
            if not isinstance(inner, tvm.ir.expr.GenericConst) or (
                    axes is not None and [int(a) for a in axes] != [1, 0]):
                return None
            value = inner.value.numpy()
            return value.T if value.ndim == 2 else None
        if isinstance(expr, tvm.ir.expr.GenericConst):
            value = expr.value.numpy()
            return value if value.ndim == 2 else None
        return None

    def bias(self, matmul: relax.Var, width: int) -> tuple[relax.Var, np.ndarray] | None:
        """``(var, bias)`` where the matmul's one use adds a constant vector of its columns."""
        users = self.users.get(matmul, [])
        if len(users) != 1 or users[0] is None:
            return None
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
        weight = self.weight(rhs)
        if (weight is None or out is None or shape is None or dtype not in _FLOATS
                or _dtype(lhs) != dtype or weight.dtype != np.dtype(dtype)
                or shape[-1] != weight.shape[0] or not isinstance(lhs, relax.Var)):
            return None
        biased = self.bias(var, weight.shape[1])
        if biased is not None and biased[1].dtype == weight.dtype:
            return Branch(biased[0], var, lhs, weight, biased[1])
        return Branch(var, var, lhs, weight, None)


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
                width = b.weight.shape[1]
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


def price_siblings(s: Siblings, desc, config, compile_target,
                   constant_bytes: int = 0) -> tuple[float, float]:
    """Seconds the cost model predicts for the siblings apart and combined, each side the
    plan the planner makes of it on ``compile_target`` (priced with ``desc``), its weights
    priced as in a module holding ``constant_bytes`` of constants (whether they stay cached
    between calls). The combined side keeps every slice as an output: where the model's plan
    fuses a slice into its consumers instead, combining gains more than priced here."""
    from .graph import build_graph
    from .pipelines import prepare  # the pipelines import this module
    from .transform import plan_module

    first = s.branches[0]
    shape, dtype = _shape(first.lhs), _dtype(first.var)
    seconds = []
    for combined in (False, True):
        mod = sibling_program(shape, dtype, s.widths, first.bias is not None, combined)
        with compile_target:
            prepared = prepare(mod, compile_target, fold=False)
            graph = build_graph(prepared)
            graph = replace(graph, constant_bytes=max(graph.constant_bytes, constant_bytes))
            plan = plan_module(prepared, desc, config, compile_target=compile_target,
                               graph=graph)
        seconds.append(plan.seconds)
    return seconds[0], seconds[1]


def constant_bytes(mod: tvm.IRModule) -> int:
    """Bytes of the distinct constant tensors in ``mod``'s Relax functions."""
    seen: dict = {}

    def visit(expr) -> None:
        if isinstance(expr, tvm.ir.expr.GenericConst) and expr not in seen:
            shape, dtype = _shape(expr), _dtype(expr)
            bits = tvm.DataType(dtype).bits if dtype else 0
            seen[expr] = int(np.prod(shape)) * bits // 8 if shape is not None else 0

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return sum(seen.values())


def CombineSiblings(costfuse) -> tvm.transform.Pass:
    """The rewrite as a module pass for ``costfuse`` (a :class:`~.transform.CostFuse`): its
    config's ``horizontal`` says whether the cost model decides (``"cost"``), or every set
    stays apart or is combined; the sets found, with the decision and both prices, are kept
    in ``costfuse.siblings`` (``costfuse explain`` prints them). Runs under the compile
    target, before LegalizeOps."""

    @tvm.transform.module_pass(opt_level=0, name="CostFuseCombineSiblings")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        config = costfuse.config()
        costfuse.siblings = []
        if config.horizontal == "never":
            return mod
        decide = _always
        if config.horizontal == "cost":
            desc = costfuse.describe_target(config)
            compile_target = tvm.target.Target.current()
            if compile_target is None:
                raise ValueError("CombineSiblings prices plans for the compile target: run it "
                                 "under `with target`")
            decide = _PricedDecision(desc, config, compile_target, constant_bytes(mod))
        out, found = combine_siblings(mod, decide)
        costfuse.siblings = found
        return out

    return _pass


def _always(s: Siblings) -> None:
    s.combine, s.why = True, "costfuse.horizontal is 'always'"


class _PricedDecision:
    """Combine where the cost model prices the combined side faster; one pricing per shape
    (a model's layers repeat them)."""

    def __init__(self, desc, config, compile_target, module_constants: int):
        self.args = (desc, config, compile_target, module_constants)
        self.prices: dict[tuple, tuple[float, float]] = {}

    def __call__(self, s: Siblings) -> None:
        first = s.branches[0]
        key = (_shape(first.lhs), _dtype(first.var), tuple(s.widths), first.bias is not None)
        if key not in self.prices:
            self.prices[key] = price_siblings(s, *self.args)
        apart, combined = self.prices[key]
        s.combine = combined < apart * (1 - MIN_GAIN)
        s.why = f"predicted {apart * 1e6:.2f} us apart, {combined * 1e6:.2f} us as one"
