"""The algebra of folding: a convolution plus a per-channel affine map as one record, two
of them on one input summed into one kernel, and the record written back as Relax calls."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from tvm import relax

__all__ = ["CONVS", "Affine", "describe", "merge", "steps"]

# per image rank: the convolution op, its data and kernel layouts (NC + image axes only)
CONVS = {1: ("relax.nn.conv1d", "NCW", "OIW", relax.op.nn.conv1d),
          2: ("relax.nn.conv2d", "NCHW", "OIHW", relax.op.nn.conv2d),
          3: ("relax.nn.conv3d", "NCDHW", "OIDHW", relax.op.nn.conv3d)}


@dataclass(frozen=True)
class Affine:
    """``y = conv(x, weight) + bias`` per output channel (a 1-, 2- or 3-d convolution), or with
    ``weight`` None the identity ``y = x * scale + bias``. ``parts`` names the ops folded in
    since the last sum, ``branches`` the summed branches before it (each its ops, joined);
    ``taps`` counts the kernel taps of the branches summed so far (an identity as one)."""

    x: relax.Expr
    dtype: str
    rank: int  # of the tensors: 3, 4 or 5 (N, C and one to three image axes)
    channels: int  # output channels
    weight: np.ndarray | None = None  # O, I / groups, kernel..., float64
    scale: np.ndarray | None = None  # identity form only
    bias: np.ndarray | None = None
    strides: tuple[int, ...] = ()  # one per image axis
    padding: tuple[int, ...] = ()  # the low sides, then the high sides (relax's order)
    dilation: tuple[int, ...] = ()
    groups: int = 1
    parts: tuple[str, ...] = ()
    branches: tuple[str, ...] = ()
    sources: tuple[relax.Var, ...] = ()  # bindings whose forms this one absorbed
    name: str = "folded"  # the first convolution's binding: the folded one is named after it
    taps: int = 1

    @property
    def folded(self) -> bool:
        """Does emitting this form remove work: a batch norm (four elementwise ops once
        legalized, a square root among them), a summed branch, or more channel-wise ops than
        the one convolution, multiply and add it becomes? A form already folded is not."""
        emitted = sum((self.weight is not None, self.scale is not None, self.bias is not None))
        return bool(self.branches) or "batch_norm" in self.parts or len(self.parts) > emitted

    def representable(self) -> bool:
        """Are the folded constants finite in the model's dtype? A float16 weight times a
        large batch-norm scale can overflow where the unfolded program, which scales the
        convolution's output instead, does not."""
        arrays = (a for a in (self.weight, self.scale, self.bias) if a is not None)
        return all(np.isfinite(a.astype(self.dtype)).all() for a in arrays)

    def summed(self, other: Affine, **fields) -> Affine:
        """``self + other`` with ``fields`` of the merged kernel, their histories joined."""
        def history(f: Affine) -> tuple[str, ...]:
            head = f.branches
            if f.parts or not head:
                head += (" + ".join(f.parts) or "identity",)
            return head
        return replace(self, parts=(), branches=history(self) + history(other),
                       sources=self.sources + other.sources, taps=self.taps + other.taps,
                       **fields)

    def times(self, vec: np.ndarray, part: str) -> Affine:
        """This form, then a multiply by ``vec`` per output channel (``part`` names it)."""
        if self.weight is not None:
            weight, scale = self.weight * vec.reshape((-1,) + (1,) * (self.weight.ndim - 1)), None
        else:
            weight, scale = None, self._scale() * vec
        bias = None if self.bias is None else self.bias * vec
        return replace(self, weight=weight, scale=scale, bias=bias, parts=self.parts + (part,))

    def plus(self, vec: np.ndarray, part: str | None) -> Affine:
        """This form, then an add of ``vec`` per output channel."""
        bias = vec if self.bias is None else self.bias + vec
        return replace(self, bias=bias, parts=self.parts + ((part,) if part else ()))

    def _scale(self) -> np.ndarray:
        return np.ones(self.channels) if self.scale is None else self.scale

    def as_conv(self, like: Affine) -> Affine | None:
        """The identity as a one-tap convolution shaped like ``like`` (None: it cannot be)."""
        if self.weight is not None:
            return self
        if self.channels != like.channels or any(s != 1 for s in like.strides):
            return None
        axes = len(like.strides)
        per_group = self.channels // like.groups
        weight = np.zeros((self.channels, per_group) + (1,) * axes)
        channel = np.arange(self.channels)
        weight[(channel, channel % per_group) + (0,) * axes] = self._scale()
        return replace(self, weight=weight, scale=None, groups=like.groups, strides=like.strides,
                       padding=(0,) * 2 * axes, dilation=like.dilation, name=like.name)


def merge(a: Affine, b: Affine, out_image: tuple[int, ...], in_image: tuple[int, ...]
          ) -> Affine | None:
    """``a + b`` as one convolution of their common input, or None where no kernel is both.

    Tap ``j`` of a kernel with low padding ``p`` reads input ``o * s - p + j * d`` for output
    ``o``; the merged kernel takes the larger low padding, so ``f``'s taps shift by
    ``(p_merged - p_f) / d``, and its high padding keeps ``a``'s output extent. Branches whose
    merged kernel would have more taps than theirs together (3x1 + 1x3 -> 3x3) stay apart:
    the merge saves a pass over the output, not the arithmetic of the taps it adds."""
    if a.weight is None and b.weight is None:
        return a.summed(b, scale=a._scale() + b._scale(), bias=_sum(a.bias, b.bias))
    a, b = a.as_conv(b), b.as_conv(a)
    if a is None or b is None:
        return None
    if (a.strides, a.dilation, a.groups) != (b.strides, b.dilation, b.groups):
        return None
    if a.weight.shape[:2] != b.weight.shape[:2] or a.weight.ndim != b.weight.ndim:
        return None
    axes = len(a.strides)
    low, high, kernel = [], [], []
    shift = {id(a): [], id(b): []}
    for axis in range(axes):
        lo = max(a.padding[axis], b.padding[axis])
        dil = a.dilation[axis]
        for f in (a, b):
            gap = lo - f.padding[axis]
            if gap % dil:
                return None
            shift[id(f)].append(gap // dil)
        taps = max(shift[id(f)][axis] + f.weight.shape[2 + axis] for f in (a, b))
        extra = taps - shift[id(a)][axis] - a.weight.shape[2 + axis]
        hi = a.padding[axes + axis] + extra * dil
        span = in_image[axis] + lo + hi - dil * (taps - 1) - 1
        if span < 0 or span // a.strides[axis] + 1 != out_image[axis]:
            return None
        low.append(lo)
        high.append(hi)
        kernel.append(taps)
    if int(np.prod(kernel)) > a.taps + b.taps:
        return None
    weight = np.zeros(a.weight.shape[:2] + tuple(kernel))
    for f in (a, b):
        window = tuple(slice(k0, k0 + k) for k0, k in zip(shift[id(f)], f.weight.shape[2:]))
        weight[(slice(None), slice(None)) + window] += f.weight
    return a.summed(b, weight=weight, bias=_sum(a.bias, b.bias), padding=tuple(low + high))


def _sum(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return b
    return a if b is None else a + b


def describe(form: Affine) -> str:
    """``2 branches summed (conv2d 3x3 + batch_norm; conv2d 1x1 + batch_norm) -> conv2d 3x3
    + bias``; ``conv2d 3x3 + batch_norm -> conv2d 3x3 + bias``."""
    what = " + ".join(form.parts)
    if form.branches:
        summed = f"{len(form.branches)} branches summed ({'; '.join(form.branches)})"
        what = f"{summed} + {what}" if what else summed
    if form.weight is None:
        return f"{what} -> multiply-add"
    kernel = "x".join(str(k) for k in form.weight.shape[2:])
    conv = f"conv{form.weight.ndim - 2}d {kernel}"
    return f"{what} -> {conv}" + (" + bias" if form.bias is not None else "")


def steps(form: Affine) -> list:
    """The folded form as Relax calls on its input, in order: one convolution plus a bias, or
    one multiply-add."""
    dtype = form.dtype
    channel = (1, form.channels) + (1,) * (form.rank - 2)
    calls = []
    if form.weight is not None:
        weight = relax.const(form.weight.astype(dtype))
        make = CONVS[form.rank - 2][3]
        calls.append(lambda y: make(
            y, weight, strides=form.strides, padding=form.padding, dilation=form.dilation,
            groups=form.groups, out_dtype=dtype))
    elif form.scale is not None and not np.all(form.scale == 1.0):
        scale = relax.const(form.scale.reshape(channel).astype(dtype))
        calls.append(lambda y: relax.op.multiply(y, scale))
    if form.bias is not None:
        bias = relax.const(form.bias.reshape(channel).astype(dtype))
        calls.append(lambda y: relax.op.add(y, bias))
    return calls

