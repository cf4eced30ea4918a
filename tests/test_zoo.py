"""Tests for tvm_costfuse.models.zoo on the small variants (fast: each builds for llvm in ~0.1-3 s)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_costfuse import models
from tvm_costfuse.measurement.timing import run

EXPECTED_NAMES = [
    "mlp_gelu",
    "attention",
    "conv_bn_relu",
    "resnet18",
    "mobilenetv2",
    "bert_layer",
    "gpt2_block",
    "layernorm_mlp",
    "rmsnorm",
    "elementwise_chain",
    "decode_attention",
]

# Output shapes of the small variants.
SMALL_OUT_SHAPES = {
    "mlp_gelu": (1, 8, 32),
    "attention": (1, 2, 8, 16),
    "conv_bn_relu": (1, 8, 16, 16),
    "resnet18": (1, 10),
    "mobilenetv2": (1, 10),
    "bert_layer": (1, 8, 32),
    "gpt2_block": (1, 8, 32),
    "layernorm_mlp": (1, 8, 32),
    "rmsnorm": (1, 8, 64),
    "elementwise_chain": (1, 64, 64),
    "decode_attention": (1, 4, 1, 16),
}

_TARGET = tvm.target.Target("llvm")
_RUNS: dict[str, np.ndarray] = {}


def _run(mod: tvm.IRModule, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Compile with the default cpu pipeline (which runs FuseOps/FuseTIR) and run once."""
    ex = tvm.compile(mod, target=_TARGET, relax_pipeline=relax.get_default_pipeline(_TARGET))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()]).numpy()


def _small_output(name: str) -> np.ndarray:
    """Each small model is compiled once per test session."""
    if name not in _RUNS:
        _RUNS[name] = _run(*models.load(name, small=True))
    return _RUNS[name]


def test_names_exact() -> None:
    assert models.zoo.names() == EXPECTED_NAMES


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_load_small_structure(name: str) -> None:
    mod, inputs = models.load(name, small=True)
    relax.analysis.well_formed(mod)  # raises on the first violation
    assert [gv.name_hint for gv in mod.get_global_vars()] == ["main"]
    func = mod["main"]
    assert "num_input" not in func.attrs
    assert func.attrs["global_symbol"] == "main"
    # Only the model inputs are parameters; weights are bound constants.
    assert [p.name for p in func.params] == list(inputs)
    for param, value in zip(func.params, inputs.values(), strict=True):
        assert tuple(int(s) for s in param.ty.shape.values) == value.shape
        assert str(param.ty.dtype) == str(value.dtype) == "float32"
    # Still high level: no call_tir before LegalizeOps.
    assert "call_tir" not in mod.script()


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_load_is_deterministic(name: str) -> None:
    mod_a, inputs_a = models.load(name, small=True)
    mod_b, inputs_b = models.load(name, small=True)
    tvm.ir.assert_structural_equal(mod_a, mod_b)  # constants compared by value
    assert list(inputs_a) == list(inputs_b)
    for key in inputs_a:
        np.testing.assert_array_equal(inputs_a[key], inputs_b[key])
    _, weights_a, _ = models.zoo.build(name, small=True)
    _, weights_b, _ = models.zoo.build(name, small=True)
    assert list(weights_a) == list(weights_b)
    for key in weights_a:
        np.testing.assert_array_equal(weights_a[key], weights_b[key])


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_small_compiles_and_runs(name: str) -> None:
    out = _small_output(name)
    assert out.shape == SMALL_OUT_SHAPES[name]
    assert np.isfinite(out).all()
    assert 0 < np.abs(out).max() < 100  # O(1), not a collapsed or exploding output


def test_small_keeps_structure() -> None:
    """The small variants keep every layer: count the high-level ops."""
    counts = {}
    for name in ("resnet18", "mobilenetv2"):
        script = models.load(name, small=True)[0].script()
        counts[name] = (script.count("R.nn.conv2d("), script.count("R.nn.batch_norm("))
    assert counts["resnet18"] == (20, 20)  # stem + 8 blocks x 2 + 3 downsamples
    assert counts["mobilenetv2"] == (52, 52)  # stem + 17 blocks (16 with expand x 3, 1 x 2) + head


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_mlp_gelu_matches_numpy() -> None:
    _, w, inputs = models.zoo.build("mlp_gelu", small=True)
    x = inputs["x"].astype(np.float64)
    h = _gelu(x @ w["fc1.weight"].T + w["fc1.bias"])
    ref = h @ w["fc2.weight"].T + w["fc2.bias"]
    np.testing.assert_allclose(_small_output("mlp_gelu"), ref, rtol=1e-4, atol=1e-5)


def test_attention_matches_numpy() -> None:
    _, w, inputs = models.zoo.build("attention", small=True)
    assert w == {}
    q, k, v = (inputs[n].astype(np.float64) for n in ("q", "k", "v"))
    ref = _softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])) @ v
    np.testing.assert_allclose(_small_output("attention"), ref, rtol=1e-4, atol=1e-5)


def test_decode_attention_matches_numpy() -> None:
    """The new token's query and key rotated, its key and value appended to the caches,
    each KV head shared by ``group`` query heads."""
    module, w, inputs = models.zoo.build("decode_attention", small=True)
    x = {n: a.astype(np.float64) for n, a in inputs.items()}
    half = module.d // 2

    def rotate(t: np.ndarray) -> np.ndarray:
        turned = np.concatenate([-t[..., half:], t[..., :half]], axis=-1)
        return t * w["cos"] + turned * w["sin"]

    k = np.repeat(np.concatenate([x["cache_k"], rotate(x["k"])], axis=2), module.group, 1)
    v = np.repeat(np.concatenate([x["cache_v"], x["v"]], axis=2), module.group, 1)
    scores = rotate(x["q"]) @ k.transpose(0, 1, 3, 2) / math.sqrt(module.d) + x["mask"]
    ref = _softmax(scores) @ v
    np.testing.assert_allclose(_small_output("decode_attention"), ref, rtol=1e-4, atol=1e-5)


def test_rmsnorm_matches_numpy() -> None:
    module, w, inputs = models.zoo.build("rmsnorm", small=True)
    x = inputs["x"].astype(np.float64)
    ref = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + module.eps) * w["weight"]
    np.testing.assert_allclose(_small_output("rmsnorm"), ref, rtol=1e-4, atol=1e-5)


def test_rmsnorm_is_spelled_out() -> None:
    script = models.load("rmsnorm", small=True)[0].script()
    for op in ("R.square(", "R.mean(", "R.add(", "R.rsqrt(", "R.multiply("):
        assert op in script
    assert "rms_norm" not in script


def test_elementwise_chain_is_long_and_elementwise() -> None:
    func = models.load("elementwise_chain", small=True)[0]["main"]
    ops = []
    relax.analysis.post_order_visit(
        func, lambda e: ops.append(e.op.name) if isinstance(e, relax.Call) else None
    )
    assert len(ops) >= 16
    assert all(not n.startswith(("relax.nn.conv", "relax.matmul", "relax.sum")) for n in ops)


def test_gpt2_block_is_causal() -> None:
    """Changing the last token must not change the outputs of earlier tokens."""
    mod, inputs = models.load("gpt2_block", small=True)
    ex = tvm.compile(mod, target=_TARGET, relax_pipeline=relax.get_default_pipeline(_TARGET))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = inputs["x"]
    y = x.copy()
    y[:, -1] += 1.0
    out_x = vm["main"](tvm.runtime.tensor(x)).numpy()
    out_y = vm["main"](tvm.runtime.tensor(y)).numpy()
    np.testing.assert_allclose(out_x[:, :-1], out_y[:, :-1], rtol=1e-6, atol=1e-6)
    assert not np.allclose(out_x[:, -1], out_y[:, -1])


def test_unknown_name_raises() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'nosuch': a name \(mlp_gelu, "):
        models.load("nosuch")
    with pytest.raises(ValueError, match="elementwise_chain"):
        models.load("nope", small=True)


def test_load_torch() -> None:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x))

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 16)
    mod, inputs = models.load_torch(net, (x,))
    relax.analysis.well_formed(mod)
    assert [gv.name_hint for gv in mod.get_global_vars()] == ["main"]
    assert len(mod["main"].params) == 1  # weights bound as constants
    np.testing.assert_array_equal(next(iter(inputs.values())), x.numpy())
    with torch.no_grad():
        ref = net(x).numpy()
    np.testing.assert_allclose(_run(mod, inputs), ref, rtol=1e-5, atol=1e-6)


def test_load_onnx(tmp_path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("Relu", ["y"], ["out"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 8])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))

    mod, inputs = models.load_onnx(path)
    relax.analysis.well_formed(mod)
    assert [gv.name_hint for gv in mod.get_global_vars()] == ["main"]
    assert list(inputs) == ["x"] and inputs["x"].shape == (2, 16)
    _, again = models.load_onnx(path)
    np.testing.assert_array_equal(inputs["x"], again["x"])
    ref = np.maximum(inputs["x"] @ weight, 0)
    np.testing.assert_allclose(_run(mod, inputs), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["stock", "none", "tvm", "costfuse"])
def test_load_torch_bool_scan_builds_and_matches(strategy: str) -> None:
    # A bool cumsum is int64 in PyTorch; kept bool, LLVM cannot add it (CreateAdd check).
    import torch
    from torch_models import PackedSegments

    from tvm_costfuse.measurement.timing import assert_close, run
    from tvm_costfuse.strategies import strategy_pipeline
    from tvm_costfuse.targets import host_target

    torch.manual_seed(0)
    net = PackedSegments().eval()
    ids = torch.tensor([[3, 4, 5, 9, 10, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]])
    mod, inputs = models.load_torch(net, (ids,))
    scans = [b.var.ty.dtype for blk in mod["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.cumsum"]
    assert scans == ["int64"]
    target = host_target()
    with target:
        ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(strategy, target))
    with torch.no_grad():
        assert_close(run(ex, inputs), [net(ids).numpy()])


@pytest.mark.parametrize("name", ["cumsum_int32", "cumprod_bool", "cumsum_dtype"])
def test_load_torch_scans_keep_torch_result_dtype(name: str) -> None:
    import torch

    fns = {"cumsum_int32": lambda x: x.int().cumsum(-1),
           "cumprod_bool": lambda x: (x != 1).cumprod(-1),
           "cumsum_dtype": lambda x: torch.cumsum(x != 1, -1, dtype=torch.int32)}

    class Scan(torch.nn.Module):
        def forward(self, x):
            return fns[name](x)

    x = torch.tensor([[1, 2, 3, 4, 1, 1, 5, 6]])
    mod, inputs = models.load_torch(Scan(), (x,))
    out = _run(mod, inputs)
    want = fns[name](x).numpy()
    assert out.dtype == want.dtype
    np.testing.assert_array_equal(out, want)


def test_load_torch_negative_indices_count_from_the_end() -> None:
    """A literal negative list index (Falcon's ``x[..., [-2], :]``) and a computed one: TVM's
    converter emits ``take(mode="fast")``, which reads out of bounds for both."""
    import torch

    class Index(torch.nn.Module):
        def forward(self, x, i):
            return x[..., [-2], :] * x[0, i].sum()

    args = (torch.randn(1, 4, 5, 3), torch.tensor([-1, 0, 2]))
    mod, inputs = models.load_torch(Index(), args)
    got = run(tvm.compile(mod, target="llvm"), inputs)[0]
    np.testing.assert_allclose(got, Index()(*args).numpy(), rtol=1e-5, atol=1e-6)


def test_load_torch_true_division_of_integers_is_float() -> None:
    """``/`` on int64 is float32 in PyTorch (DeBERTa's log-bucketed positions take its log)."""
    import torch

    class Divide(torch.nn.Module):
        def forward(self, x, y):
            return torch.log(x / 4 + 1.5) + x / y + y / 2.0

    args = (torch.arange(8).reshape(1, 8), torch.randn(1, 8))
    mod, inputs = models.load_torch(Divide(), args)
    got = run(tvm.compile(mod, target="llvm"), inputs)[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, Divide()(*args).numpy(), rtol=1e-5, atol=1e-6)


def test_load_torch_cat_skips_empty_1d_inputs() -> None:
    """PyTorch's cat skips ``(0,)`` inputs of any other rank (a decoder's empty KV cache)."""
    import torch

    class Cat(torch.nn.Module):
        def forward(self, x):
            return torch.cat([torch.empty(0), x * 2, x], dim=-2) + torch.cat((x, x), 2)

    args = (torch.randn(1, 2, 3, 4),)
    mod, inputs = models.load_torch(Cat(), args)
    got = run(tvm.compile(mod, target="llvm"), inputs)[0]
    np.testing.assert_allclose(got, Cat()(*args).numpy(), rtol=1e-5, atol=1e-6)
