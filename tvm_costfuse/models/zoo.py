"""The zoo: eleven hand-written Relax workloads (``relax.frontend.nn``), a unit-test substrate.

Every model is exported as an IRModule with a single Relax function ``main`` whose parameters
are only the model inputs; the weights are random but deterministic (seeded from the model
name, :mod:`.export`) and bound as constants, because fusion and constant folding must see them
as a deployed model would. The graphs stay at the high-level Relax op level (before
``LegalizeOps``): the fusion pass under test, not the zoo, decides how ops are lowered and
grouped. ``small=True`` keeps each graph's structure (same op kinds, same number of
layers/blocks) with tiny shapes so a model builds for llvm in seconds; tests use those.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from .blocks import (
    F32 as _F32,
)
from .blocks import (
    ConvBNAct,
    DecodeAttention,
    RMSNormExplicit,
    SelfAttention,
    attention_core,
    emit,
    merge_heads,
    split_heads,
)
from .export import Spec as _Spec
from .export import build_weights, export

__all__ = ["build", "load", "names"]


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
        return attention_core(q, k, v)


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
        x = emit(relax.op.nn.max_pool2d(x._expr, 3, 2, 1), "maxpool")
        for block in self.blocks:
            x = block(x)
        x = emit(relax.op.nn.adaptive_avg_pool2d(x._expr, (1, 1)), "avgpool")
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
        x = emit(relax.op.nn.adaptive_avg_pool2d(self.head(x)._expr, (1, 1)), "avgpool")
        return self.fc(nn.op.reshape(x, (x.shape[0], x.shape[1])))


class BertLayer(nn.Module):
    """HF BertLayer (post-LN): LN(x + Attn(x)), then LN(h + FFN(h)), eps 1e-12."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        self.attention = SelfAttention(hidden, heads)
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
        ctx = attention_core(
            split_heads(q, self.heads),
            split_heads(k, self.heads),
            split_heads(v, self.heads),
            self.causal_mask,
        )
        x = x + self.c_proj(merge_heads(ctx))
        return x + self.mlp_proj(nn.op.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class LayerNormMLP(nn.Module):
    """x + Linear(GELU(Linear(LayerNorm(x)))): a pre-LN transformer FFN sub-block."""

    def __init__(self, hidden: int, ffn: int) -> None:
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return x + self.fc2(nn.op.gelu(self.fc1(self.ln(x))))


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
        y = emit(relax.op.abs(y._expr), "abs")
        y = op.sigmoid(y)
        y = y * x
        y = op.tanh(y)
        y = y + self.shift  # broadcast constant
        y = op.square(y)
        y = emit(relax.op.cos(y._expr), "cos")
        y = y / 2.0
        y = op.relu(y - 0.1)
        return y


# --------------------------------------------------------------------------------------------
# Registry.
# --------------------------------------------------------------------------------------------


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


def _decode_attention(small: bool) -> _Spec:
    # Qwen2-0.5B's attention (14 query heads on 2 KV heads, head dim 64), 1024 past tokens.
    kv_heads, group, past, d = (2, 2, 15, 16) if small else (2, 7, 1024, 64)
    one, cache = (1, kv_heads, 1, d), (1, kv_heads, past, d)
    return _Spec(DecodeAttention(kv_heads, group, past, d),
                 {"q": (1, kv_heads * group, 1, d), "k": one, "v": one, "cache_k": cache,
                  "cache_v": cache, "mask": (1, 1, 1, past + 1)})


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
    "decode_attention": _decode_attention,
}

# The corpus family (``corpus.FAMILIES``) each zoo model's blocks come from, so that a
# leave-one-family-out evaluation holds a zoo model out with the real models it resembles.
# The FFN blocks are the encoders' (GELU); the RMS norm is the LLaMA-style decoders'; the
# decode step's attention is the decode steps' (one token against a KV cache).
FAMILIES: dict[str, str] = {
    "mlp_gelu": "encoder", "attention": "encoder", "conv_bn_relu": "cnn", "resnet18": "cnn",
    "mobilenetv2": "cnn", "bert_layer": "encoder", "gpt2_block": "decoder",
    "layernorm_mlp": "encoder", "rmsnorm": "decoder", "elementwise_chain": "elementwise",
    "decode_attention": "decode",
}


def names() -> list[str]:
    """Names accepted by :func:`load`, in a stable order."""
    return list(_MODELS)


def _spec(name: str, small: bool) -> _Spec:
    if name not in _MODELS:
        raise ValueError(f"unknown zoo model {name!r}; valid names: {', '.join(_MODELS)}")
    return _MODELS[name](small)


def build(name: str, small: bool = False
          ) -> tuple[nn.Module, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The nn module, its weights {nn parameter path: array} and example inputs (tests use the
    weights for NumPy references)."""
    return build_weights(name, _spec(name, small))


def load(name: str, *, small: bool = False) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """(IRModule with only ``main``, weights bound as constants; {input name: array}).

    Same name -> identical weights and inputs on every call. Unknown names raise
    ``ValueError`` listing valid ones.
    """
    return export(name, _spec(name, small))
