"""Model zoo: the Relax workloads CostFuse is evaluated on.

Every model is written with ``tvm.relax.frontend.nn`` (no PyTorch needed) and exported as an
IRModule with a single Relax function ``main`` whose parameters are only the model inputs. The
weights are random but deterministic (numpy ``default_rng`` seeded from the model name) and are
bound as constants, because fusion and constant folding must see them exactly as a deployed model
would. The graphs stay at the high-level Relax op level (before ``LegalizeOps``): the fusion pass
under test, not the zoo, decides how ops are lowered and grouped.

Weights use He/Xavier-like scales and batch norms start near identity so that outputs are finite
and O(1): results are compared across compilation strategies at ``rtol ~ 1e-4``.

``small=True`` keeps each graph's structure (same op kinds, same number of layers/blocks) with tiny
shapes so a model legalizes and builds for llvm in seconds; tests use those.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from . import synthetic

__all__ = ["load", "load_onnx", "load_torch", "load_variant", "names", "variant_name"]

_F32 = "float32"


# --------------------------------------------------------------------------------------------
# Small building blocks that relax.frontend.nn lacks.
# --------------------------------------------------------------------------------------------


def _emit(expr: relax.Expr, name: str) -> nn.Tensor:
    """Emit a raw Relax op inside an nn ``forward`` (for ops nn.op does not wrap)."""
    return nn.op.wrap_nested(expr, name)


class BatchNorm2d(nn.Module):
    """Inference-mode batch norm kept as the high-level ``relax.op.nn.batch_norm``.

    relax.frontend.nn has no BatchNorm module. We do not fold BN into the conv weights: the
    fusion pass must see (and decide about) the conv -> batch_norm -> relu chain itself.
    ``gamma_scale`` shrinks gamma on the last BN of a residual branch so activations do not
    grow with depth (inference BN with running stats does not renormalise).
    """

    def __init__(self, channels: int, eps: float = 1e-5, gamma_scale: float = 1.0) -> None:
        self.eps = eps
        self.gamma_scale = gamma_scale
        self.gamma = nn.Parameter((channels,), _F32)
        self.beta = nn.Parameter((channels,), _F32)
        self.running_mean = nn.Parameter((channels,), _F32)
        self.running_var = nn.Parameter((channels,), _F32)

    def init_param(self, attr: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """Near-identity statistics: gamma ~ 1, beta ~ 0, mean ~ 0, var ~ 1."""
        if attr == "gamma":
            return self.gamma_scale * (1.0 + 0.1 * rng.standard_normal(shape))
        if attr == "beta":
            return 0.05 * rng.standard_normal(shape)
        if attr == "running_mean":
            return 0.05 * rng.standard_normal(shape)
        return rng.uniform(0.8, 1.2, shape)  # running_var

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        call = relax.op.nn.batch_norm(
            x._expr,
            self.gamma._expr,
            self.beta._expr,
            self.running_mean._expr,
            self.running_var._expr,
            axis=1,
            epsilon=self.eps,
            training=False,
        )
        # batch_norm returns (out, new_mean, new_var); only the output is used at inference.
        tup = relax.BlockBuilder.current().emit(call, "batch_norm")
        return _emit(relax.TupleGetItem(tup, 0), "bn")


class ConvBNAct(nn.Module):
    """conv2d (no bias) -> inference batch_norm -> relu / relu6 / nothing."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        groups: int = 1,
        act: str | None = "relu",
        gamma_scale: float = 1.0,
    ) -> None:
        self.conv = nn.Conv2D(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False)
        self.bn = BatchNorm2d(cout, gamma_scale=gamma_scale)
        self.act = act

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        y = self.bn(self.conv(x))
        if self.act == "relu":
            y = nn.op.relu(y)
        elif self.act == "relu6":
            y = nn.op.relu6(y)
        return y


def _split_heads(x: nn.Tensor, heads: int) -> nn.Tensor:
    """(1, S, H) -> (1, heads, S, H / heads)."""
    b, s, h = x.shape
    return nn.op.permute_dims(nn.op.reshape(x, (b, s, heads, h // heads)), [0, 2, 1, 3])


def _merge_heads(x: nn.Tensor) -> nn.Tensor:
    """(1, heads, S, d) -> (1, S, heads * d)."""
    b, heads, s, d = x.shape
    return nn.op.reshape(nn.op.permute_dims(x, [0, 2, 1, 3]), (b, s, heads * d))


def _attention_core(
    q: nn.Tensor, k: nn.Tensor, v: nn.Tensor, mask: nn.Tensor | None = None
) -> nn.Tensor:
    """softmax(Q K^T / sqrt(d) [masked]) V on (1, heads, S, d) tensors."""
    d = q.shape[-1]
    scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) / math.sqrt(d)
    if mask is not None:
        # GPT-2 style: keep scores where the causal mask is true, else a large negative value.
        neg = relax.const(-1e4, _F32)
        scores = _emit(relax.op.where(mask._expr, scores._expr, neg), "causal_mask")
    return nn.op.matmul(nn.op.softmax(scores, axis=-1), v)


class _SelfAttention(nn.Module):
    """Separate Q/K/V projections (BERT style) followed by the output projection."""

    def __init__(self, hidden: int, heads: int) -> None:
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        q = _split_heads(self.query(x), self.heads)
        k = _split_heads(self.key(x), self.heads)
        v = _split_heads(self.value(x), self.heads)
        return self.out(_merge_heads(_attention_core(q, k, v)))


# --------------------------------------------------------------------------------------------
# Models.
# --------------------------------------------------------------------------------------------


class MLPGelu(nn.Module):
    """Linear -> GELU -> Linear (transformer FFN)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.fc2(nn.op.gelu(self.fc1(x)))


class Attention(nn.Module):
    """Bare scaled dot-product attention on given Q, K, V (no weights)."""

    def forward(self, q: nn.Tensor, k: nn.Tensor, v: nn.Tensor) -> nn.Tensor:
        return _attention_core(q, k, v)


class ConvBNReLU(nn.Module):
    """One conv2d 3x3 -> batch_norm -> relu."""

    def __init__(self, channels: int) -> None:
        self.block = ConvBNAct(channels, channels, 3)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.block(x)


class _BasicBlock(nn.Module):
    """ResNet basic block; the downsample branch is conv1x1 + BN when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        self.conv1 = ConvBNAct(cin, cout, 3, stride)
        self.conv2 = ConvBNAct(cout, cout, 3, act=None, gamma_scale=0.25)
        self.downsample = (
            ConvBNAct(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None
        )

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        identity = self.downsample(x) if self.downsample is not None else x
        return nn.op.relu(self.conv2(self.conv1(x)) + identity)


class ResNet18(nn.Module):
    """torchvision ResNet-18 layout: stem, 4 stages x 2 basic blocks, avgpool, fc."""

    def __init__(self, base: int, classes: int) -> None:
        self.stem = ConvBNAct(3, base, 7, 2)
        blocks = []
        cin = base
        for stage in range(4):
            cout = base * 2**stage
            for i in range(2):
                blocks.append(_BasicBlock(cin, cout, 2 if stage > 0 and i == 0 else 1))
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        x = self.stem(x)
        x = _emit(relax.op.nn.max_pool2d(x._expr, 3, 2, 1), "maxpool")
        for block in self.blocks:
            x = block(x)
        x = _emit(relax.op.nn.adaptive_avg_pool2d(x._expr, (1, 1)), "avgpool")
        return self.fc(nn.op.reshape(x, (x.shape[0], x.shape[1])))


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding for MobileNetV2."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class _InvertedResidual(nn.Module):
    """MobileNetV2 block: [expand 1x1] -> depthwise 3x3 -> linear project 1x1 [+ residual]."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        hidden = cin * expand
        self.expand = ConvBNAct(cin, hidden, 1, act="relu6") if expand != 1 else None
        self.dw = ConvBNAct(hidden, hidden, 3, stride, groups=hidden, act="relu6")
        self.use_res = stride == 1 and cin == cout
        self.project = ConvBNAct(hidden, cout, 1, act=None, gamma_scale=0.5 if self.use_res else 1)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        y = self.expand(x) if self.expand is not None else x
        y = self.project(self.dw(y))
        return x + y if self.use_res else y


class MobileNetV2(nn.Module):
    """torchvision MobileNetV2 layout (17 inverted residual blocks), without dropout."""

    _CFG = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip

    def __init__(self, width: float, last: int, classes: int) -> None:
        cin = _make_divisible(32 * width)
        self.stem = ConvBNAct(3, cin, 3, 2, act="relu6")
        blocks = []
        for t, c, n, s in self._CFG:
            cout = _make_divisible(c * width)
            for i in range(n):
                blocks.append(_InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.head = ConvBNAct(cin, last, 1, act="relu6")
        self.fc = nn.Linear(last, classes)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        x = _emit(relax.op.nn.adaptive_avg_pool2d(self.head(x)._expr, (1, 1)), "avgpool")
        return self.fc(nn.op.reshape(x, (x.shape[0], x.shape[1])))


class BertLayer(nn.Module):
    """HF BertLayer (post-LN): LN(x + Attn(x)), then LN(h + FFN(h)), eps 1e-12."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        self.attention = _SelfAttention(hidden, heads)
        self.attn_ln = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, ffn)
        self.output = nn.Linear(ffn, hidden)
        self.out_ln = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        h = self.attn_ln(self.attention(x) + x)
        return self.out_ln(self.output(nn.op.gelu(self.intermediate(h))) + h)


class GPT2Block(nn.Module):
    """HF GPT2Block (pre-LN): fused c_attn, causal mask, tanh-GELU MLP."""

    def __init__(self, hidden: int, heads: int, seq: int) -> None:
        self.heads = heads
        self.seq = seq
        self.ln_1 = nn.LayerNorm(hidden)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.mlp_proj = nn.Linear(4 * hidden, hidden)
        # A constant like HF's registered `bias` buffer; bound like any weight.
        self.causal_mask = nn.Parameter((1, 1, seq, seq), "bool")

    def init_param(self, attr: str, shape: tuple[int, ...], rng: np.random.Generator):
        """The mask is the lower triangle, not random."""
        if attr == "causal_mask":
            return np.tril(np.ones((self.seq, self.seq), dtype=bool)).reshape(shape)
        return None

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        q, k, v = nn.op.split(self.c_attn(self.ln_1(x)), 3, axis=-1)
        ctx = _attention_core(
            _split_heads(q, self.heads),
            _split_heads(k, self.heads),
            _split_heads(v, self.heads),
            self.causal_mask,
        )
        x = x + self.c_proj(_merge_heads(ctx))
        return x + self.mlp_proj(nn.op.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class LayerNormMLP(nn.Module):
    """x + Linear(GELU(Linear(LayerNorm(x)))): a pre-LN transformer FFN sub-block."""

    def __init__(self, hidden: int, ffn: int) -> None:
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return x + self.fc2(nn.op.gelu(self.fc1(self.ln(x))))


class RMSNormExplicit(nn.Module):
    """RMSNorm spelled out (square, mean, +eps, rsqrt, *x, *weight) so there is a reduction
    plus an elementwise epilogue to fuse, instead of the single ``R.nn.rms_norm`` op."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        self.eps = eps
        self.weight = nn.Parameter((hidden,), _F32)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        ms = _emit(relax.op.mean(nn.op.square(x)._expr, axis=-1, keepdims=True), "mean")
        inv = _emit(relax.op.rsqrt((ms + self.eps)._expr), "rsqrt")
        return x * inv * self.weight


class ElementwiseChain(nn.Module):
    """20 elementwise ops mixing unary math, broadcast constants and re-use of the input.

    Every step is bounded for any finite input (sigmoid/tanh clamp ranges; log and sqrt only
    see values >= 0.5), so no NaN/inf appears whatever the fusion.
    """

    def __init__(self, width: int) -> None:
        self.scale = nn.Parameter((width,), _F32)
        self.shift = nn.Parameter((width,), _F32)

    def init_param(self, attr: str, shape: tuple[int, ...], rng: np.random.Generator):
        """scale in [0.5, 1.5] keeps sqrt's argument positive; shift is small."""
        if attr == "scale":
            return rng.uniform(0.5, 1.5, shape)
        return 0.1 * rng.standard_normal(shape)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        op = nn.op
        y = op.sigmoid(x)  # (0, 1)
        y = y + 0.5  # (0.5, 1.5)
        y = op.log(y)  # (-0.7, 0.41)
        y = y * 1.5
        y = y + x  # re-use of the input: a second consumer of x
        y = op.tanh(y)  # (-1, 1)
        y = op.exp(y)  # (0.36, 2.8)
        y = y * self.scale  # broadcast constant, (0.18, 4.1)
        y = op.sqrt(y)  # (0.42, 2.1)
        y = y - 1.0
        y = op.negative(y)
        y = _emit(relax.op.abs(y._expr), "abs")
        y = op.sigmoid(y)
        y = y * x
        y = op.tanh(y)
        y = y + self.shift  # broadcast constant
        y = op.square(y)
        y = _emit(relax.op.cos(y._expr), "cos")
        y = y / 2.0
        y = op.relu(y - 0.1)
        return y


# --------------------------------------------------------------------------------------------
# Registry.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    """How to build one model: the nn module and its ordered input shapes."""

    module: nn.Module
    inputs: dict[str, tuple[int, ...]]


def _transformer_dims(small: bool) -> tuple[int, int, int, int]:
    """(hidden, heads, seq, ffn) for the BERT/GPT-2-sized models."""
    return (32, 2, 8, 128) if small else (768, 12, 128, 3072)


def _mlp_gelu(small: bool) -> _Spec:
    hidden, _, seq, ffn = _transformer_dims(small)
    return _Spec(MLPGelu(hidden, ffn), {"x": (1, seq, hidden)})


def _attention(small: bool) -> _Spec:
    hidden, heads, seq, _ = _transformer_dims(small)
    shape = (1, heads, seq, hidden // heads)
    return _Spec(Attention(), {"q": shape, "k": shape, "v": shape})


def _conv_bn_relu(small: bool) -> _Spec:
    c, hw = (8, 16) if small else (64, 56)
    return _Spec(ConvBNReLU(c), {"x": (1, c, hw, hw)})


def _resnet18(small: bool) -> _Spec:
    base, hw, classes = (8, 32, 10) if small else (64, 224, 1000)
    return _Spec(ResNet18(base, classes), {"x": (1, 3, hw, hw)})


def _mobilenetv2(small: bool) -> _Spec:
    width, last, hw, classes = (0.25, 64, 32, 10) if small else (1.0, 1280, 224, 1000)
    return _Spec(MobileNetV2(width, last, classes), {"x": (1, 3, hw, hw)})


def _bert_layer(small: bool) -> _Spec:
    hidden, heads, seq, ffn = _transformer_dims(small)
    return _Spec(BertLayer(hidden, heads, ffn), {"x": (1, seq, hidden)})


def _gpt2_block(small: bool) -> _Spec:
    hidden, heads, seq, _ = _transformer_dims(small)
    return _Spec(GPT2Block(hidden, heads, seq), {"x": (1, seq, hidden)})


def _layernorm_mlp(small: bool) -> _Spec:
    hidden, _, seq, ffn = _transformer_dims(small)
    return _Spec(LayerNormMLP(hidden, ffn), {"x": (1, seq, hidden)})


def _rmsnorm(small: bool) -> _Spec:
    hidden, seq = (64, 8) if small else (4096, 128)
    return _Spec(RMSNormExplicit(hidden), {"x": (1, seq, hidden)})


def _elementwise_chain(small: bool) -> _Spec:
    shape = (1, 64, 64) if small else (1, 1024, 1024)
    return _Spec(ElementwiseChain(shape[-1]), {"x": shape})


_MODELS: dict[str, Callable[[bool], _Spec]] = {
    "mlp_gelu": _mlp_gelu,
    "attention": _attention,
    "conv_bn_relu": _conv_bn_relu,
    "resnet18": _resnet18,
    "mobilenetv2": _mobilenetv2,
    "bert_layer": _bert_layer,
    "gpt2_block": _gpt2_block,
    "layernorm_mlp": _layernorm_mlp,
    "rmsnorm": _rmsnorm,
    "elementwise_chain": _elementwise_chain,
}


def names() -> list[str]:
    """Names accepted by :func:`load`, in a stable order."""
    return list(_MODELS)


def _rng(name: str) -> np.random.Generator:
    """Seed from the name with crc32, not hash(): hash() is salted per process."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def _owner(root: nn.Module, path: str) -> tuple[nn.Module, str]:
    """Resolve ``"blocks.0.bn.gamma"`` to (the module holding it, ``"gamma"``)."""
    *parts, attr = path.split(".")
    obj = root
    for part in parts:
        obj = obj[int(part)] if isinstance(obj, nn.ModuleList) else getattr(obj, part)
    return obj, attr


def _init_value(
    owner: nn.Module, attr: str, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """A module's own ``init_param`` wins; otherwise He for convs, Xavier-like for linears,
    ~1 for norm weights, ~0 for biases."""
    hook = getattr(owner, "init_param", None)
    value = hook(attr, shape, rng) if hook is not None else None
    if value is not None:
        return value
    if attr == "weight" and len(shape) == 4:  # conv, fan_in = cin/groups * kh * kw
        return rng.standard_normal(shape) * math.sqrt(2.0 / int(np.prod(shape[1:])))
    if attr == "weight" and len(shape) == 2:  # linear (out, in)
        return rng.standard_normal(shape) / math.sqrt(shape[1])
    if attr == "weight":  # layer norm / rms norm gain
        return 1.0 + 0.1 * rng.standard_normal(shape)
    return 0.05 * rng.standard_normal(shape)


def _build(
    name: str, small: bool = False
) -> tuple[nn.Module, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Build the nn module, its weights {nn parameter path: array} and example inputs.

    Private, but tests use it to get at the weights for NumPy references.
    """
    if synthetic.is_synthetic(name):
        if small:
            raise ValueError(f"{name}: synthetic programs draw their own sizes; small=True "
                             "does not apply")
        spec = _Spec(*synthetic.program(name))
    elif name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(_MODELS)} "
                         f"(or {synthetic.PREFIX}<seed> for a random test program)")
    else:
        spec = _MODELS[name](small)
    rng = _rng(name)
    weights: dict[str, np.ndarray] = {}
    for path, param in spec.module.named_parameters():
        shape = tuple(int(s) for s in param.shape)
        owner, attr = _owner(spec.module, path)
        weights[path] = np.asarray(_init_value(owner, attr, shape, rng), dtype=param.dtype)
    inputs = {k: rng.standard_normal(s).astype(_F32) for k, s in spec.inputs.items()}
    return spec.module, weights, inputs


def _as_main(mod: tvm.IRModule, func_name: str) -> tvm.IRModule:
    """A fresh module holding only ``func_name`` renamed to ``main``, without ``num_input``."""
    func = mod[func_name]
    if func.attrs is not None and "num_input" in func.attrs:
        func = func.without_attr("num_input")
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def load(name: str, *, small: bool = False) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """Return (IRModule with only ``main``, weights bound as constants; {input name: array}).

    The module is at the high-level Relax op level (no LegalizeOps yet). Same name -> identical
    weights and inputs on every call. Unknown names raise ``ValueError`` listing valid ones.
    """
    module, weights, inputs = _build(name, small)
    spec = {"forward": {k: nn.spec.Tensor(v.shape, _F32) for k, v in inputs.items()}}
    mod, params = module.export_tvm(spec=spec)
    func = mod["forward"]
    # export_tvm appends one function parameter per weight, in `params` order.
    weight_vars = func.params[len(inputs) :]
    bind = {var: weights[path] for var, (path, _) in zip(weight_vars, params, strict=True)}
    mod = relax.transform.BindParams("forward", bind)(mod)
    return _as_main(mod, "forward"), inputs


def variant_name(name: str, small: bool) -> str:
    """How measurement records name a model variant: ``bert_layer``, ``bert_layer@small``."""
    return f"{name}@small" if small else name


def load_variant(model: str) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """:func:`load` for a name written by :func:`variant_name` (as stored in the databases)."""
    name, _, size = model.partition("@")
    return load(name, small=size == "small")


# --------------------------------------------------------------------------------------------
# External frontends (optional extras).
# --------------------------------------------------------------------------------------------


def load_torch(module, args: tuple) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """Import a ``torch.nn.Module`` via ``torch.export`` with its weights bound as constants.

    The example inputs are ``args`` converted to numpy, keyed by the Relax parameter names.
    ``module`` is switched to eval mode first (dropout/batch-norm must be in inference form).
    """
    try:
        import torch
        from tvm.relax.frontend.torch import from_exported_program
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "load_torch needs PyTorch: pip install 'tvm_costfuse[torch]' (torch==2.13.0)"
        ) from err
    args = tuple(args)
    with torch.no_grad():
        ep = torch.export.export(module.eval(), args)
    # keep_params_as_input=False (the default) binds the weights as constants.
    mod = from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True)
    mod = _as_main(mod, "main")
    arrays = [a.detach().cpu().numpy() for a in args]
    params = mod["main"].params
    if len(params) != len(arrays):
        raise ValueError(f"expected {len(arrays)} inputs in the imported main, got {len(params)}")
    return mod, {p.name: a for p, a in zip(params, arrays, strict=True)}


def _example_input(ty, rng: np.random.Generator) -> np.ndarray:
    """A random tensor for a Relax parameter type; symbolic dims (batch) become 1."""
    shape = tuple(int(s) if isinstance(s, tvm.tirx.IntImm) else 1 for s in ty.shape.values)
    dtype = str(ty.dtype)
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 8, shape).astype(dtype)


def load_onnx(path: str) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """Import an ONNX file (initializers bound as constants) with seeded random example inputs."""
    try:
        import onnx
        from tvm.relax.frontend import onnx as relax_onnx
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("load_onnx needs onnx: pip install 'tvm_costfuse[onnx]'") from err
    model = onnx.load(str(path))
    mod = _as_main(relax_onnx.from_onnx(model, keep_params_in_input=False), "main")
    rng = _rng(str(model.graph.name or path))
    return mod, {p.name: _example_input(p.ty, rng) for p in mod["main"].params}
