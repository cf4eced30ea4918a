"""The zoo's models in plain PyTorch eager, with the zoo's own weights: the bench's baseline.

Each function mirrors one ``tvm_costfuse.models.zoo`` model op by op. Layer configuration (strides,
groups, activations, residual branches) is read from the zoo's ``relax.frontend.nn`` module
itself, and the weights are the zoo's arrays, so TVM and PyTorch run the same computation;
``bench_cpu.py`` checks their outputs against TVM's stock build before timing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from tvm_costfuse import models

Weights = dict[str, torch.Tensor]


def _linear(w: Weights, p: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w[f"{p}.weight"], w.get(f"{p}.bias"))


def _layer_norm(w: Weights, p: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w[f"{p}.weight"], w[f"{p}.bias"], eps)


def _conv_bn_act(w: Weights, p: str, block, x: torch.Tensor) -> torch.Tensor:
    conv = block.conv
    y = F.conv2d(
        x, w[f"{p}.conv.weight"], None, conv.stride, conv.padding, conv.dilation, conv.groups
    )
    y = F.batch_norm(
        y,
        w[f"{p}.bn.running_mean"],
        w[f"{p}.bn.running_var"],
        w[f"{p}.bn.gamma"],
        w[f"{p}.bn.beta"],
        False,
        0.0,
        block.bn.eps,
    )
    if block.act == "relu":
        return F.relu(y)
    if block.act == "relu6":
        return F.relu6(y)
    return y


def _attention_core(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(-1e4, dtype=scores.dtype))
    return torch.softmax(scores, dim=-1) @ v


def _split_heads(x, heads):
    b, s, h = x.shape
    return x.reshape(b, s, heads, h // heads).permute(0, 2, 1, 3)


def _merge_heads(x):
    b, heads, s, d = x.shape
    return x.permute(0, 2, 1, 3).reshape(b, s, heads * d)


def _mlp_gelu(m, w, x):
    return _linear(w, "fc2", F.gelu(_linear(w, "fc1", x)))


def _attention(m, w, q, k, v):
    return _attention_core(q, k, v)


def _conv_bn_relu(m, w, x):
    return _conv_bn_act(w, "block", m.block, x)


def _resnet18(m, w, x):
    x = _conv_bn_act(w, "stem", m.stem, x)
    x = F.max_pool2d(x, 3, 2, 1)
    for i, blk in enumerate(m.blocks):
        p = f"blocks.{i}"
        identity = _conv_bn_act(w, f"{p}.downsample", blk.downsample, x) if blk.downsample else x
        y = _conv_bn_act(w, f"{p}.conv2", blk.conv2, _conv_bn_act(w, f"{p}.conv1", blk.conv1, x))
        x = F.relu(y + identity)
    x = F.adaptive_avg_pool2d(x, (1, 1))
    return _linear(w, "fc", x.reshape(x.shape[0], x.shape[1]))


def _mobilenetv2(m, w, x):
    x = _conv_bn_act(w, "stem", m.stem, x)
    for i, blk in enumerate(m.blocks):
        p = f"blocks.{i}"
        y = _conv_bn_act(w, f"{p}.expand", blk.expand, x) if blk.expand is not None else x
        y = _conv_bn_act(w, f"{p}.project", blk.project, _conv_bn_act(w, f"{p}.dw", blk.dw, y))
        x = x + y if blk.use_res else y
    x = F.adaptive_avg_pool2d(_conv_bn_act(w, "head", m.head, x), (1, 1))
    return _linear(w, "fc", x.reshape(x.shape[0], x.shape[1]))


def _bert_layer(m, w, x):
    heads = m.attention.heads
    q, k, v = (
        _split_heads(_linear(w, f"attention.{n}", x), heads) for n in ("query", "key", "value")
    )
    attn = _linear(w, "attention.out", _merge_heads(_attention_core(q, k, v)))
    h = _layer_norm(w, "attn_ln", attn + x, m.attn_ln.eps)
    y = _linear(w, "output", F.gelu(_linear(w, "intermediate", h)))
    return _layer_norm(w, "out_ln", y + h, m.out_ln.eps)


def _gpt2_block(m, w, x):
    q, k, v = _linear(w, "c_attn", _layer_norm(w, "ln_1", x, m.ln_1.eps)).chunk(3, dim=-1)
    ctx = _attention_core(*(_split_heads(t, m.heads) for t in (q, k, v)), w["causal_mask"])
    x = x + _linear(w, "c_proj", _merge_heads(ctx))
    h = F.gelu(_linear(w, "c_fc", _layer_norm(w, "ln_2", x, m.ln_2.eps)), approximate="tanh")
    return x + _linear(w, "mlp_proj", h)


def _layernorm_mlp(m, w, x):
    return x + _linear(w, "fc2", F.gelu(_linear(w, "fc1", _layer_norm(w, "ln", x, m.ln.eps))))


def _rmsnorm(m, w, x):
    inv = torch.rsqrt(torch.mean(torch.square(x), dim=-1, keepdim=True) + m.eps)
    return x * inv * w["weight"]


def _elementwise_chain(m, w, x):
    y = torch.sigmoid(x)
    y = torch.log(y + 0.5) * 1.5 + x
    y = torch.exp(torch.tanh(y)) * w["scale"]
    y = torch.abs(-(torch.sqrt(y) - 1.0))
    y = torch.tanh(torch.sigmoid(y) * x) + w["shift"]
    y = torch.cos(torch.square(y)) / 2.0
    return torch.relu(y - 0.1)


def _decode_attention(m, w, q, k, v, cache_k, cache_v, mask):
    half = m.d // 2

    def rotate(x):
        return x * w["cos"] + torch.cat([-x[..., half:], x[..., :half]], dim=3) * w["sin"]

    def repeat(x):
        b, heads, n, d = x.shape
        return x.unsqueeze(2).expand(b, heads, m.group, n, d).reshape(b, heads * m.group, n, d)

    keys = repeat(torch.cat([cache_k, rotate(k)], dim=2))
    values = repeat(torch.cat([cache_v, v], dim=2))
    scores = rotate(q) @ keys.transpose(2, 3) * (1 / math.sqrt(m.d)) + mask
    return torch.softmax(scores, dim=-1) @ values


# One twin per zoo model, found by name: a model added to the zoo without a twin fails here.
_MODELS: dict[str, Callable] = {name: globals()[f"_{name}"] for name in models.zoo.names()}


def names() -> list[str]:
    """Zoo models that have a PyTorch twin here (all of them)."""
    return list(_MODELS)


def load(name: str, small: bool = False) -> tuple[Callable[[], torch.Tensor], list[np.ndarray]]:
    """A no-argument callable running the model eagerly on the zoo's inputs, and the inputs."""
    module, weights, inputs = models.zoo.build(name, small)
    w = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()}
    args = [torch.from_numpy(np.ascontiguousarray(v)) for v in inputs.values()]
    fn = _MODELS[name]
    return (lambda: fn(module, w, *args)), list(inputs.values())
