"""apply_partition: turn any legal grouping of bindings into FuseOps-style grouped functions.

TVM's C++ helper that applies an arbitrary group map (``MakeGroupedFunctions``) is not exposed
to Python, and ``FuseOpsByPattern`` only takes tree-shaped groups. This module re-implements
FuseOps' ``OperatorFusor`` / ``FunctionCreator`` (src/relax/transform/fuse_ops.cc) in Python so
that for FuseOps' own partition the output is structurally equal to FuseOps', and ``FuseTIR``
then makes one PrimFunc per group. It differs from FuseOps only where FuseOps would emit a module
that does not build: tuple-typed group outputs are flattened (and de-duplicated against their
elements), every group output is remapped at the call site, and a group's call binds its real
output rather than its last binding.

A partition is validated completely (names, fusability, convexity) before anything is rebuilt,
and TVM IR is immutable, so a bad partition raises ``PartitionError`` and never yields a
half-rewritten module.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .graph import OpGraph, binding_name_map, binding_names, build_graph

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


class PartitionError(ValueError):
    """A partition that cannot be applied; the message names the group and the binding."""


def _describe(index: int, group: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in list(group)[:6]) + (", ..." if len(group) > 6 else "")
    return f"group {index} [{shown}]"


def resolve_groups(graph: OpGraph, groups: Sequence[Sequence[str]]) -> list[list[str]]:
    """Validate ``groups`` against ``graph`` and return the groups that will be fused.

    TupleGetItem bindings that no group names join the group of their tuple's producer; one
    named in a group that does not make its tuple stays there only if no other binding
    reads it. Groups
    left with a single binding, or with no call_tir, are dropped: they would make no kernel.
    Raises ``PartitionError`` for unknown, repeated or unfusable names, groups that span
    dataflow blocks, and groupings that are not convex or form a cycle between groups.
    """
    if isinstance(groups, str | bytes) or not isinstance(groups, Sequence):
        raise PartitionError("groups must be a list of lists of binding names")
    owner: dict[str, int] = {}
    resolved: list[list[str]] = []
    for gi, group in enumerate(groups):
        if isinstance(group, str | bytes) or not isinstance(group, Sequence):
            raise PartitionError(f"group {gi} must be a list of binding names, got {group!r}")
        if len(group) == 0:
            raise PartitionError(f"group {gi} is empty")
        for name in group:
            if not isinstance(name, str):
                raise PartitionError(f"group {gi} holds {name!r}, which is not a binding name")
            if name not in graph:
                raise PartitionError(
                    f"{_describe(gi, group)} names unknown binding {name!r}: no binding of "
                    f"{graph.func_name!r} has that name"
                )
            if name in owner:
                where = "twice in that group" if owner[name] == gi else f"also in group {owner[name]}"
                raise PartitionError(
                    f"binding {name!r} appears more than once: in {_describe(gi, group)} and "
                    f"{where}"
                )
            node = graph[name]
            if not node.fusable:
                raise PartitionError(
                    f"{_describe(gi, group)} cannot contain binding {name!r}: "
                    f"{node.why_not_fusable}"
                )
            owner[name] = gi
        blocks = {graph[n].block for n in group}
        if len(blocks) > 1:
            raise PartitionError(f"{_describe(gi, group)} spans several dataflow blocks")
        resolved.append(list(group))

    # TupleGetItem rides with its producer unless placed explicitly (program order handles
    # chains: a producer is always seen before its items).
    for node in graph.nodes:
        if node.kind == "tuple_get_item" and node.name not in owner:
            src = graph.producers(node.name)
            if src and src[0] in owner:
                owner[node.name] = owner[src[0]]
                resolved[owner[src[0]]].append(node.name)
    # A TupleGetItem computes nothing. One whose tuple comes from outside its group may stay
    # only if the group alone reads it; otherwise the group would return one of its own
    # parameters, which FuseTIR cannot lower, so it stays a plain binding.
    for group in resolved:
        members = set(group)
        for name in list(group):
            if graph[name].kind != "tuple_get_item":
                continue
            src = graph.producers(name)
            readers = set(graph.consumers.get(name, ()))
            read_inside_only = readers and readers <= members and name not in graph.block_outputs
            if not (src and src[0] in members) and not read_inside_only:
                group.remove(name)
                del owner[name]
    order = {n.name: n.index for n in graph.nodes}
    resolved = [sorted(g, key=order.__getitem__) for g in resolved]
    _check_acyclic(graph, resolved, owner, list(groups))
    # Like FuseOps, a lone binding stays a plain call; a group needs a kernel to make.
    return [
        g for g in resolved if len(g) > 1 and any(graph[n].kind == "call_tir" for n in g)
    ]


def _check_acyclic(graph: OpGraph, resolved, owner, original) -> None:
    """Fusing must leave a DAG: no path may leave a group and re-enter it (convexity), and no
    two groups may depend on each other. Checked on the quotient graph by iterative DFS."""

    def key(name: str):
        return ("g", owner[name]) if name in owner else ("n", name)

    succ: dict = {}
    witness: dict = {}
    for node in graph.nodes:
        for p in graph.producers(node.name):
            a, b = key(p), key(node.name)
            if a != b:
                succ.setdefault(a, []).append(b)
                witness.setdefault((a, b), (p, node.name))
    color: dict = {}
    for start in list(succ):
        if color.get(start):
            continue
        stack = [(start, iter(succ.get(start, ())))]
        path = [start]
        color[start] = 1
        while stack:
            u, it = stack[-1]
            v = next(it, None)
            if v is None:
                color[u] = 2
                stack.pop()
                path.pop()
                continue
            if color.get(v) == 1:
                _raise_cycle(path[path.index(v):] + [v], witness, original)
            if not color.get(v):
                color[v] = 1
                stack.append((v, iter(succ.get(v, ()))))
                path.append(v)


def _raise_cycle(cycle, witness, original) -> None:
    groups = sorted({k[1] for k in cycle if k[0] == "g"})
    hops = " -> ".join(f"{witness[(a, b)][0]!r}->{witness[(a, b)][1]!r}"
                       for a, b in itertools.pairwise(cycle))
    outside = [k[1] for k in cycle if k[0] == "n"]
    if len(groups) == 1:
        gi = groups[0]
        raise PartitionError(
            f"{_describe(gi, original[gi])} is not convex: a path leaves it and comes back "
            f"through binding {outside[0]!r} outside the group ({hops})"
        )
    raise PartitionError(
        f"groups {', '.join(map(str, groups))} form a cycle: fusing them would need each "
        f"before the other ({hops})"
    )


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
        if not is_var and isinstance(expr.ty, tvm.ir.PrimType):
            return  # FuseOps keeps PrimValues inline (they still use up a param_N name)
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
class _Fusor(PyExprMutator):
    """OperatorFusor: replaces each group's bindings with one call to its grouped function."""

    def __init__(self, mod: tvm.IRModule, groups: list[list[str]], func_name: str) -> None:
        super().__init__(mod)
        by_name = binding_name_map(mod[func_name])
        self.group_of = {by_name[name].var: gi for gi, g in enumerate(groups) for name in g}
        self.n_groups = len(groups)

    def visit_dataflow_block_(self, block: relax.DataflowBlock):
        def gkey(var):
            gi = self.group_of.get(var) if var in def_vars else None
            return gi if gi is not None else ("v", var)

        def_vars = {b.var for b in block.bindings}
        funcs: dict[int, _GroupFunction] = {}
        for b in block.bindings:
            gi = self.group_of.get(b.var)
            if gi is not None:
                funcs.setdefault(gi, _GroupFunction()).append(b)
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
            gvar = self.builder_.add_func(info.function, info.name)
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


def apply_partition(
    mod: tvm.IRModule, groups: Sequence[Sequence[str]], func_name: str = "main"
) -> tvm.IRModule:
    """Fuse each group of bindings of ``mod[func_name]`` into one private Primitive function.

    Parameters
    ----------
    mod
        A module after ``LegalizeOps`` and ``AnnotateTIROpPattern`` (see ``pipeline.prepare``).
    groups
        Lists of binding names (``OpGraph`` node names). Bindings in no group stay as they are.
    func_name
        The Relax function to rewrite.

    Returns
    -------
    A new module in which ``FuseTIR`` turns every group into one PrimFunc.
    """
    graph = build_graph(mod, func_name)
    fused = resolve_groups(graph, groups)
    fusor = _Fusor(mod, fused, func_name)
    gvar = mod.get_global_var(func_name)
    new_func = fusor.visit_expr(mod[func_name])
    fusor.builder_.update_func(gvar, new_func)
    return fusor.builder_.get()


def ApplyPartition(groups: Sequence[Sequence[str]], func_name: str = "main") -> tvm.transform.Pass:
    """``apply_partition`` as a module pass, to stand where FuseOps stands in a pipeline."""

    @tvm.transform.module_pass(opt_level=0, name="ApplyPartition")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return apply_partition(mod, groups, func_name)

    return _pass


def fuseops_groups(mod: tvm.IRModule, func_name: str = "main") -> list[list[str]]:
    """The partition TVM's FuseOps picks for ``mod[func_name]``, as lists of binding names.

    FuseOps' grouping depends only on op patterns and graph shape, not on PrimFunc names, so
    each ``call_tir`` is pointed at its own copy of its PrimFunc named after its binding; the
    names inside FuseOps' grouped functions then say which bindings each group holds.
    """
    func = mod[func_name]
    by_name = binding_name_map(func)
    names = binding_names(func)
    tagged = tvm.IRModule({gv: f for gv, f in mod.functions.items()})
    tag_of: dict[str, str] = {}
    blocks = []
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        new_bindings = []
        for b in block.bindings:
            v = b.value
            if isinstance(b, relax.VarBinding) and isinstance(v, relax.Call) and v.op.same_as(
                _CALL_TIR
            ):
                tag = f"cf__{len(tag_of)}"
                tag_of[tag] = names[b.var]
                gv = tvm.ir.GlobalVar(tag)
                relax.expr._update_type(gv, v.args[0].ty)  # pylint: disable=protected-access
                tagged[gv] = mod[v.args[0]]
                args = list(v.args)
                args[0] = gv
                b = relax.VarBinding(b.var, relax.Call(v.op, args, v.attrs, v.ty_args, ret_ty=v.ty))
            new_bindings.append(b)
        blocks.append(relax.DataflowBlock(new_bindings))
    body = relax.SeqExpr(blocks, func.body.body)
    tagged.update_func(
        tagged.get_global_var(func_name),
        relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs),
    )
    fused = relax.transform.FuseOps()(tagged)

    # A TupleGetItem whose tuple comes from outside its group is dropped from the grouped
    # function (the tuple parameter is split into its fields), so it shows only as a fresh
    # `tuple[i]` binding feeding the group's call in the fused caller.
    orig_vars = {b.var for b in by_name.values()}
    fused_main = fused[func_name]
    main_value = {
        b.var: b.value for blk in fused_main.body.blocks for b in blk.bindings
    }
    calls = {}
    for value in main_value.values():
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
            calls[value.op.name_hint] = value

    def original_item(tup, index, taken):
        return next(
            n for n, ob in by_name.items()
            if isinstance(ob.value, relax.TupleGetItem) and ob.value.tuple_value.same_as(tup)
            and ob.value.index == index and n not in taken
        )

    groups = []
    for gv, f in fused.functions.items():
        if not isinstance(f, relax.Function) or "Primitive" not in (f.attrs or {}):
            continue
        origin: dict = {}  # var inside the grouped function -> original binding name
        group: list[str] = []
        for arg in calls[gv.name_hint].args:
            item = main_value.get(arg) if arg not in orig_vars else None
            if isinstance(item, relax.TupleGetItem) and item.tuple_value in orig_vars:
                group.append(original_item(item.tuple_value, item.index, group))
        for block in f.body.blocks:
            for b in block.bindings:
                v = b.value
                if isinstance(v, relax.Call):
                    origin[b.var] = tag_of[v.args[0].name_hint]
                elif isinstance(v, relax.TupleGetItem) and v.tuple_value in origin:
                    producer = by_name[origin[v.tuple_value]].var
                    origin[b.var] = original_item(producer, v.index, group)
                else:
                    raise NotImplementedError(
                        f"cannot attribute binding {b.var.name!r} of FuseOps group {gv.name_hint}"
                    )
                group.append(origin[b.var])
        groups.append(group)
    return groups
