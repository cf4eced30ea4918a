"""Random Relax programs: unseen test programs for the cost models, beyond the zoo.

Why: leave-one-architecture-out over the ten zoo models showed that what XGBoost learns from
nine architectures' kernels does not carry to the tenth better than the analytical terms do
(docs/log/2026-11-29b.md). Ten architectures are few examples of "a model". Random programs
built from the zoo's op vocabulary -- linear layers with prologues and epilogues, norms spelled
out and as single ops, softmax whole and in pieces, attention heads, transposes, elementwise
math, per-channel affines, conv + batch norm + activation (dense and depthwise), residual
fan-in -- at random sizes test both models on programs no zoo architecture resembles. They
were meant as extra training data, but training on them made held-out decisions worse, so
``cost.learned.train`` leaves them out by default and the evaluation scores on them instead.

A program is named ``synth-<seed>``; :func:`tvm_costfuse.models.load` resolves such names (same
seed, same program and weights), so measurement, ``refeature`` and the planner take them like
any zoo model. Shapes are drawn per program (from tiny to BERT-base sized); ``small`` does not
apply.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from .blocks import ConvBNAct, RMSNormExplicit, attention_core, emit, merge_heads, split_heads
from .export import Spec, export

__all__ = ["PREFIX", "is_synthetic", "program", "seed_of"]

PREFIX = "synth-"
_F32 = "float32"
_UNARY_SEQ = ("gelu", "relu", "silu", "tanh", "sigmoid")
_UNARY_CONV = ("relu", "relu6", "silu", "sigmoid")


def is_synthetic(name: str) -> bool:
    return name.startswith(PREFIX)


def seed_of(name: str) -> int:
    tail = name[len(PREFIX):] if is_synthetic(name) else ""
    if not tail.isdigit():
        raise ValueError(f"not a synthetic program name: {name!r} (expected {PREFIX}<seed>)")
    return int(tail)


def _unary(x: nn.Tensor, kind: str) -> nn.Tensor:
    return getattr(nn.op, kind)(x)


class _Affine(nn.Module):
    """x * scale or x + shift with a constant broadcast over the last (seq) or channel axis."""

    def __init__(self, shape: tuple[int, ...], kind: str) -> None:
        self.kind = kind
        self.value = nn.Parameter(shape, _F32)

    def init_param(self, attr: str, shape, rng: np.random.Generator):
        if self.kind == "scale":
            return rng.uniform(0.5, 1.5, shape)
        return 0.1 * rng.standard_normal(shape)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return x * self.value if self.kind == "scale" else x + self.value


class _SoftmaxExplicit(nn.Module):
    """softmax spelled out: max, subtract, exp, sum, divide (two reductions, three epilogues)."""

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        m = emit(relax.op.max(x._expr, axis=-1, keepdims=True), "rowmax")
        e = nn.op.exp(x - m)
        s = emit(relax.op.sum(e._expr, axis=-1, keepdims=True), "rowsum")
        return e / s


class _Heads(nn.Module):
    """Self-attention over heads of x (no projections): reshape/transpose prologues, two
    batched matmuls, softmax."""

    def __init__(self, heads: int) -> None:
        self.heads = heads

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        h = split_heads(x, self.heads)
        return merge_heads(attention_core(h, h, h))


class _Program(nn.Module):
    """Interprets a list of steps over one running tensor; ``("residual", k)`` adds the
    tensor produced k steps ago (same shape), which gives the graph fan-in."""

    def __init__(self, steps: list[tuple], layers: list[nn.Module | None]) -> None:
        self.steps = steps
        self._slot: list[int | None] = []  # step -> index into self.layers, or None
        modules = []
        for m in layers:
            self._slot.append(None if m is None else len(modules))
            if m is not None:
                modules.append(m)
        self.layers = nn.ModuleList(modules)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        history = [x]
        for i, step in enumerate(self.steps):
            kind = step[0]
            if self._slot[i] is not None:
                x = self.layers[self._slot[i]](x)
            elif kind == "unary":
                x = _unary(x, step[1])
            elif kind == "residual":
                x = x + history[-1 - step[1]]
            elif kind == "softmax":
                x = nn.op.softmax(x, axis=-1)
            elif kind == "transpose":
                x = nn.op.permute_dims(x, [0, 2, 1])
            else:
                raise AssertionError(f"unknown step {step}")
            history.append(x)
        return x


def _seq_steps(rng: np.random.Generator) -> tuple[list[tuple], list, tuple[int, ...]]:
    """Steps over (1, S, H) tensors."""

    seq = int(rng.choice([16, 32, 64, 128, 256]))
    hidden = int(rng.choice([32, 64, 128, 256, 512, 768]))
    shape = (1, seq, hidden)
    shapes, steps, layers = [shape], [], []
    for _ in range(int(rng.integers(6, 12))):
        s, h = shape[1], shape[2]
        # Linear layers weighted up: contractions with prologues and epilogues are where the
        # fusion decisions with the most at stake are.
        kinds = ["linear", "linear", "linear", "unary", "unary", "affine", "residual",
                 "rmsnorm", "layernorm", "softmax", "softmax_explicit", "heads", "transpose"]
        kind = str(rng.choice(kinds))
        layer = None
        if kind == "linear":
            out = int(np.clip(h * rng.choice([0.5, 1, 1, 2, 4]), 16, 3072))
            layer, step = nn.Linear(h, out, bias=bool(rng.random() < 0.7)), ("linear", out)
            shape = (1, s, out)
        elif kind == "unary":
            step = ("unary", str(rng.choice(_UNARY_SEQ)))
        elif kind == "affine":
            which = str(rng.choice(["scale", "shift"]))
            layer, step = _Affine((h,), which), ("affine", which)
        elif kind == "residual":
            back = [k for k in range(1, len(shapes)) if shapes[-1 - k] == shape]
            if not back:
                continue
            step = ("residual", int(rng.choice(back)))
        elif kind == "rmsnorm":
            layer, step = RMSNormExplicit(h), ("rmsnorm",)
        elif kind == "layernorm":
            layer, step = nn.LayerNorm(h), ("layernorm",)
        elif kind in ("softmax", "transpose"):
            step = (kind,)
            if kind == "transpose":
                shape = (1, h, s)
        elif kind == "softmax_explicit":
            layer, step = _SoftmaxExplicit(), ("softmax_explicit",)
        else:  # heads
            heads = [n for n in (2, 4, 8, 12) if h % n == 0 and h // n >= 8]
            if not heads:
                continue
            n = int(rng.choice(heads))
            layer, step = _Heads(n), ("heads", n)
        steps.append(step)
        layers.append(layer)
        shapes.append(shape)
    return steps, layers, (1, seq, hidden)


def _conv_steps(rng: np.random.Generator) -> tuple[list[tuple], list, tuple[int, ...]]:
    """Steps over (1, C, W, W) tensors."""

    channels = int(rng.choice([8, 16, 32, 64]))
    width = int(rng.choice([8, 14, 28, 56]))
    shape = (1, channels, width, width)
    shapes, steps, layers = [shape], [], []
    for _ in range(int(rng.integers(6, 12))):
        c, w = shape[1], shape[2]
        kind = str(rng.choice(["conv", "conv", "depthwise", "unary", "affine", "residual"]))
        layer = None
        if kind in ("conv", "depthwise"):
            act = rng.choice(["relu", "relu6", None])
            act = None if act is None else str(act)
            stride = 2 if (w >= 16 and rng.random() < 0.25) else 1
            if kind == "conv":
                out, k = int(min(128, c * rng.choice([1, 1, 2]))), int(rng.choice([1, 3]))
                layer = ConvBNAct(c, out, k, stride, act=act)
            else:
                out, k = c, 3
                layer = ConvBNAct(c, c, 3, stride, groups=c, act=act)
            step = (kind, out, k, stride, act)
            shape = (1, out, (w + stride - 1) // stride, (w + stride - 1) // stride)
        elif kind == "unary":
            step = ("unary", str(rng.choice(_UNARY_CONV)))
        elif kind == "affine":
            which = str(rng.choice(["scale", "shift"]))
            layer, step = _Affine((c, 1, 1), which), ("affine", which)
        else:  # residual
            back = [k for k in range(1, len(shapes)) if shapes[-1 - k] == shape]
            if not back:
                continue
            step = ("residual", int(rng.choice(back)))
        steps.append(step)
        layers.append(layer)
        shapes.append(shape)
    return steps, layers, (1, channels, width, width)


def program(name: str) -> tuple[nn.Module, dict[str, tuple[int, ...]]]:
    """(nn module, {input name: shape}) of the program ``synth-<seed>``; even seeds are
    sequence programs (transformer-like ops), odd seeds convolution programs."""
    seed = seed_of(name)
    rng = np.random.default_rng(seed)
    steps, layers, shape = (_seq_steps if seed % 2 == 0 else _conv_steps)(rng)
    return _Program(steps, layers), {"x": shape}


def load(name: str) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """The program ``synth-<seed>`` as (IRModule, {input name: array}), like the zoo's."""
    return export(name, Spec(*program(name)))
