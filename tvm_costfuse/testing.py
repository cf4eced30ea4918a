"""Test helpers: synthetic OpGraphs as plain data, so planner tests and timings need no TVM
build (the planner tests, the planning-speed benchmark and the greedy-vs-exact script share
them); the attention programs the attention kernel's tests and benchmark share."""

from __future__ import annotations

import random

from .graph import Node, OpGraph, OpPattern, TensorInfo

_KINDS = [
    # (pattern, flops per output element, reduction extent, name)
    (OpPattern.OUT_EWISE_FUSABLE, 2 * 256, 256, "matmul"),
    (OpPattern.BROADCAST, 1, 1, "add"),
    (OpPattern.ELEMWISE, 8, 1, "gelu"),
    (OpPattern.COMM_REDUCE, 1, 256, "sum"),
    (OpPattern.INJECTIVE, 0, 1, "transpose"),
]


def make_graph(nodes: list[Node]) -> OpGraph:
    consumers: dict[str, list[str]] = {}
    for n in nodes:
        for src in n.inputs:
            if not src.startswith("%"):
                consumers.setdefault(src, []).append(n.name)
    last = nodes[-1].name
    return OpGraph("main", tuple(nodes), {k: tuple(v) for k, v in consumers.items()},
                   frozenset([last]))


def op(index: int, name: str, pattern: OpPattern, inputs: list[str], elems: int = 4096,
       flops_per_elem: float = 1.0, reduction: int = 1, in_elems: list[int] | None = None) -> Node:
    sizes = [4 * e for e in (in_elems or [elems] * len(inputs))]
    return Node(name, index, "call_tir", name, pattern, tuple(inputs),
                (TensorInfo((elems,), "float32"),), tuple(sizes), flops_per_elem * elems,
                sum(sizes), 4 * elems, reduction)


def random_dag(n: int, seed: int = 0, fan_in: float = 0.3) -> OpGraph:
    """n ops; each reads its predecessor and, with probability ``fan_in``, an earlier op."""
    rng = random.Random(seed)
    nodes = [op(0, "op0", OpPattern.ELEMWISE, ["%x"])]
    for i in range(1, n):
        pattern, fpe, red, _base = _KINDS[rng.randrange(len(_KINDS))]
        inputs = [f"op{i - 1}"]
        if i > 2 and rng.random() < fan_in:
            inputs.append(f"op{rng.randrange(max(0, i - 20), i - 1)}")
        nodes.append(op(i, f"op{i}", pattern, inputs, flops_per_elem=fpe, reduction=red))
    return make_graph(nodes)


def branchy_dag(n: int, seed: int = 0) -> OpGraph:
    """n ops, each reading one or two random earlier ops (or the input), with sizes from 1K
    to 1M elements: diamonds, siblings and fan-in that a chain-like graph never shows."""
    rng = random.Random(seed * 1009 + n)
    nodes: list[Node] = []
    for i in range(n):
        pattern, fpe, red, _ = _KINDS[rng.randrange(len(_KINDS))]
        pool = ["%x"] + [f"op{j}" for j in range(i)]
        inputs = sorted(set(rng.sample(pool, k=min(len(pool), rng.choice((1, 2))))))
        elems = 1 << rng.randrange(10, 21)
        nodes.append(op(i, f"op{i}", pattern, inputs, elems=elems, flops_per_elem=fpe,
                        reduction=red))
    return make_graph(nodes)


def attention_program(b: int, h: int, s: int, d: int, form: str = "plain",
                      softmax_axis: int = -1, probs_out: bool = False,
                      rows: int | None = None):
    """``softmax(Q K^T / sqrt(d) [+ mask | causal where | + B^T]) V`` on (b, h, s, d) tensors,
    as the importers emit it (K^T a transpose feeding the scores), prepared for fusion; with
    its inputs. ``form="transposed_bias"`` adds a (b, h, keys, rows) input transposed, as
    DeBERTa adds its position-to-content scores. ``rows``: queries other than the keys;
    ``probs_out``: the probabilities returned too (``tests/test_attention.py``,
    ``scripts/bench_attention.py``)."""
    import math

    import numpy as np
    from tvm import relax

    from .pipelines import prepare

    F32 = "float32"
    bb = relax.BlockBuilder()
    rows = rows or s  # other than the keys: cross attention
    q = relax.Var("q", relax.TensorType((b, h, rows, d), F32))
    k, v = (relax.Var(n, relax.TensorType((b, h, s, d), F32)) for n in "kv")
    params = [q, k, v]
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal((b, h, rows if n == "q" else s, d)).astype(F32)
              for n in "qkv"}
    if form == "masked":  # BERT: an additive padding mask over the keys
        mask = relax.Var("mask", relax.TensorType((b, 1, 1, s), F32))
        params.append(mask)
        keep = np.arange(s) < s - s // 3
        inputs["mask"] = np.broadcast_to(np.where(keep, 0.0, -1e4), (b, 1, 1, s)).astype(F32)
    elif form == "transposed_bias":
        bias = relax.Var("bias", relax.TensorType((b, h, s, rows), F32))
        params.append(bias)
        inputs["bias"] = rng.standard_normal((b, h, s, rows)).astype(F32)
    with bb.function("main", params):
        with bb.dataflow():
            sc = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
            sc = bb.emit(relax.op.multiply(sc, relax.const(1 / math.sqrt(d), F32)))
            if form == "masked":
                sc = bb.emit(relax.op.add(sc, mask))
            elif form == "transposed_bias":
                sc = bb.emit(relax.op.add(sc, bb.emit(relax.op.permute_dims(bias,
                                                                            [0, 1, 3, 2]))))
            elif form == "causal":  # GPT-2: keep the lower triangle, else a large negative
                tri = relax.const(np.tril(np.ones((rows, s), bool))[None, None])
                sc = bb.emit(relax.op.where(tri, sc, relax.const(-1e4, F32)))
            p = bb.emit(relax.op.nn.softmax(sc, axis=softmax_axis))
            out = relax.op.matmul(p, v)
            out = bb.emit_output(relax.Tuple([bb.emit(out), p]) if probs_out else out)
        bb.emit_func_output(out)
    return prepare(bb.get()), inputs


def decode_attention_program(kv_heads: int, group: int, past: int, d: int,
                             rotary: bool = True, seed: int = 0):
    """One decode step's attention as the PyTorch importer emits a GQA decoder's (Llama,
    Qwen2): the new token's query and key rotated (``x cos + rotate_half(x) sin``), its key
    and value concatenated onto caches of ``past`` tokens, repeated over the ``group`` query
    heads that share each of the ``kv_heads`` (``repeat_kv``: expand_dims, broadcast_to,
    reshape), the keys transposed, ``softmax(q K^T / sqrt(d) + mask) V``; prepared for fusion,
    with its inputs (``tests/test_attention.py``)."""
    import math

    import numpy as np
    from tvm import relax

    from .pipelines import prepare

    F32, op = "float32", relax.op
    heads, keys = kv_heads * group, past + 1
    shapes = {"q": (1, heads, 1, d), "k": (1, kv_heads, 1, d), "v": (1, kv_heads, 1, d),
              "cache_k": (1, kv_heads, past, d), "cache_v": (1, kv_heads, past, d),
              "mask": (1, 1, 1, keys)}
    rng = np.random.default_rng(seed)
    inputs = {n: rng.standard_normal(s).astype(F32) for n, s in shapes.items()}
    inputs["mask"] = np.where(rng.random(shapes["mask"]) < 0.1, -1e4, 0.0).astype(F32)
    params = {n: relax.Var(n, relax.TensorType(s, F32)) for n, s in shapes.items()}
    angle = rng.random((1, 1, 1, d)) * math.pi
    cos, sin = (relax.const(f(angle).astype(F32)) for f in (np.cos, np.sin))
    bb = relax.BlockBuilder()

    def rotate(x):
        if not rotary:
            return x
        half = d // 2
        lo = bb.emit(op.strided_slice(x, [3], [0], [half]))
        hi = bb.emit(op.strided_slice(x, [3], [half], [d]))
        turned = bb.emit(op.concat([bb.emit(op.negative(hi)), lo], axis=3))
        return bb.emit(op.add(op.multiply(x, cos), bb.emit(op.multiply(turned, sin))))

    def repeat(x):
        if group == 1:
            return x
        x = bb.emit(op.broadcast_to(bb.emit(op.expand_dims(x, 2)),
                                    (1, kv_heads, group, keys, d)))
        return bb.emit(op.reshape(x, (1, heads, keys, d)))

    with bb.function("main", list(params.values())):
        with bb.dataflow():
            p = params
            q = rotate(p["q"])
            k = repeat(bb.emit(op.concat([p["cache_k"], rotate(p["k"])], axis=2)))
            v = repeat(bb.emit(op.concat([p["cache_v"], p["v"]], axis=2)))
            sc = bb.emit(op.matmul(q, bb.emit(op.permute_dims(k, [0, 1, 3, 2]))))
            sc = bb.emit(op.add(op.multiply(sc, relax.const(1 / math.sqrt(d), F32)),
                                p["mask"]))
            out = bb.emit_output(op.matmul(bb.emit(op.nn.softmax(sc, axis=-1)), v))
        bb.emit_func_output(out)
    return prepare(bb.get()), inputs


def channel_chain_program(batch: int, channels: int, expanded: int, height: int, width: int,
                          kernel: int = 3, stride: int = 1, padding: int | None = None,
                          act: str = "relu6", seed: int = 0, prepared: bool = True):
    """An inverted-residual block's first half as the importers emit it: a 1x1 conv with a bias
    and ``act`` (``relu6``, ``silu`` or ``none``), then a ``kernel x kernel`` depthwise conv
    (``stride``, ``padding``: ``kernel // 2`` by default) with a bias and ``act``; prepared
    for fusion unless ``prepared=False`` (then as ``tvm.compile`` takes it), with constant
    weights and an input (``tests/test_chain.py``, ``lab/chain_ab.py``).
    """
    import numpy as np
    from tvm import relax

    from .pipelines import prepare

    F32, op = "float32", relax.op
    rng = np.random.default_rng(seed)
    shape = (batch, channels, height, width)
    x = relax.Var("x", relax.TensorType(shape, F32))

    def const(*dims, scale=1.0):
        return relax.const((rng.standard_normal(dims) * scale).astype(F32))

    bb = relax.BlockBuilder()

    def activate(value):
        value = bb.emit(value)
        if act == "relu6":
            return bb.emit(op.clip(value, 0.0, 6.0))
        if act == "silu":
            return bb.emit(op.multiply(value, bb.emit(op.sigmoid(value))))
        return value

    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(op.nn.conv2d(x, const(expanded, channels, 1, 1, scale=channels ** -0.5)))
            e = activate(op.add(e, const(1, expanded, 1, 1)))
            d = bb.emit(op.nn.conv2d(e, const(expanded, 1, kernel, kernel, scale=1.0 / kernel),
                                     strides=stride, groups=expanded,
                                     padding=kernel // 2 if padding is None else padding))
            out = bb.emit_output(activate(op.add(d, const(1, expanded, 1, 1))))
        bb.emit_func_output(out)
    mod = bb.get()
    return prepare(mod) if prepared else mod, {"x": rng.standard_normal(shape).astype(F32)}
