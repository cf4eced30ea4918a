"""apply_partition: turn any legal grouping of bindings into FuseOps-style grouped functions.

TVM's C++ helper that applies an arbitrary group map (``MakeGroupedFunctions``) is not exposed
to Python, and ``FuseOpsByPattern`` only takes tree-shaped groups. This module validates a
partition and hands it to :class:`~tvm_costfuse.fusor.Fusor`, FuseOps' rewrite re-implemented
in Python, so that ``FuseTIR`` then makes one PrimFunc per group; ``fuseops_groups`` reads
FuseOps' own partition back as binding names.

A partition is validated completely (names, fusability, convexity) before anything is rebuilt,
and TVM IR is immutable, so a bad partition raises ``PartitionError`` and never yields a
half-rewritten module.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import tvm
from tvm import relax

from .fusor import Fusor
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
    return partition_named(mod, groups, func_name)[0]


def partition_named(mod: tvm.IRModule, groups: Sequence[Sequence[str]],
                    func_name: str = "main") -> tuple[tvm.IRModule, dict[str, str]]:
    """:func:`apply_partition` and, per fused binding, the name of its group's function (the
    name of the PrimFunc FuseTIR makes of it; groups whose functions are equal share one)."""
    graph = build_graph(mod, func_name)
    fused = resolve_groups(graph, groups)
    fusor = Fusor(mod, fused, func_name)
    gvar = mod.get_global_var(func_name)
    new_func = fusor.visit_expr(mod[func_name])
    fusor.builder_.update_func(gvar, new_func)
    return fusor.builder_.get(), {name: fusor.functions[i].name_hint
                                  for i, group in enumerate(fused) if i in fusor.functions
                                  for name in group}  # a dead group makes no function


def apply_per_function(
    mod: tvm.IRModule, groups_of: Callable[[tvm.IRModule, str], Sequence[Sequence[str]]]
) -> tvm.IRModule:
    """Apply ``groups_of(mod, name)`` to every Relax function of ``mod`` a fusion pass
    rewrites: all but the grouped (``Primitive``) functions, in module order."""
    for gvar, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function) or "Primitive" in (func.attrs or {}):
            continue
        mod = apply_partition(mod, groups_of(mod, gvar.name_hint), gvar.name_hint)
    return mod


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
    names inside FuseOps' grouped functions then say which bindings each group holds. FuseOps
    runs on a module holding this one Relax function (plus the functions it calls), and only
    the groups it calls are read: another function's groups are not this one's.
    """
    func = mod[func_name]
    by_name = binding_name_map(func)
    names = binding_names(func)
    referenced: set = set()
    relax.analysis.post_order_visit(
        func, lambda e: referenced.add(e) if isinstance(e, tvm.ir.GlobalVar) else None
    )
    tagged = tvm.IRModule({gv: f for gv, f in mod.functions.items()
                           if not isinstance(f, relax.Function) or gv.name_hint == func_name
                           or gv in referenced})
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

    before = {gv.name_hint for gv in tagged.get_global_vars()}
    groups = []
    for gv, f in fused.functions.items():
        is_group = isinstance(f, relax.Function) and "Primitive" in (f.attrs or {})
        if not is_group or gv.name_hint not in calls or gv.name_hint in before:
            continue
        origin: dict = {}  # var inside the grouped function -> original binding name
        group: list[str] = []
        # a tuple parameter -> the original binding its argument stands for, so that an item
        # taken of it inside the group (``tt[0][0]``: the outer item stays in the caller,
        # the inner one joins the group) can be named
        tuple_source: dict = {}
        for param, arg in zip(f.params, calls[gv.name_hint].args):
            item = main_value.get(arg) if arg not in orig_vars else None
            if isinstance(item, relax.TupleGetItem) and item.tuple_value in orig_vars:
                group.append(original_item(item.tuple_value, item.index, group))
                tuple_source[param] = by_name[group[-1]].var
            elif arg in orig_vars:
                tuple_source[param] = arg
        for block in f.body.blocks:
            for b in block.bindings:
                v = b.value
                if isinstance(v, relax.Call):
                    origin[b.var] = tag_of[v.args[0].name_hint]
                elif isinstance(v, relax.TupleGetItem) and v.tuple_value in origin:
                    producer = by_name[origin[v.tuple_value]].var
                    origin[b.var] = original_item(producer, v.index, group)
                elif isinstance(v, relax.TupleGetItem) and v.tuple_value in tuple_source:
                    origin[b.var] = original_item(tuple_source[v.tuple_value], v.index, group)
                else:
                    raise NotImplementedError(
                        f"cannot attribute binding {b.var.name!r} of FuseOps group {gv.name_hint}"
                    )
                group.append(origin[b.var])
        groups.append(group)
    return groups
