"""The CostFuse pass in TVM's pipelines: numerics on llvm, offline CUDA builds, config keys."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import prepared, reference
from test_partition import _symbolic_module
from tvm import relax

import tvm_costfuse
from tvm_costfuse import CostFuse, models
from tvm_costfuse.cost import group_features
from tvm_costfuse.graph import build_graph
from tvm_costfuse.measurement.cuda_source import kernel_sources
from tvm_costfuse.measurement.timing import assert_close, run
from tvm_costfuse.targets import cuda_target


@pytest.mark.parametrize("name", models.zoo.names())
def test_costfuse_pipeline_matches_unfused_on_llvm(name: str) -> None:
    mod, inputs = models.load(name, small=True)
    ex = tvm.compile(mod, target="llvm", relax_pipeline=tvm_costfuse.pipeline("llvm"))
    assert_close(run(ex, inputs), reference(name), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", models.zoo.names())
def test_costfuse_pipeline_compiles_for_cuda_offline(name: str) -> None:
    mod, _ = models.load(name, small=True)
    target = cuda_target("sm_90")
    with target:
        ex = tvm.compile(mod, target=target, relax_pipeline=tvm_costfuse.pipeline(target))
    sources = kernel_sources(ex)
    assert sources and all("__global__" in s for s in sources.values())


@pytest.mark.parametrize("name", models.zoo.names())
def test_exact_search_compiles_every_zoo_model(name: str) -> None:
    # Graphs beyond the exact search's size are searched exactly per region, greedily elsewhere.
    mod, inputs = models.load(name, small=True)
    with tvm.transform.PassContext(opt_level=3, config={"costfuse.search": "exact"}):
        ex = tvm.compile(mod, target="llvm", relax_pipeline=tvm_costfuse.pipeline("llvm"))
    assert_close(run(ex, inputs), reference(name), rtol=1e-4, atol=1e-4)


def test_target_preset_is_a_pass_argument_and_must_match_the_target_kind() -> None:
    mod = prepared("rmsnorm")[0]
    with tvm.target.Target("llvm"):
        fuse = CostFuse(target_preset="host")
        fuse(mod)
        assert fuse.plans["main"].groups
        with pytest.raises(ValueError, match="'h100' describes a cuda target.*compiles for llvm"):
            CostFuse(target_preset="h100")(mod)
        with (tvm.transform.PassContext(config={"costfuse.target_preset": "h100"}),
              pytest.raises(ValueError, match="costfuse.target_preset 'h100'")):
            CostFuse()(mod)


def _plan(mod, **kwargs):
    fuse = CostFuse(target="h100", **kwargs)
    fuse(mod)
    return fuse.plans["main"]


def test_pass_context_keys_change_the_plan() -> None:
    mod = prepared("elementwise_chain", small=False)[0]
    graph = build_graph(mod)

    def longest(plan) -> int:
        return max(group_features(graph, g).chain_length for g in plan.estimates)

    assert longest(_plan(mod)) > 4
    with tvm.transform.PassContext(config={"costfuse.max_chain_length": 4}):
        assert longest(_plan(mod)) <= 4
        assert longest(_plan(mod, max_chain_length=8)) == 8  # the argument wins
    with tvm.transform.PassContext(config={"costfuse.max_body_ops": 2}):
        assert max(len(g) for g in _plan(mod).estimates) <= 2


def test_bad_config_values_are_clear_errors() -> None:
    with pytest.raises(Exception, match="costfuse.max_chain_length"):
        tvm.transform.PassContext(config={"costfuse.max_chain_length": "eight"})
    mod = prepared("rmsnorm")[0]
    with (tvm.transform.PassContext(config={"costfuse.max_body_ops": 0}),
          pytest.raises(ValueError, match="costfuse.max_body_ops")):
        _plan(mod)


def test_named_pipeline() -> None:
    mod, inputs = models.load("rmsnorm", small=True)
    ex = tvm.compile(mod, target="llvm", relax_pipeline="costfuse")
    assert_close(run(ex, inputs), reference("rmsnorm"))


def test_symbolic_region_is_left_to_fuseops_and_reported() -> None:
    mod = _symbolic_module()
    fuse = CostFuse(target="host")
    fused = fuse(mod)
    plan = fuse.plans["main"]
    assert plan.left_to_fuseops and "left to FuseOps" in plan.notes[0]
    tvm.ir.assert_structural_equal(fused, relax.transform.FuseOps()(mod))
    ex = tvm.compile(fused, target="llvm", relax_pipeline=tvm_costfuse.pipelines.build_pipeline(
        "llvm", None))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.linspace(-1, 1, 5).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.ShapeTuple([3])).numpy()
    np.testing.assert_allclose(got, np.maximum(np.tile(x * 2 + 1, (3, 1)), 0), rtol=1e-6)


def test_static_and_symbolic_functions_each_get_their_own_groups() -> None:
    # prefill (static) and decode (symbolic length) exported from one nn.Module: FuseOps over
    # the whole module used to hand decode's groups to prefill's plan (KeyError on the name).
    from tvm.relax.frontend import nn

    from tvm_costfuse.partition import fuseops_groups
    from tvm_costfuse.pipelines import prepare
    from tvm_costfuse.strategies import strategy_pipeline
    from tvm_costfuse.targets import host_target

    class MLP(nn.Module):
        def __init__(self) -> None:
            self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

        def prefill(self, x):
            return self.down(nn.op.silu(self.up(x)))

        def decode(self, x):
            return self.down(nn.op.silu(self.up(x)))

    mod, params = MLP().export_tvm(spec={
        "prefill": {"x": nn.spec.Tensor((1, 8, 16), "float32")},
        "decode": {"x": nn.spec.Tensor((1, "n", 16), "float32")},
    })
    prep = prepare(mod)
    for name in ("prefill", "decode"):
        names = {n.name for n in build_graph(prep, name).nodes}
        assert {n for g in fuseops_groups(prep, name) for n in g} <= names
    fuse = CostFuse(target="host")
    fuse(prep)
    assert fuse.plans["prefill"].groups and not fuse.plans["prefill"].left_to_fuseops
    assert fuse.plans["decode"].left_to_fuseops

    rng = np.random.default_rng(0)
    weights = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") * 0.1
               for _, p in params]
    target = host_target()
    vms = []
    for strategy in ("stock", "costfuse"):
        with target:
            ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(strategy, target))
        vms.append(relax.VirtualMachine(ex, tvm.cpu()))
    for name, length in (("prefill", 8), ("decode", 3)):
        args = [rng.standard_normal((1, length, 16)).astype("float32"), *weights]
        want, got = (vm[name](*[tvm.runtime.tensor(a) for a in args]).numpy() for vm in vms)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_dynamic_batch_linear_from_pytorch_builds_with_costfuse() -> None:
    import torch

    from tvm_costfuse.strategies import strategy_pipeline
    from tvm_costfuse.targets import host_target

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU())
    batch = torch.export.Dim("batch", min=1, max=64)
    mod, _ = models.load_torch(net, (torch.randn(2, 5, 16),), {"input": {0: batch}})
    target = host_target()
    with target:
        ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline("costfuse", target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for n in (3, 9):
        x = torch.randn(n, 5, 16)
        with torch.no_grad():
            want = net(x).numpy()
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x.numpy())).numpy(), want,
                                   rtol=1e-4, atol=1e-5)


def test_lstm_from_pytorch_compiles_for_cuda_offline() -> None:
    # CostFuse groups the input projection with its five per-step slices; dlight's Matmul
    # rule schedules that group into IR lowering rejects, so the guarded rules pass it on.
    import torch

    from tvm_costfuse.strategies import strategy_pipeline

    class LSTM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0]

    torch.manual_seed(0)
    mod, _ = models.load_torch(LSTM(), (torch.randn(2, 5, 8),))
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    with target:
        ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline("costfuse", target))
    assert any(k.startswith("fused_matmul_add_strided_slice") for k in kernel_sources(ex))
