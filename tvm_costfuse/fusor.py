"""The rewrite behind ``apply_partition``: FuseOps' ``OperatorFusor`` / ``FunctionCreator``
(src/relax/transform/fuse_ops.cc) in Python, for any grouping ``partition`` has validated.

For FuseOps' own partition the output is structurally equal to FuseOps'. It differs only where
FuseOps would emit a module that does not build: tuple-typed group outputs are flattened (and
de-duplicated against their elements), every group output is remapped at the call site, and a
group's call binds its real output rather than its last binding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .graph import binding_name_map

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")

__all__ = ["Fusor"]


@dataclass
class _GroupFunction:
    """What FuseOps' FunctionCreator collects for one group, then the function it builds."""

    bindings: list = field(default_factory=list)
    params: list = field(default_factory=list)
    arguments: list = field(default_factory=list)
    outputs: list = field(default_factory=list)  # original vars, in FuseOps' output order
    name: str = "fused"
    defined: set = field(default_factory=set)
    partial_tuples: dict = field(default_factory=dict)  # tuple argument -> indices read
    n_const: int = 0
    bound: frozenset = frozenset()  # variables the caller's bindings define
    function: relax.Function | None = None
    out_index: dict = field(default_factory=dict)  # original var -> flat output index or list

    def _is_argument(self, expr) -> bool:
        return any(expr.same_as(a) for a in self.arguments)

    def _check_def(self, expr) -> None:
        if self._is_argument(expr):
            return
        is_var = isinstance(expr, relax.Var)
        if is_var and expr in self.defined:
            return
        if is_var:
            name = expr.name
        else:
            name = f"param_{self.n_const}"
            self.n_const += 1
        if isinstance(expr.ty, tvm.ir.PrimType) and not (is_var and expr in self.bound):
            # FuseOps keeps PrimValues inline (they still use up a param_N name), and so a
            # symbolic shape variable passed as a scalar (ops legalized on symbolic shapes
            # take one): it reaches the group through the ``tir_vars`` parameter.
            return
        self.params.append(relax.Var(name, expr.ty))
        self.arguments.append(expr)
        if isinstance(expr.ty, relax.TupleType):
            self.partial_tuples[expr] = []

    def append(self, binding) -> None:
        value = binding.value
        if isinstance(value, relax.Call):
            self.name += "_" + value.args[0].name_hint
            for arg in value.args[1].fields:
                self._check_def(arg)
        else:  # TupleGetItem
            self._check_def(value.tuple_value)
            if value.tuple_value in self.partial_tuples:
                self.partial_tuples[value.tuple_value].append(value.index)
        self.defined.add(binding.var)
        if not isinstance(binding.var, relax.DataflowVar):
            self.add_output(binding.var)
        self.bindings.append(binding)

    def add_output(self, var) -> None:
        if var not in self.outputs:
            self.outputs.append(var)

    def create(self) -> None:
        """Build the grouped function (FunctionCreator::CreateFunction)."""
        if not self.outputs:
            return  # dead group: nothing outside reads it
        # A tuple parameter read only through TupleGetItem is replaced by its used fields.
        item_param: dict = {}
        for tup, indices in self.partial_tuples.items():
            pos = next(i for i, a in enumerate(self.arguments) if a.same_as(tup))
            base = self.params[pos].name
            fields = list(dict.fromkeys(indices))
            new_params = [relax.Var(f"{base}_{i}", tup.ty.fields[i]) for i in fields]
            self.arguments[pos:pos + 1] = [relax.TupleGetItem(tup, i) for i in fields]
            self.params[pos:pos + 1] = new_params
            item_param[tup] = dict(zip(fields, new_params, strict=True))

        bb = relax.BlockBuilder()
        remap = {a: p for a, p in zip(self.arguments, self.params, strict=True)
                 if isinstance(a, relax.Var | tvm.ir.expr.GenericConst)}

        def sub(expr):
            if isinstance(expr, relax.Tuple):
                return relax.Tuple([sub(f) for f in expr.fields])
            for a, p in remap.items():
                if expr.same_as(a):
                    return p
            return expr

        flat: list = []
        with bb.function(self.name, self.params, attrs={"Primitive": True}, private=True):
            with bb.dataflow():
                new_of: dict = {}
                for b in self.bindings:
                    v = b.value
                    if isinstance(v, relax.TupleGetItem) and v.tuple_value in item_param:
                        new_of[b.var] = remap[b.var] = item_param[v.tuple_value][v.index]
                        continue
                    if isinstance(v, relax.Call):
                        args = list(v.args)
                        args[1] = sub(args[1])
                        new_value = relax.Call(v.op, args, v.attrs, v.ty_args, ret_ty=v.ty)
                    else:
                        new_value = relax.TupleGetItem(sub(v.tuple_value), v.index)
                    if b.var in self.outputs and not isinstance(b.var.ty, relax.TupleType):
                        new_of[b.var] = bb.emit_output(new_value)
                    else:
                        new_of[b.var] = bb.emit(new_value, name_hint=b.var.name)
                    remap[b.var] = new_of[b.var]
                # Tensors first (a stable sort keeps FuseOps' order), so that a flattened
                # tuple can reuse the outputs of its items.
                by_kind = sorted(self.outputs, key=lambda v: isinstance(v.ty, relax.TupleType))
                for var in by_kind:
                    if isinstance(var.ty, relax.TupleType):
                        # Flatten: a tuple result becomes its fields, reusing field outputs.
                        idx = []
                        for i in range(len(var.ty.fields)):
                            item = next((o for o in self.outputs if _is_item(self, o, var, i)),
                                        None)
                            if item is not None and new_of[item] in flat:
                                idx.append(flat.index(new_of[item]))
                                continue
                            flat.append(bb.emit_output(relax.TupleGetItem(new_of[var], i)))
                            idx.append(len(flat) - 1)
                        self.out_index[var] = idx
                    else:
                        if new_of[var] not in flat:
                            flat.append(new_of[var])
                        self.out_index[var] = flat.index(new_of[var])
            bb.emit_func_output(flat[0] if len(flat) == 1 else relax.Tuple(flat))
        func = bb.get()[self.name]
        free = relax.analysis.free_symbolic_vars(func)
        if free:
            self.params.append(relax.Var("tir_vars", relax.ShapeType(list(free))))
            self.arguments.append(relax.ShapeExpr(list(free)))
            func = relax.Function(self.params, func.body, None, True, func.attrs)
        # Symbolic vars of its own, not shared with the caller (FuseOps' SymbolicVarRenewMutator).
        symbolic = relax.analysis.defined_symbolic_vars(func)
        if symbolic:
            func = func.bind_symbolic_vars({v: tvm.tirx.Var(v.name, v.ty) for v in symbolic})
        self.function = func

    @property
    def tuple_result(self) -> bool:
        return isinstance(self.function.ret_ty, relax.TupleType)


def _is_item(info: _GroupFunction, var, tup, index: int) -> bool:
    for b in info.bindings:
        if b.var.same_as(var):
            v = b.value
            return (isinstance(v, relax.TupleGetItem) and v.tuple_value.same_as(tup)
                    and v.index == index)
    return False


def _used_vars(expr) -> list:
    out: list = []
    relax.analysis.post_order_visit(
        expr, lambda e: out.append(e) if isinstance(e, relax.Var) else None
    )
    return out


@mutator
class Fusor(PyExprMutator):
    """OperatorFusor: replaces each group's bindings with one call to its grouped function."""

    def __init__(self, mod: tvm.IRModule, groups: list[list[str]], func_name: str) -> None:
        super().__init__(mod)
        by_name = binding_name_map(mod[func_name])
        self.group_of = {by_name[name].var: gi for gi, g in enumerate(groups) for name in g}
        self.bound = frozenset(b.var for blk in mod[func_name].body.blocks for b in blk.bindings)
        self.n_groups = len(groups)
        #: group index -> the GlobalVar of its grouped function (FuseTIR keeps the name)
        self.functions: dict[int, tvm.ir.GlobalVar] = {}

    def visit_dataflow_block_(self, block: relax.DataflowBlock):
        def gkey(var):
            gi = self.group_of.get(var) if var in def_vars else None
            return gi if gi is not None else ("v", var)

        def_vars = {b.var for b in block.bindings}
        funcs: dict[int, _GroupFunction] = {}
        for b in block.bindings:
            gi = self.group_of.get(b.var)
            if gi is not None:
                funcs.setdefault(gi, _GroupFunction(bound=self.bound)).append(b)
        deps: dict = {}
        for b in block.bindings:
            cur = gkey(b.var)
            for used in _used_vars(b.value):
                prod = gkey(used)
                if prod != cur:
                    deps.setdefault(cur, []).append(prod)
                    if isinstance(prod, int):
                        funcs[prod].add_output(used)
        for info in funcs.values():
            info.create()

        self.builder_._begin_dataflow_block()  # pylint: disable=protected-access
        for b in _topo_sort(block.bindings, gkey, deps):
            gi = gkey(b.var)
            if not isinstance(gi, int):
                self.visit_binding(b)
                continue
            info = funcs[gi]
            if info.function is None or not b.same_as(info.bindings[-1]):
                continue
            gvar = self.functions[gi] = self.builder_.add_func(info.function, info.name)
            call = relax.Call(gvar, [self.visit_expr(a) for a in info.arguments])
            if isinstance(b.var, relax.DataflowVar):
                result = self.builder_.emit(call)
            else:
                result = self.builder_.emit_output(call)
            if not info.tuple_result:
                (var,) = info.out_index
                self.set_var_remap(var, result)
                continue
            for var in info.bindings:
                var = var.var
                if var not in info.out_index:
                    continue
                idx = info.out_index[var]
                if isinstance(idx, list):
                    item = relax.Tuple([relax.TupleGetItem(result, i) for i in idx])
                else:
                    item = relax.TupleGetItem(result, idx)
                self.set_var_remap(var, self.builder_.emit(item))
        return self.builder_._end_block()  # pylint: disable=protected-access


def _topo_sort(bindings, gkey, deps) -> list:
    """FuseOps' TopoSortByGroupDep: group by group, dependencies first, else program order."""
    per_group: dict = {}
    order = []
    for b in bindings:
        k = gkey(b.var)
        order.append(k)
        per_group.setdefault(k, []).append(b)
    visited: set = set()
    out: list = []
    for root in order:
        if root in visited:
            continue
        visited.add(root)
        stack = [(root, iter(deps.get(root, ())))]
        while stack:
            g, it = stack[-1]
            dep = next(it, None)
            if dep is None:
                stack.pop()
                out.extend(per_group.get(g, ()))
            elif dep not in visited:
                visited.add(dep)
                stack.append((dep, iter(deps.get(dep, ()))))
    return out
