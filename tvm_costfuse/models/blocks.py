"""Building blocks that ``relax.frontend.nn`` lacks, shared by the zoo and the synthetic programs.

Batch norm in inference form, conv + BN + activation, attention heads and an explicit RMSNorm:
written with raw Relax ops where ``nn.op`` has no wrapper, so each is the op sequence a
frontend would emit.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.relax.frontend import nn

F32 = "float32"
_F32 = F32


def emit(expr: relax.Expr, name: str) -> nn.Tensor:
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
        return emit(relax.TupleGetItem(tup, 0), "bn")


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


def split_heads(x: nn.Tensor, heads: int) -> nn.Tensor:
    """(1, S, H) -> (1, heads, S, H / heads)."""
    b, s, h = x.shape
    return nn.op.permute_dims(nn.op.reshape(x, (b, s, heads, h // heads)), [0, 2, 1, 3])


def merge_heads(x: nn.Tensor) -> nn.Tensor:
    """(1, heads, S, d) -> (1, S, heads * d)."""
    b, heads, s, d = x.shape
    return nn.op.reshape(nn.op.permute_dims(x, [0, 2, 1, 3]), (b, s, heads * d))


def attention_core(
    q: nn.Tensor, k: nn.Tensor, v: nn.Tensor, mask: nn.Tensor | None = None
) -> nn.Tensor:
    """softmax(Q K^T / sqrt(d) [masked]) V on (1, heads, S, d) tensors."""
    d = q.shape[-1]
    scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) / math.sqrt(d)
    if mask is not None:
        # GPT-2 style: keep scores where the causal mask is true, else a large negative value.
        neg = relax.const(-1e4, _F32)
        scores = emit(relax.op.where(mask._expr, scores._expr, neg), "causal_mask")
    return nn.op.matmul(nn.op.softmax(scores, axis=-1), v)


class SelfAttention(nn.Module):
    """Separate Q/K/V projections (BERT style) followed by the output projection."""

    def __init__(self, hidden: int, heads: int) -> None:
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        q = split_heads(self.query(x), self.heads)
        k = split_heads(self.key(x), self.heads)
        v = split_heads(self.value(x), self.heads)
        return self.out(merge_heads(attention_core(q, k, v)))



class RMSNormExplicit(nn.Module):
    """RMSNorm spelled out (square, mean, +eps, rsqrt, *x, *weight) so there is a reduction
    plus an elementwise epilogue to fuse, instead of the single ``R.nn.rms_norm`` op."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        self.eps = eps
        self.weight = nn.Parameter((hidden,), _F32)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        ms = emit(relax.op.mean(nn.op.square(x)._expr, axis=-1, keepdims=True), "mean")
        inv = emit(relax.op.rsqrt((ms + self.eps)._expr), "rsqrt")
        return x * inv * self.weight


class DecodeAttention(nn.Module):
    """One decode step's attention as a GQA decoder runs it (Llama, Qwen2): the new token's
    query and key rotated (``x cos + rotate_half(x) sin``), its key and value concatenated
    onto KV caches of ``past`` tokens, repeated over the ``group`` query heads sharing each KV
    head (``repeat_kv``: expand_dims, broadcast_to, reshape), the keys transposed, then
    ``softmax(q K^T / sqrt(d) + mask) V`` for the one query row. The caches are inputs, as a
    deployed step passes them; the mask is an additive one over the keys."""

    def __init__(self, kv_heads: int, group: int, past: int, d: int) -> None:
        self.kv_heads, self.group, self.keys, self.d = kv_heads, group, past + 1, d
        self.cos = nn.Parameter((1, 1, 1, d), _F32)
        self.sin = nn.Parameter((1, 1, 1, d), _F32)

    def init_param(self, attr: str, shape: tuple[int, ...], rng: np.random.Generator):
        """cos and sin of one position's rotary angles, not random."""
        angle = rng.random(shape) * math.pi
        return np.cos(angle) if attr == "cos" else np.sin(angle)

    def _rotate(self, x: nn.Tensor) -> nn.Tensor:
        half, op = self.d // 2, relax.op
        lo = emit(op.strided_slice(x._expr, [3], [0], [half]), "rot_lo")
        hi = emit(op.strided_slice(x._expr, [3], [half], [self.d]), "rot_hi")
        turned = nn.op.concat([nn.op.negative(hi), lo], dim=3)
        return x * self.cos + turned * self.sin

    def _repeat(self, x: nn.Tensor) -> nn.Tensor:
        shape = (1, self.kv_heads, self.group, self.keys, self.d)
        x = nn.op.broadcast_to(emit(relax.op.expand_dims(x._expr, 2), "expand"), shape)
        return nn.op.reshape(x, (1, self.kv_heads * self.group, self.keys, self.d))

    def forward(self, q: nn.Tensor, k: nn.Tensor, v: nn.Tensor, cache_k: nn.Tensor,
                cache_v: nn.Tensor, mask: nn.Tensor) -> nn.Tensor:
        keys = self._repeat(nn.op.concat([cache_k, self._rotate(k)], dim=2))
        values = self._repeat(nn.op.concat([cache_v, v], dim=2))
        scores = nn.op.matmul(self._rotate(q), nn.op.permute_dims(keys, [0, 1, 3, 2]))
        scores = scores * (1 / math.sqrt(self.d)) + mask
        return nn.op.matmul(nn.op.softmax(scores, axis=-1), values)
