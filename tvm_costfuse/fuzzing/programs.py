"""Random small Relax programs over the operator vocabulary of the corpus, with adversarial
extents (1, primes, odd image sizes, K = 1, 1x1 and depthwise kernels, broadcast-to-1), and
the pairs only CostFuse fuses (a 1x1 conv feeding a depthwise conv).

Each program is built from one draw source (:class:`Draws`): a seeded ``random.Random`` for the
long script, hypothesis' ``data.draw`` in the test suite, so a failure there shrinks. Weights are
constants (as in imported models, so the compile-time packing paths run); values stay O(1)
(weights scaled by ``1/sqrt(fan_in)``, no unbounded ``exp``), so a relative error of the output
measures the kernel, not overflow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

# Extents that break tilings: unit, primes, odd sizes next to powers of two.
CHANNELS = (1, 2, 3, 4, 5, 8, 13, 16)
IMAGE = (1, 2, 3, 5, 7, 8, 9, 14)
ROWS = (1, 2, 3, 7, 8, 16, 17)
FEATURES = (1, 3, 5, 8, 16, 17, 33)


class Draws:
    """Where a program's choices come from: ``int(lo, hi)`` inclusive, ``pick(options)``."""

    def __init__(self, int_fn: Callable[[int, int], int]):
        self.int = int_fn

    def pick(self, options: Sequence):
        return options[self.int(0, len(options) - 1)]

    def coin(self, one_in: int = 2) -> bool:
        return self.int(0, one_in - 1) == 0

    @classmethod
    def seeded(cls, seed: int) -> Draws:
        import random

        rng = random.Random(seed)
        return cls(rng.randint)

    @classmethod
    def hypothesis(cls, data) -> Draws:
        from hypothesis import strategies as st

        return cls(lambda lo, hi: data.draw(st.integers(lo, hi)))


@dataclass
class Program:
    """A Relax module, its example inputs and the ops drawn (for a failure's message)."""

    mod: tvm.IRModule
    inputs: dict[str, np.ndarray]
    ops: list[str] = field(default_factory=list)

    def describe(self) -> str:
        shapes = {k: v.shape for k, v in self.inputs.items()}
        return f"inputs {shapes}, ops {' -> '.join(self.ops)}"


class _Builder:
    """Emits ops onto a pool of live tensors; each emitter returns False where it cannot apply."""

    def __init__(self, draws: Draws, bb: relax.BlockBuilder, seed: int):
        self.d, self.bb = draws, bb
        self.rng = np.random.default_rng(seed)
        self.pool: list[relax.Expr] = []
        self.used: set[int] = set()
        self.ops: list[str] = []

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def shape(x) -> tuple[int, ...]:
        return tuple(int(s) for s in x.ty.shape.values)

    def const(self, shape, scale=1.0):
        return relax.const((self.rng.standard_normal(shape) * scale).astype("float32"))

    def take(self, rank: int | None = None):
        cands = [i for i, x in enumerate(self.pool)
                 if rank is None or len(self.shape(x)) == rank]
        if not cands:
            return None, None
        i = self.d.pick(cands)
        return i, self.pool[i]

    def emit(self, name: str, expr) -> None:
        self.pool.append(self.bb.emit(expr))
        self.ops.append(name)

    # ------------------------------------------------------------------ emitters
    def conv(self) -> bool:
        i, x = self.take(4)
        if x is None:
            return False
        _n, c, h, w = self.shape(x)
        k = self.d.pick((1, 1, 3, 3, 5))
        stride = self.d.pick((1, 1, 2))
        pad = self.d.pick((0, k // 2))
        if h + 2 * pad < k or w + 2 * pad < k:
            return False
        kind = self.d.pick(("dense", "depthwise", "depthwise", "grouped"))
        if kind == "depthwise":
            groups, out = c, c * self.d.pick((1, 1, 2))
        elif kind == "grouped" and c % 2 == 0 and c > 2:
            groups = 2
            out = 2 * self.d.pick((1, 2, 4))
        else:
            groups, out = 1, self.d.pick(CHANNELS)
        wgt = self.const((out, c // groups, k, k), 1 / math.sqrt(c // groups * k * k))
        self.used.add(i)
        self.emit(f"conv{k}x{k}/s{stride}/p{pad}/g{groups}->{out}", relax.op.nn.conv2d(
            x, wgt, strides=stride, padding=pad, groups=groups))
        return True

    def expand_depthwise(self) -> bool:
        """An inverted residual block's first half, the pair ``schedules/chain.py`` fuses: a
        1x1 conv widening the channels, a bias and an activation, a depthwise conv."""
        i, x = self.take(4)
        if x is None:
            return False
        _n, c, h, w = self.shape(x)
        k, stride = self.d.pick((3, 3, 5)), self.d.pick((1, 2))
        pad = self.d.pick((k // 2, k // 2, 0))
        if h + 2 * pad < k or w + 2 * pad < k:
            return False
        wide = c * self.d.pick((1, 2, 3, 6))
        op = relax.op
        self.used.add(i)
        self.emit(f"conv1x1->{wide}", op.nn.conv2d(x, self.const((wide, c, 1, 1),
                                                                   1 / math.sqrt(c))))
        act = self.d.pick(("relu6", "silu", "none"))
        e = op.add(self.pool[-1], self.const((1, wide, 1, 1)))
        if act == "relu6":
            e = op.clip(e, 0.0, 6.0)
        elif act == "silu":
            e = op.multiply(e, op.sigmoid(e))
        self.used.add(len(self.pool) - 1)
        self.emit(f"bias+{act}", e)
        self.used.add(len(self.pool) - 1)
        self.emit(f"dw{k}x{k}/s{stride}/p{pad}", op.nn.conv2d(
            self.pool[-1], self.const((wide, 1, k, k), 1 / k), strides=stride, padding=pad,
            groups=wide))
        return True

    def channel_affine(self) -> bool:  # an inference batch norm, as DecomposeOps leaves it
        i, x = self.take(4)
        if x is None:
            return False
        c = self.shape(x)[1]
        self.used.add(i)
        self.emit("bn", relax.op.add(relax.op.multiply(x, self.const((1, c, 1, 1))),
                                     self.const((1, c, 1, 1))))
        return True

    def unary(self) -> bool:
        i, x = self.take()
        if x is None:
            return False
        name = self.d.pick(("relu", "sigmoid", "tanh", "gelu", "silu", "relu6", "sqrt",
                            "rsqrt", "exp_tanh", "erf"))
        op = relax.op
        fns = {"relu": op.nn.relu, "sigmoid": op.sigmoid, "tanh": op.tanh, "gelu": op.nn.gelu,
               "silu": op.nn.silu, "relu6": lambda v: op.clip(v, 0.0, 6.0),
               "sqrt": lambda v: op.sqrt(op.add(op.multiply(v, v), relax.const(1.0))),
               "rsqrt": lambda v: op.rsqrt(op.add(op.multiply(v, v), relax.const(1.0))),
               "exp_tanh": lambda v: op.exp(op.tanh(v)), "erf": op.erf}
        self.used.add(i)
        self.emit(name, fns[name](x))
        return True

    def binary(self) -> bool:
        i, x = self.take()
        if x is None:
            return False
        shape = self.shape(x)
        same = [j for j, y in enumerate(self.pool) if j != i and self.shape(y) == shape]
        name = self.d.pick(("add", "multiply", "subtract", "divide"))
        if same and self.d.coin():
            j = self.d.pick(same)
            other = self.pool[j]
            self.used.add(j)
        else:  # broadcast a constant: per channel, per last axis, or to a single element
            form = self.d.pick(("unit", "last", "second"))
            bshape = [1] * len(shape)
            if form == "last":
                bshape[-1] = shape[-1]
            elif form == "second" and len(shape) > 1:
                bshape[1] = shape[1]
            other = self.const(tuple(bshape))
        if name == "divide":
            other = relax.op.add(relax.op.abs(other), relax.const(1.0))
        self.used.add(i)
        self.emit(f"{name}", getattr(relax.op, name)(x, other))
        return True

    def reduce(self) -> bool:
        i, x = self.take()
        if x is None:
            return False
        rank = len(self.shape(x))
        axes = self.d.pick([[rank - 1], list(range(1, rank)) or [0], [max(rank - 2, 0)]]
                           if rank > 1 else [[0]])
        if rank == 4 and self.d.coin():
            axes = [2, 3]  # squeeze-excite's mean over the image
        name = self.d.pick(("sum", "mean", "max"))
        keep = self.d.coin(3) or rank == 1 or len(axes) == rank
        self.used.add(i)
        self.emit(f"{name}{axes}", getattr(relax.op, name)(x, axes, keepdims=keep))
        return True

    def normalize(self) -> bool:
        i, x = self.take()
        if x is None or len(self.shape(x)) < 2:
            return False
        shape = self.shape(x)
        self.used.add(i)
        # A layer norm over a unit axis is degenerate: x - mean is 0 in exact arithmetic and
        # the output is beta, but a fused kernel that recomputes x with another rounding (an
        # inlined average pool) leaves an ulp there, which the 1/sqrt(eps) scale amplifies
        # 316x (seed 20852: 1.3e-4 of the output, FuseOps' grouping 8e-8). That is the
        # program's conditioning, not a kernel's error: such axes get a softmax.
        if self.d.coin() or shape[-1] == 1:
            self.emit("softmax", relax.op.nn.softmax(x, axis=self.d.pick((-1, 1))))
        else:
            d = shape[-1]
            self.emit("layer_norm", relax.op.nn.layer_norm(
                x, self.const((d,)), self.const((d,)), axes=[-1]))
        return True

    def pool2d(self) -> bool:
        i, x = self.take(4)
        if x is None:
            return False
        _, _, h, w = self.shape(x)
        self.used.add(i)
        kind = self.d.pick(("max", "avg", "adaptive"))
        if kind == "adaptive" or min(h, w) < 2:
            self.emit("global_avg_pool", relax.op.nn.adaptive_avg_pool2d(x, (1, 1)))
        else:
            fn = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
            self.emit(f"{kind}_pool", fn(x, pool_size=2, strides=self.d.pick((1, 2))))
        return True

    def flatten(self) -> bool:
        i, x = self.take(4)
        if x is None:
            return False
        n, c, h, w = self.shape(x)
        self.used.add(i)
        self.emit("flatten", relax.op.reshape(x, (n, c * h * w)))
        return True

    def linear(self) -> bool:
        i, x = self.take(self.d.pick((2, 3)))
        if x is None:
            return False
        k = self.shape(x)[-1]
        out = self.d.pick(FEATURES)
        self.used.add(i)
        y = relax.op.matmul(x, self.const((k, out), 1 / math.sqrt(k)))
        if self.d.coin():
            y = relax.op.add(y, self.const((out,)))
        self.emit(f"linear->{out}", y)
        return True

    def transpose(self) -> bool:
        i, x = self.take()
        if x is None or len(self.shape(x)) < 2:
            return False
        rank = len(self.shape(x))
        axes = list(range(rank))
        axes[-1], axes[-2] = axes[-2], axes[-1]
        self.used.add(i)
        self.emit("transpose", relax.op.permute_dims(x, axes))
        return True

    def concat(self) -> bool:
        i, x = self.take(4)
        if x is None:
            return False
        n, _, h, w = self.shape(x)
        others = [j for j, y in enumerate(self.pool) if j != i and len(self.shape(y)) == 4
                  and self.shape(y)[0] == n and self.shape(y)[2:] == (h, w)]
        if not others:
            return False
        j = self.d.pick(others)
        self.used.update((i, j))
        self.emit("concat", relax.op.concat([x, self.pool[j]], axis=1))
        return True

    def attention(self) -> bool:
        """Scores, scale, softmax and P V over a (batch, rows, features) activation; the keys
        and values may lead with ``extra`` constant rows (a memory the queries attend to as
        well), so that key rows reach past two vectors of 8 or 16 lanes with a ragged tail
        (``schedules/ragged.py``), which the activations' own rows never do."""
        i, x = self.take(3)
        if x is None:
            return False
        b, _s, d = self.shape(x)
        extra = self.d.pick((0, 0, 16, 31, 32))
        op = relax.op
        q, k, v = (op.matmul(x, self.const((d, d), 1 / math.sqrt(d))) for _ in range(3))
        if extra:
            k, v = (op.concat([self.const((b, extra, d), 1.0), t], axis=1) for t in (k, v))
        scores = op.multiply(op.matmul(q, op.permute_dims(k, [0, 2, 1])),
                             relax.const(1 / math.sqrt(d)))
        self.used.add(i)
        self.emit("attention", op.matmul(op.nn.softmax(scores, axis=-1), v))
        return True

    def decode_attention(self) -> bool:
        """A decode step's attention: the last row's query against keys and values that are a
        constant cache of ``past`` rows with the last row's own concatenated (one query row,
        the cache's copies inside the kernel: ``schedules/attention_decode.py``)."""
        i, x = self.take(3)
        if x is None:
            return False
        b, s, d = self.shape(x)
        past = self.d.pick((1, 2, 7, 15, 16, 33))
        op = relax.op
        last = op.strided_slice(x, [1], [s - 1], [s])
        q, k, v = (op.matmul(last, self.const((d, d), 1 / math.sqrt(d))) for _ in range(3))
        keys, values = (op.concat([self.const((b, past, d), 1.0), t], axis=1) for t in (k, v))
        scores = op.multiply(op.matmul(q, op.permute_dims(keys, [0, 2, 1])),
                             relax.const(1 / math.sqrt(d)))
        self.used.add(i)
        self.emit("decode_attention", op.matmul(op.nn.softmax(scores, axis=-1), values))
        return True

    EMITTERS = ("conv", "conv", "expand_depthwise", "channel_affine", "unary", "unary",
                "binary", "binary", "reduce", "normalize", "pool2d", "flatten", "linear", "transpose", "concat",
                "attention", "decode_attention")


def draw_program(draws: Draws, max_ops: int = 10) -> Program:
    """A random Relax program of 1..``max_ops`` drawn ops; every unread tensor is an output."""
    bb = relax.BlockBuilder()
    form = draws.pick(("image", "image", "sequence"))
    if form == "image":
        shape = (draws.pick((1, 1, 2)), draws.pick(CHANNELS), draws.pick(IMAGE),
                 draws.pick(IMAGE))
    else:
        shape = (draws.pick((1, 2)), draws.pick(ROWS), draws.pick(FEATURES))
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    seed = draws.int(0, 2**31 - 1)
    with bb.function("main", [x]):
        with bb.dataflow():
            b = _Builder(draws, bb, seed)
            b.pool.append(x)
            b.used.add(0)  # the input is no output even when nothing reads it
            for _ in range(draws.int(1, max_ops)):
                for _attempt in range(4):
                    if getattr(b, draws.pick(_Builder.EMITTERS))():
                        break
            if len(b.pool) == 1:
                b.unary()
            outs = [t for j, t in enumerate(b.pool) if j not in b.used] or [b.pool[-1]]
            out = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        bb.emit_func_output(out)
    inputs = {"x": np.random.default_rng(seed).standard_normal(shape).astype("float32")}
    return Program(bb.get(), inputs, b.ops)
