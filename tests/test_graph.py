"""OpGraph: one node per binding, with patterns, costs and fusability read off the IR."""

from __future__ import annotations

import math

import pytest
import tvm
from conftest import prepared
from tvm import relax

from tvm_costfuse.graph import OpPattern, build_graph


def test_mlp_nodes_patterns_and_edges() -> None:
    graph = build_graph(prepared("mlp_gelu")[0])
    kinds = {n.name: (n.kind, n.pattern) for n in graph.nodes}
    assert kinds["matmul"] == ("call_tir", OpPattern.OUT_EWISE_FUSABLE)
    assert kinds["gelu"] == ("call_tir", OpPattern.ELEMWISE)
    assert kinds["gv"][0] == "other"
    assert graph.producers("add") == ("matmul",)
    assert "add" in graph.consumers["matmul"]
    assert graph["matmul"].inputs[0] == "%x"
    assert any(i.startswith("%const") for i in graph["matmul"].inputs)
    assert graph.block_outputs == {"gv"}
    assert graph.fusable_names() == [n.name for n in graph.nodes if n.name != "gv"]
    assert "not a call_tir" in graph["gv"].why_not_fusable


def test_matmul_flops_bytes_and_reduction_extent() -> None:
    graph = build_graph(prepared("mlp_gelu")[0])
    mm = graph["matmul"]
    (out,) = mm.outputs
    assert out.shape == (1, 8, 128) and out.dtype == "float32"
    k = 32  # small mlp_gelu: hidden 32 -> ffn 128
    assert mm.flops == 2 * math.prod(out.shape) * k
    assert mm.reduction_extent == k
    assert mm.bytes_written == math.prod(out.shape) * 4
    assert mm.bytes_read == (8 * 32 + 32 * 128) * 4


def test_softmax_is_a_reduction_over_the_last_axis() -> None:
    graph = build_graph(prepared("attention")[0])
    sm = graph["softmax"]
    assert sm.reduction_extent == sm.outputs[0].shape[-1]
    assert graph["divide"].reduction_extent == 1


def test_tuple_get_item_nodes_follow_their_producer() -> None:
    graph = build_graph(prepared("gpt2_block")[0])
    items = [n for n in graph.nodes if n.kind == "tuple_get_item"]
    assert len(items) == 3
    assert {graph.producers(n.name) for n in items} == {("split",)}
    assert len(graph["split"].outputs) == 3


def test_unknown_function_is_rejected() -> None:
    with pytest.raises(ValueError, match="no function named 'forward'"):
        build_graph(prepared("mlp_gelu")[0], "forward")


def test_math_library_calls_are_counted_where_flops_see_none() -> None:
    """TVM's FLOP estimate gives exp, log, tanh, cos... no work at all; the graph counts them in
    exp-equivalents (schedules.math_calls.MATH_COST), per element of the loop that calls them."""
    from tvm_costfuse.schedules.math_calls import MATH_COST

    graph = build_graph(prepared("elementwise_chain")[0])
    elems = math.prod(graph["cos"].outputs[0].shape)
    assert graph["cos"].flops == 0 and graph["cos"].math == MATH_COST["cos"] * elems
    assert graph["exp"].math == elems and graph["log"].math == MATH_COST["log"] * elems
    assert graph["add"].math == 0 and graph["sqrt"].math == 0 and graph["abs"].math == 0
    gelu = build_graph(prepared("mlp_gelu")[0])["gelu"]
    assert gelu.math == MATH_COST["erf"] * math.prod(gelu.outputs[0].shape)


def _duplicate_names_module():
    """Relax function binding ``t`` three times and ``t#2`` once: well-formed (variables are
    distinct objects), though BlockBuilder would never pick such names itself."""
    import tvm
    from tvm import relax

    from tvm_costfuse.pipelines import prepare

    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    bb = relax.BlockBuilder()
    bindings, prev = [], {}
    ops = [("t", relax.op.tanh, ["x"]), ("t#2", relax.op.exp, ["t"]),
           ("t", relax.op.add, ["t", "t#2"]), ("t", relax.op.multiply, ["t", "t#2"])]
    for i, (name, fn, args) in enumerate(ops):
        value = bb.normalize(fn(*[prev.get(a, x) for a in args]))
        last = i == len(ops) - 1
        var = (relax.Var if last else relax.DataflowVar)(name, value.ty)
        bindings.append(relax.VarBinding(var, value))
        prev[name] = var
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], prev["t"])
    func = relax.Function([x], body, prev["t"].ty).with_attr("global_symbol", "main")
    mod = prepare(tvm.IRModule({"main": func}))
    relax.analysis.well_formed(mod)
    return mod


def test_repeated_binding_names_become_unique_node_names() -> None:
    from tvm_costfuse.graph import binding_name_map, binding_names

    mod = _duplicate_names_module()
    graph = build_graph(mod)
    # The first binding keeps its name; later ones count on, skipping the taken "t#2".
    assert [n.name for n in graph.nodes] == ["t", "t#2", "t#3", "t#4"]
    assert graph.producers("t#3") == ("t", "t#2") and graph.block_outputs == {"t#4"}
    names = binding_names(mod["main"])
    assert list(names.values()) == [n.name for n in graph.nodes]
    assert [b.var for b in binding_name_map(mod["main"]).values()] == list(names)
    assert build_graph(mod) == graph  # deterministic


def test_legalized_index_items_reuse_importer_names() -> None:
    # x[i, j] from PyTorch: LegalizeOps binds the index tuple's items as lv, lv1, ... which the
    # importer had used already (HF GPT-NeoX, Falcon masks).
    import torch
    from torch_models import TwoIndexGather

    from tvm_costfuse import load_torch
    from tvm_costfuse.pipelines import prepare

    mod = prepare(load_torch(TwoIndexGather(), (torch.randn(4, 4),))[0])
    names = [b.var.name for blk in mod["main"].body.blocks for b in blk.bindings]
    assert len(set(names)) < len(names)
    graph = build_graph(mod)
    assert len({n.name for n in graph.nodes}) == len(graph.nodes) == len(names)


def test_prim_func_whose_root_block_is_not_named_root() -> None:
    # Legalized cumsum is hand-written TIR whose body block is "cumsum_generic".
    from tvm import relax

    from tvm_costfuse.pipelines import prepare

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "int64"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pos = bb.emit(relax.op.cumsum(x, axis=1))
            out = bb.emit_output(relax.op.add(pos, x))
        bb.emit_func_output(out)
    mod = prepare(bb.get())
    scan = next(f for gv, f in mod.functions.items() if gv.name_hint == "cumsum")
    assert scan.body.block.name_hint != "root"
    graph = build_graph(mod)
    node = next(n for n in graph.nodes if n.prim_func == "cumsum")
    assert node.pattern == OpPattern.OPAQUE and not node.fusable
    assert node.reduction_extent == 1 and node.math == 0


def _pooling_graph():
    from tvm import relax

    from tvm_costfuse.pipelines import prepare

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 14, 14), "float32"))
    w = relax.Var("w", relax.TensorType((8, 8, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            avg = bb.emit(relax.op.nn.avg_pool2d(x, (2, 2), (2, 2)))  # tiles: no overlap
            mx = bb.emit(relax.op.nn.max_pool2d(x, (3, 3), (1, 1), (1, 1)))  # same size
            conv = bb.emit(relax.op.nn.conv2d(mx, w, padding=(1, 1)))
            mean = bb.emit(relax.op.nn.adaptive_avg_pool2d(conv, (1, 1)))
            out = bb.emit_output(relax.op.add(mean, relax.op.mean(avg, axis=[2, 3],
                                                                   keepdims=True)))
        bb.emit_func_output(out)
    return build_graph(prepare(bb.get()))


def test_pooling_windows_are_read_off_the_prim_func() -> None:
    """Average and max pools, overlapping or not, are pooling windows: reductions, never
    contractions (an average pool's window sum and padding checks count as much FLOPs as a
    multiply-add). A convolution reads a window too but multiplies two loaded values; a
    global (adaptive) average pool and a mean reduce whole axes."""
    from tvm_costfuse.cost.features import _is_window, op_class

    graph = _pooling_graph()
    by_kind = {}
    for n in graph.nodes:
        if n.kind == "call_tir":
            by_kind.setdefault(n.prim_func.rstrip("0123456789"), []).append(n)
    (avg,), (mx,), (conv,) = by_kind["avg_pool2d"], by_kind["max_pool2d"], by_kind["conv2d"]
    assert avg.pool and mx.pool and not conv.pool
    assert by_kind["adaptive_avg_pool2d"] and by_kind["mean"]
    assert not any(n.pool for n in by_kind["adaptive_avg_pool2d"] + by_kind["mean"])
    assert op_class(avg) == op_class(mx) == "reduction"
    assert op_class(conv) == "contraction" and conv.geometry is not None
    assert _is_window(avg) and _is_window(mx)  # the 2x2 tiles and the same-size 3x3 too
    # the last block reduces in a max pool and a conv; an average pool and a mean divide last
    assert mx.ends_in_reduction and conv.ends_in_reduction
    assert not avg.ends_in_reduction
    assert not any(n.ends_in_reduction for n in by_kind["mean"] + by_kind["adaptive_avg_pool2d"])


def test_a_slice_at_offset_zero_is_a_kernel_not_a_view():
    """``x[:, :32]`` of a one-row ``x`` keeps its elements' order (TIR's reshape pattern), but
    TVM turns only size-preserving reshapes into views (RewriteDataflowReshape): the slice runs
    as a copy kernel, and the graph must price it as one."""

    from tvm_costfuse.pipelines import prepare

    x = relax.Var("x", relax.TensorType((1, 96), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(x, x))
            head = bb.emit(relax.op.strided_slice(y, axes=[1], begin=[0], end=[32]))
            flat = bb.emit(relax.op.reshape(y, (96,)))
            out = bb.emit_output(relax.Tuple([head, flat]))
        bb.emit_func_output(out)
    graph = build_graph(prepare(bb.get(), tvm.target.Target("llvm")))
    calls = {n.prim_func: n for n in graph.nodes if n.kind == "call_tir"}
    sliced = next(n for name, n in calls.items() if "strided_slice" in name)
    reshaped = next(n for name, n in calls.items() if "reshape" in name)
    assert sliced.reshape_like and not sliced.view
    assert reshaped.view
