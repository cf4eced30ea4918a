"""OpGraph: a read-only view of a Relax function's dataflow bindings, one node per binding.

Every later stage (legality, cost, planner) reasons about this plain-data graph instead of the
IR, so they can be tested without building anything and can never half-rewrite a module. The
graph is taken after ``LegalizeOps`` + ``AnnotateTIROpPattern`` (see ``pipeline.prepare``): then
each operator is a ``call_tir`` to a PrimFunc that carries its ``op_pattern``.

Nodes are the bindings of the function's dataflow blocks, in program order. ``call_tir``
bindings carry their PrimFunc's pattern, shapes, FLOPs and bytes; ``TupleGetItem`` bindings are
nodes too (FuseOps may group them), and ride with their producer unless a partition places them
explicitly. Every other binding (``call_packed``, a plain alias, ``match_cast``...) is a node that
can never sit in a fused group; ``Node.why_not_fusable`` says why.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from enum import IntEnum

import tvm
from tvm import relax

from .kernel_facts import has_reshape_pattern, kernel_facts
from .schedules.efficiency import Geometry

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


class OpPattern(IntEnum):
    """TVM's operator pattern kinds (``AnnotateTIROpPattern``; C++ ``OpPatternKind``)."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_EWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype of one tensor; ``shape`` entries are ints, or str for symbolic dims."""

    shape: tuple[int | str, ...]
    dtype: str

    @functools.cached_property
    def nbytes(self) -> int | None:
        """Size in bytes, or None when a dimension is symbolic."""
        if any(isinstance(d, str) for d in self.shape):
            return None
        return math.prod(self.shape) * ((tvm.DataType(self.dtype).bits + 7) // 8)


@dataclass(frozen=True)
class Node:
    """One binding of the dataflow block.

    ``inputs`` names the nodes this binding reads, in argument order without repeats; function
    parameters appear as ``"%param_name"`` and constant tensors as ``"%constK"`` so that they
    are never mistaken for nodes. ``input_bytes`` gives each input's size, aligned with it.
    """

    name: str
    index: int
    kind: str  # "call_tir", "tuple_get_item" or "other"
    prim_func: str | None
    pattern: OpPattern
    inputs: tuple[str, ...]
    outputs: tuple[TensorInfo, ...]
    input_bytes: tuple[int, ...]
    flops: float
    bytes_read: int
    bytes_written: int
    reduction_extent: int
    why_not_fusable: str | None = None
    block: int = 0
    # A reshape-like PrimFunc (reshape, expand_dims, flatten: elements keep their order), and
    # whether it is bound to a dataflow variable: left alone, such a binding becomes a VM view
    # (TVM's RewriteDataflowReshape; no kernel, no copy).
    view: bool = False
    reshape_like: bool = False
    math: float = 0.0  # exp, log, tanh, erf... per invocation, in exp-equivalents (``schedules.math_calls.MATH_COST``)
    # A contraction's block as the CPU rule sees it (``schedules.efficiency.describe``): what
    # the cost model reads the kernel's share of the FMA peak from. None for other ops.
    geometry: Geometry | None = None
    # A pooling window (``kernel_facts``): a reduction over a window that slides or tiles
    # along a spatial axis, with no product of two loaded values (max or average pooling).
    pool: bool = False
    # The last block reduces (a max pool, a sum): alone, no row reduction to the CPU rule.
    ends_in_reduction: bool = False
    # Some block reduces, whatever its extents: unit ones (a mean over a 1 x 1 map, a matmul
    # with K = 1) keep their init, and the rules take it as a reduction (``is_spatial``);
    # symbolic ones, which ``reduction_extent`` counts as 1, reduce all the same.
    reduces: bool = False
    # A permutation moving the innermost axis (``kernel_facts``): fused into another kernel,
    # its loads gather (``cost.extract._gathered``).
    moves_innermost: bool = False
    # Such a permutation that runs as register tiles alone (``kernel_facts``): priced at the
    # host's tiled-transpose cost there (``cost.extract._transposed``).
    tiles_alone: bool = False

    @property
    def fusable(self) -> bool:
        return self.why_not_fusable is None


@dataclass(frozen=True)
class OpGraph:
    """The bindings of one Relax function as a DAG (edges follow tensors, producer -> consumer)."""

    func_name: str
    nodes: tuple[Node, ...]
    consumers: dict[str, tuple[str, ...]] = field(repr=False)
    # Names whose value leaves the dataflow block (non-dataflow vars, read by the function body).
    block_outputs: frozenset[str] = frozenset()
    # Bytes of the distinct constant tensors the bindings read (the weights): whether they
    # stay in the last-level cache from one call of the model to the next.
    constant_bytes: int = 0

    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {n.name: n.index for n in self.nodes})

    def __getitem__(self, name: str) -> Node:
        return self.nodes[self._index[name]]

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self.nodes)

    def producers(self, name: str) -> tuple[str, ...]:
        """Nodes that ``name`` reads (parameters and constants left out)."""
        return tuple(i for i in self[name].inputs if not i.startswith("%"))

    def fusable_names(self) -> list[str]:
        return [n.name for n in self.nodes if n.fusable]

    def call_tir_names(self) -> list[str]:
        return [n.name for n in self.nodes if n.kind == "call_tir"]


def _tensor_infos(ty) -> tuple[TensorInfo, ...]:
    if isinstance(ty, relax.TupleType):
        return tuple(t for f in ty.fields for t in _tensor_infos(f))
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        dims = []
        for d in ty.shape.values:
            dims.append(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d))
        return (TensorInfo(tuple(dims), str(ty.dtype)),)
    return ()


def _nbytes(infos) -> int:
    return sum(i.nbytes or 0 for i in infos)


def _leaves(expr) -> list:
    """Relax leaves an argument expression reads, in order (tuples flattened)."""
    if isinstance(expr, relax.Tuple):
        return [leaf for f in expr.fields for leaf in _leaves(f)]
    return [expr]


def _same_size(args, outputs: tuple[TensorInfo, ...]) -> bool:
    """Does a reshape-like kernel keep its input's size and dtype? TVM's
    RewriteDataflowReshape makes a view only of those: a strided slice at offset 0 has the
    reshape pattern too (``out[i] = in[i]``), yet runs as a copy kernel. A symbolic size is
    taken as kept (TVM's analyzer proves a reshape's sizes equal; a slice's extent is not
    symbolic in the programs CostFuse plans: those are left to FuseOps)."""
    if len(outputs) != 1:
        return False
    for a in args:
        infos = _tensor_infos(a.ty) if isinstance(a, relax.Var) else ()
        if len(infos) != 1 or infos[0].dtype != outputs[0].dtype:
            continue
        if None in (infos[0].nbytes, outputs[0].nbytes) or infos[0].nbytes == outputs[0].nbytes:
            return True
    return False


def binding_names(func: relax.Function) -> dict[relax.Var, str]:
    """Bound variable -> its node name, over all dataflow blocks, unique within ``func``.

    Partitions, plans and databases refer to bindings by name, but Relax does not make names
    unique (``LegalizeOps`` of an imported model binds several ``lv``). The first binding of a
    name keeps it; the k-th later one is ``name#k`` (k counted per name from 2, skipping any
    name already taken), so names are deterministic and stable under reruns.
    """
    out: dict[relax.Var, str] = {}
    bound = [b.var for block in func.body.blocks if isinstance(block, relax.DataflowBlock)
             for b in block.bindings]
    taken = {v.name for v in bound}
    seen: dict[str, int] = {}
    for var in bound:
        name = var.name
        if name in seen:
            k = seen[name]
            while True:
                k += 1
                unique = f"{name}#{k}"
                if unique not in taken:
                    break
            seen[name] = k
            taken.add(unique)
            name = unique
        else:
            seen[name] = 1
        out[var] = name
    return out


def binding_name_map(func: relax.Function) -> dict[str, relax.VarBinding]:
    """Node name (see :func:`binding_names`) -> binding, over all dataflow blocks."""
    names = binding_names(func)
    return {names[b.var]: b for block in func.body.blocks
            if isinstance(block, relax.DataflowBlock) for b in block.bindings}


def _callee(op) -> str:
    """How a message names what a call calls: an operator's name (``relax.matmul``), a
    function's name; never the object's whole description."""
    if isinstance(op, tvm.ir.Op):
        return op.name
    return getattr(op, "name_hint", None) or type(op).__name__


def build_graph(mod: tvm.IRModule, func_name: str = "main") -> OpGraph:
    """Build the OpGraph of ``mod[func_name]`` (a legalized, pattern-annotated module)."""
    if func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError(f"module has no function named {func_name!r}")
    func = mod[func_name]
    if not isinstance(func, relax.Function):
        raise TypeError(f"{func_name!r} is not a Relax function")
    names = binding_names(func)

    param_names = {p: p.name for p in func.params}
    const_names: dict = {}  # each constant tensor is one input, however often it is read
    const_bytes: dict[str, int] = {}
    var_to_node: dict = {}
    nodes: list[Node] = []
    consumers: dict[str, list[str]] = {}
    block_outputs: set[str] = set()
    dataflow_blocks = [b for b in func.body.blocks if isinstance(b, relax.DataflowBlock)]
    for block_index, block in enumerate(dataflow_blocks):
        for binding in block.bindings:
            name = names[binding.var]
            value = binding.value
            if not isinstance(binding.var, relax.DataflowVar):
                block_outputs.add(name)
            args = []
            if isinstance(binding, relax.VarBinding) and isinstance(value, relax.Call):
                args = _leaves(value.args[1]) if value.op.same_as(_CALL_TIR) else _leaves(
                    relax.Tuple(list(value.args)) if value.args else relax.Tuple([])
                )
            elif isinstance(binding, relax.VarBinding) and isinstance(value, relax.TupleGetItem):
                args = [value.tuple_value]
            else:
                args = _leaves(value)
            inputs: list[str] = []
            sizes: list[int] = []
            for a in args:
                if isinstance(a, relax.Var):
                    src = var_to_node.get(a)
                    if src is None:  # a parameter, or a var from a non-dataflow block
                        src = f"%{param_names.get(a, a.name)}"
                elif isinstance(a, tvm.ir.expr.GenericConst):
                    src = const_names.setdefault(a, f"%const{len(const_names)}")
                    const_bytes.setdefault(src, _nbytes(_tensor_infos(a.ty)))
                else:
                    continue
                if src not in inputs:
                    inputs.append(src)
                    sizes.append(_nbytes(_tensor_infos(a.ty)))
            outputs = _tensor_infos(binding.var.ty)
            in_bytes = sum(sizes)
            if (
                isinstance(binding, relax.VarBinding)
                and isinstance(value, relax.Call)
                and value.op.same_as(_CALL_TIR)
            ):
                func = mod[value.args[0]]
                attrs = func.attrs or {}
                pattern = (OpPattern(int(attrs["op_pattern"])) if "op_pattern" in attrs
                           else OpPattern.OPAQUE)
                k = kernel_facts(func)
                why = (
                    f"its PrimFunc {value.args[0].name_hint!r} is opaque (op_pattern 8)"
                    if pattern == OpPattern.OPAQUE
                    else None
                )
                reshape_like = has_reshape_pattern(func)
                view = (reshape_like and isinstance(binding.var, relax.DataflowVar)
                        and _same_size(args, outputs))
                node = Node(name, len(nodes), "call_tir", value.args[0].name_hint, pattern,
                            tuple(inputs), outputs, tuple(sizes), k.flops, in_bytes,
                            _nbytes(outputs), k.reduction_extent, why, block_index, view,
                            reshape_like, k.math, k.geometry, k.pool, k.ends_in_reduction,
                            k.reduces, k.moves_innermost, k.tiles_alone)
            elif isinstance(binding, relax.VarBinding) and isinstance(value, relax.TupleGetItem):
                node = Node(name, len(nodes), "tuple_get_item", None, OpPattern.INJECTIVE,
                            tuple(inputs), outputs, tuple(sizes), 0.0, 0, 0, 1, None,
                            block_index)
            else:
                what, hint = type(value).__name__, ""
                if isinstance(value, relax.Var):
                    what = f"an alias of {value.name!r}"
                if isinstance(value, relax.Call):
                    what = f"a call to {_callee(value.op)}"
                    if isinstance(value.op, tvm.ir.Op) and value.op.name.startswith("relax."):
                        hint = " (the module is not legalized: run tvm_costfuse.prepare first)"
                if isinstance(binding, relax.MatchCast):
                    what = "a match_cast"
                node = Node(name, len(nodes), "other", None, OpPattern.OPAQUE, tuple(inputs),
                            outputs, tuple(sizes), 0.0, 0, 0, 1,
                            f"it is {what}, not a call_tir{hint}", block_index)
            nodes.append(node)
            var_to_node[binding.var] = name
            for src in inputs:
                if not src.startswith("%"):
                    consumers.setdefault(src, []).append(name)
    return OpGraph(
        func_name,
        tuple(nodes),
        {k: tuple(v) for k, v in consumers.items()},
        frozenset(block_outputs),
        sum(const_bytes.values()),
    )
