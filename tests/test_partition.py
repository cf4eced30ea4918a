"""apply_partition: FuseOps' own partition round-trips exactly, other partitions build and run
right, and bad partitions fail with a message that names the problem."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from conftest import prepared, reference
from tvm import relax, te, topi

from tvm_costfuse import PartitionError, apply_partition, fuseops_groups, models
from tvm_costfuse.graph import build_graph
from tvm_costfuse.measurement.timing import assert_close, build, run
from tvm_costfuse.pipelines import prepare


def _grouped_functions(mod: tvm.IRModule) -> dict[str, relax.Function]:
    return {
        gv.name_hint: f
        for gv, f in mod.functions.items()
        if isinstance(f, relax.Function) and "Primitive" in (f.attrs or {})
    }


@pytest.mark.parametrize("small", [True, False], ids=["small", "full"])
@pytest.mark.parametrize("name", models.zoo.names())
def test_fuseops_partition_round_trips(name: str, small: bool) -> None:
    mod, _ = prepared(name, small)
    groups = fuseops_groups(mod)
    assert groups, "FuseOps fuses something in every zoo model"
    tvm.ir.assert_structural_equal(apply_partition(mod, groups), relax.transform.FuseOps()(mod))


def test_everything_in_one_group_matches_unfused() -> None:
    mod, inputs = prepared("mlp_gelu")
    graph = build_graph(mod)
    fused = apply_partition(mod, [graph.fusable_names()])
    assert len(_grouped_functions(fused)) == 1
    assert_close(run(build(fused), inputs), reference("mlp_gelu"))


def test_constants_are_lifted_to_parameters() -> None:
    mod, _ = prepared("mlp_gelu")
    fused = apply_partition(mod, [build_graph(mod).fusable_names()])
    (func,) = _grouped_functions(fused).values()
    seen = []
    relax.analysis.post_order_visit(
        func.body, lambda e: seen.append(e) if isinstance(e, tvm.ir.expr.GenericConst) else None
    )
    assert seen == []
    assert any(p.name.startswith("param_") for p in func.params)


def test_group_with_two_outputs_returns_a_flat_tuple() -> None:
    # bert_layer: the residual input of the second LayerNorm is read by two groups.
    mod, inputs = prepared("bert_layer")
    graph = build_graph(mod)
    multi = next(n for n in graph.nodes if len(graph.consumers.get(n.name, ())) > 1)
    consumer = graph.consumers[multi.name][0]
    fused = apply_partition(mod, [[multi.name, consumer]])
    (func,) = _grouped_functions(fused).values()
    assert isinstance(func.ret_ty, relax.TupleType) and len(func.ret_ty.fields) == 2
    assert_close(run(build(fused), inputs), reference("bert_layer"))


def test_tuple_result_is_flattened_and_deduplicated() -> None:
    # gpt2_block: `split` returns a 3-tuple. Grouping it with split[0] but leaving split[1]
    # and split[2] outside makes the tuple itself a group output; it must come back as
    # three flat tensors, the first shared with split[0], never as a nested tuple.
    mod, inputs = prepared("gpt2_block")
    graph = build_graph(mod)
    producer = graph.producers("split")[0]
    fused = apply_partition(mod, [[producer, "split", "split_0"], ["split_1"], ["split_2"]])
    (func,) = _grouped_functions(fused).values()
    fields = func.ret_ty.fields
    assert len(fields) == 3 and all(isinstance(f, relax.TensorType) for f in fields)
    assert_close(run(build(fused), inputs), reference("gpt2_block"))


def test_tuple_get_item_rides_with_its_producer() -> None:
    mod, inputs = prepared("gpt2_block")
    graph = build_graph(mod)
    producer = graph.producers("split")[0]
    fused = apply_partition(mod, [[producer, "split"]])
    (func,) = _grouped_functions(fused).values()
    # The three items were pulled into the group: it returns them, not the tuple.
    assert len(func.ret_ty.fields) == 3
    assert_close(run(build(fused), inputs), reference("gpt2_block"))


def _symbolic_module() -> tvm.IRModule:
    """x: (n,) broadcast to (m, n) with m known only from a shape argument, then relu(+1).

    The broadcast's output extent m is not derivable from its tensor inputs, so a group
    holding it must receive m through a `tir_vars` parameter."""
    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")
    x = relax.Var("x", relax.TensorType([n], "float32"))
    s = relax.Var("s", relax.ShapeType([m]))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, s]):
        with bb.dataflow():
            b = bb.emit_te(lambda a: te.compute((m, n), lambda i, j: a[j] * 2.0, "bcast"), x)
            r = bb.emit_te(topi.nn.relu, bb.emit_te(topi.add, b, relax.const(1.0, "float32")))
            out = bb.emit_output(r)
        bb.emit_func_output(out)
    return prepare(bb.get())


def test_free_symbolic_vars_pass_through_tir_vars() -> None:
    mod = _symbolic_module()
    groups = fuseops_groups(mod)
    fused = apply_partition(mod, groups)
    tvm.ir.assert_structural_equal(fused, relax.transform.FuseOps()(mod))
    (func,) = _grouped_functions(fused).values()
    assert func.params[-1].name == "tir_vars"
    relax.analysis.well_formed(fused)  # raises when not well formed
    ex = build(fused)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for n, m in [(3, 2), (7, 5)]:
        x = np.linspace(-1, 1, n).astype("float32")
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.ShapeTuple([m])).numpy()
        np.testing.assert_allclose(got, np.maximum(np.tile(x * 2 + 1, (m, 1)), 0), rtol=1e-6)


def test_dead_group_is_dropped() -> None:
    x = relax.Var("x", relax.TensorType([4, 4], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            dead = bb.emit_te(topi.exp, x)
            bb.emit_te(topi.negative, dead)
            out = bb.emit_output(bb.emit_te(topi.nn.relu, x))
        bb.emit_func_output(out)
    mod = relax.transform.AnnotateTIROpPattern()(bb.get())  # emit_te already made call_tirs
    names = [n.name for n in build_graph(mod).nodes]
    fused = apply_partition(mod, [names[:2]])
    assert _grouped_functions(fused) == {}
    assert len(fused["main"].body.blocks[0].bindings) == 2  # relu and the output alias
    x_np = np.arange(-8, 8, dtype="float32").reshape(4, 4)
    assert_close(run(build(fused), {"x": x_np}), [np.maximum(x_np, 0)])


# -- bad partitions --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp() -> tvm.IRModule:
    return prepared("mlp_gelu")[0]


def _assert_unchanged_after(mod: tvm.IRModule, groups, match: str) -> None:
    before = tvm_ffi.structural_hash(mod)
    with pytest.raises(PartitionError, match=match):
        apply_partition(mod, groups)
    assert tvm_ffi.structural_hash(mod) == before


def test_unknown_name(mlp) -> None:
    _assert_unchanged_after(mlp, [["matmul", "nope"]], r"group 0 .* unknown binding 'nope'")


def test_duplicate_name_across_groups(mlp) -> None:
    _assert_unchanged_after(
        mlp, [["matmul", "add"], ["add", "gelu"]], r"'add' appears more than once.*group 0"
    )


def test_duplicate_name_in_one_group(mlp) -> None:
    _assert_unchanged_after(mlp, [["add", "gelu", "add"]], r"'add' appears more than once")


def test_non_call_tir_binding(mlp) -> None:
    _assert_unchanged_after(mlp, [["add2", "gv"]] if "add2" in build_graph(mlp) else
                            [[build_graph(mlp).producers("gv")[0], "gv"]],
                            r"cannot contain binding 'gv': it is .*not a call_tir")


def test_opaque_op(mlp) -> None:
    gelu = mlp["main"].body.blocks[0].bindings[2].value.args[0]
    opaque = mlp.__class__(dict(mlp.functions.items()))
    opaque.update_func(gelu, mlp[gelu].with_attr("op_pattern", 8))
    _assert_unchanged_after(opaque, [["add", "gelu"]], r"cannot contain binding 'gelu'.*opaque")


def test_non_convex_group(mlp) -> None:
    # matmul -> add -> gelu: grouping matmul with gelu leaves add on a path between them.
    _assert_unchanged_after(mlp, [["matmul", "gelu"]], r"group 0 .* not convex.*'add'")


def test_cycle_between_groups(mlp) -> None:
    # Each group is convex alone, but each needs the other first.
    _assert_unchanged_after(
        mlp, [["matmul", "gelu"], ["add", "matmul1"]], r"groups 0, 1 form a cycle"
    )


@pytest.mark.parametrize(
    "groups, match",
    [([[]], "group 0 is empty"), ("matmul", "list of lists"), ([["matmul", 3]], "holds 3")],
)
def test_malformed_groups(mlp, groups, match) -> None:
    _assert_unchanged_after(mlp, groups, match)


def test_repeated_binding_names_partition_by_node_name() -> None:
    from test_graph import _duplicate_names_module

    mod = _duplicate_names_module()
    groups = fuseops_groups(mod)
    assert groups == [["t", "t#2", "t#3", "t#4"]]
    tvm.ir.assert_structural_equal(apply_partition(mod, groups), relax.transform.FuseOps()(mod))
    x = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    want = run(build(mod), {"x": x})
    for plan in (groups, [["t#2", "t#3"]], [["t", "t#2"], ["t#3", "t#4"]]):
        fused = apply_partition(mod, plan)
        assert len(_grouped_functions(fused)) == len(plan)
        assert_close(run(build(fused), {"x": x}), want)


def test_imported_model_with_repeated_names_builds_with_costfuse() -> None:
    import torch
    from torch_models import TwoIndexGather

    from tvm_costfuse.transform import CostFuse

    x = torch.randn(4, 4)
    mod, inputs = models.load_torch(TwoIndexGather(), (x,))
    with torch.no_grad():
        want = [TwoIndexGather()(x).numpy()]
    prep = prepare(mod)
    fused = CostFuse(target="host")(prep)
    assert _grouped_functions(fused)
    assert_close(run(build(fused), inputs), want)
    assert_close(run(build(apply_partition(prep, fuseops_groups(prep))), inputs), want)


def test_unlegalized_module_names_the_op_and_the_fix() -> None:
    mod, _ = models.load("mlp_gelu", small=True)  # before prepare: relax.matmul, not call_tir
    with pytest.raises(PartitionError) as err:
        apply_partition(mod, [["matmul", "add"]])
    message = str(err.value)
    assert "a call to relax.matmul, not a call_tir" in message
    assert "not legalized" in message and "prepare" in message
    assert "ir.Op(" not in message and "description" not in message


def test_symbolic_var_passed_as_a_scalar_stays_inline() -> None:
    # nn.Linear on a (batch, 5, 16) input with a dynamic batch: after the reshape the matmul's
    # shapes are (s * 5, ...), so its legalized call_tir takes s itself as an argument. FuseOps
    # keeps that scalar inline and passes s through tir_vars; as a parameter of its own, s
    # was left undefined ("TIR variables (s77,) were undefined").
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU())
    batch = torch.export.Dim("batch", min=1, max=64)
    mod, _ = models.load_torch(net, (torch.randn(2, 5, 16),), {"input": {0: batch}})
    mod = prepare(mod)
    fused = apply_partition(mod, fuseops_groups(mod))
    tvm.ir.assert_structural_equal(fused, relax.transform.FuseOps()(mod))
    (func,) = _grouped_functions(fused).values()
    assert func.params[-1].name == "tir_vars"
    assert not any(isinstance(p.ty, tvm.ir.PrimType) for p in func.params)
    vm = relax.VirtualMachine(build(fused), tvm.cpu())
    for n in (1, 7):
        x = torch.randn(n, 5, 16)
        with torch.no_grad():
            want = net(x).numpy()
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x.numpy())).numpy(), want,
                                   rtol=1e-5, atol=1e-6)
