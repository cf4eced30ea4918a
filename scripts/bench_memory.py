"""Reduction and elementwise cases of ``bench_kernels.py``: GB/s against PyTorch and the stream.

These kernels do a few operations per byte, so they are judged by bandwidth: bytes read plus
bytes written, each tensor once (inputs, constant parameters and outputs; intermediates are not
counted), divided by the median time. Next to ours: the same PyTorch op at the same thread count,
and calibrate's stream kernel (``B = 2 * A``) over the same number of bytes, timed in the same
interleaved rounds -- the bandwidth this machine reaches at that working-set size (a 600 KB
LayerNorm lives in L2, a 64 MB stream in DRAM), so "fraction of stream" compares like with like.

Each case is one model op as the corpus expresses it (shapes of ViT-B/16 at 224 px, BERT-base at
sequence 128, LLaMA/GPT-2 blocks at width 768, wav2vec2's feature encoder on 1 s of audio), built
as a Relax function with its parameters bound as constants and compiled with FuseOps + our CPU
rules; its output is checked against PyTorch's. ``corpus_kernels`` instead takes every distinct
fused non-contraction PrimFunc of a prepared corpus model (no PyTorch twin exists for a fused
kernel, so those rows show GB/s and the stream fraction only).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

OP = relax.op


@dataclass(frozen=True)
class MemCase:
    """``relax_fn(*vars, *consts)`` vs ``torch_fn(*tensors)`` over ``shapes`` (runtime inputs,
    standard normal) and ``params`` (constant parameters: weights, biases, masks)."""

    name: str
    kind: str  # "reduction" or "elementwise"
    shapes: tuple[tuple[int, ...], ...]
    params: tuple[tuple[int, ...], ...]
    relax_fn: Callable
    torch_fn: Callable


def _torch():
    import torch

    return torch


def _softmax(scale: float, masked: bool):
    """Attention probabilities as HF's eager attention computes them: scores / sqrt(d)
    (+ the additive mask broadcast over heads and queries), softmax over keys."""

    def rx(x, *mask):
        s = OP.multiply(x, relax.const(scale, "float32"))
        return OP.nn.softmax(OP.add(s, mask[0]) if masked else s, axis=-1)

    def th(x, *mask):
        s = x * scale
        return _torch().softmax(s + mask[0] if masked else s, dim=-1)

    return rx, th


def _layer_norm(x, g, b):
    return OP.nn.layer_norm(x, g, b, axes=[-1], epsilon=1e-12)


def _rms_norm_rx(x, w):
    """LLaMA's RMSNorm as its modeling code writes it (pow, mean, rsqrt, two multiplies)."""
    var = OP.mean(OP.power(x, relax.const(2.0, "float32")), axis=[-1], keepdims=True)
    return OP.multiply(w, OP.multiply(x, OP.rsqrt(OP.add(var, relax.const(1e-6, "float32")))))


def _rms_norm_th(x, w):
    torch = _torch()
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def _group_norm_rx(x, g, b):
    """wav2vec2's first GroupNorm: one group per channel (mean and variance of each row)."""
    return OP.nn.group_norm(x, g, b, num_groups=int(g.ty.shape.values[0]), channel_axis=1, axes=[2])


def _group_norm_th(x, g, b):
    return _torch().nn.functional.group_norm(x, g.shape[0], g, b)


def _gelu_tanh_rx(x):
    """GPT-2's NewGELU as exported: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    c = relax.const(math.sqrt(2.0 / math.pi), "float32")
    cube = OP.multiply(relax.const(0.044715, "float32"), OP.power(x, relax.const(3.0, "float32")))
    inner = OP.multiply(c, OP.add(x, cube))
    return OP.multiply(OP.multiply(relax.const(0.5, "float32"), x),
                       OP.add(relax.const(1.0, "float32"), OP.tanh(inner)))


def _gelu_tanh_th(x):
    torch = _torch()
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3.0))))


def _cases() -> list[MemCase]:
    th = _torch
    vit_sm, bert_sm = _softmax(0.125, masked=False), _softmax(0.125, masked=True)
    return [
        MemCase("vit_softmax_12x197x197", "reduction", ((1, 12, 197, 197),), (), *vit_sm),
        MemCase("bert_softmax_mask_12x128x128", "reduction", ((1, 12, 128, 128),),
                ((1, 1, 1, 128),), *bert_sm),
        MemCase("vit_layernorm_197x768", "reduction", ((1, 197, 768),), ((768,), (768,)),
                _layer_norm, lambda x, g, b: th().nn.functional.layer_norm(x, (768,), g, b, 1e-12)),
        MemCase("bert_layernorm_128x768", "reduction", ((1, 128, 768),), ((768,), (768,)),
                _layer_norm, lambda x, g, b: th().nn.functional.layer_norm(x, (768,), g, b, 1e-12)),
        MemCase("llama_rmsnorm_128x768", "reduction", ((1, 128, 768),), ((768,),),
                _rms_norm_rx, _rms_norm_th),
        MemCase("w2v_groupnorm_512x3199", "reduction", ((1, 512, 3199),), ((512,), (512,)),
                _group_norm_rx, _group_norm_th),
        MemCase("vit_gelu_erf_197x3072", "elementwise", ((1, 197, 3072),), (),
                OP.nn.gelu, lambda x: th().nn.functional.gelu(x)),
        MemCase("gpt2_gelu_tanh_128x3072", "elementwise", ((1, 128, 3072),), (),
                _gelu_tanh_rx, _gelu_tanh_th),
        MemCase("llama_silu_mul_128x3072", "elementwise", ((1, 128, 3072), (1, 128, 3072)), (),
                lambda a, b: OP.multiply(OP.nn.silu(a), b),
                lambda a, b: th().nn.functional.silu(a) * b),
        MemCase("vit_residual_add_197x768", "elementwise", ((1, 197, 768), (1, 197, 768)), (),
                OP.add, lambda a, b: a + b),
    ]


MEM_CASES = _cases()


def case_bytes(arrays: list[np.ndarray], outputs: list[np.ndarray]) -> int:
    """Bytes a kernel must move at least: every input and output once."""
    return sum(a.nbytes for a in arrays) + sum(o.nbytes for o in outputs)


def build_case(case: MemCase, rng) -> tuple[tvm.IRModule, dict, list[np.ndarray], Callable]:
    """(Relax module, its runtime inputs, every array it touches, the PyTorch call)."""
    torch = _torch()
    inputs = {f"x{i}": rng.standard_normal(s, dtype=np.float32) for i, s in
              enumerate(case.shapes)}
    params = [rng.standard_normal(s, dtype=np.float32) for s in case.params]
    bb = relax.BlockBuilder()
    xs = [relax.Var(n, relax.TensorType(a.shape, "float32")) for n, a in inputs.items()]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(case.relax_fn(*xs, *(relax.const(p) for p in params)))
        bb.emit_func_output(out)
    tensors = [torch.from_numpy(a) for a in [*inputs.values(), *params]]
    return bb.get(), inputs, [*inputs.values(), *params], lambda: case.torch_fn(*tensors)


# --------------------------------------------------------------------------- corpus kernels
def _kernel_kind(func: tvm.tirx.PrimFunc, target) -> str | None:
    """"reduction" / "elementwise" / "fallback" as our rules schedule ``func``; None for
    contractions (bench_kernels' matmul cases cover those)."""
    from tvm_costfuse.schedules import Contraction, RowReduction, is_spatial, root_blocks

    if Contraction().apply(func, target, False) is not None:
        return None
    if RowReduction().apply(func, target, False) is not None:
        return "reduction"
    sch = tvm.s_tir.Schedule(func)
    return "elementwise" if all(is_spatial(sch.get(b)) for b in root_blocks(sch)) else "fallback"


def _standalone(func: tvm.tirx.PrimFunc) -> tuple[tvm.IRModule, list, list]:
    """A Relax ``main`` calling ``func`` once: (module, input (shape, dtype)s, outputs')."""
    params = list(func.params)  # buffers, in TVM 0.27
    n_out = int(func.attrs["num_outputs"]) if func.attrs and "num_outputs" in func.attrs else 1
    ins, outs = params[:-n_out], params[-n_out:]

    def sig(buf):
        return tuple(int(d) for d in buf.shape), str(buf.dtype)

    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(*sig(b))) for i, b in enumerate(ins)]
    with bb.function("main", xs):
        gv = bb.add_func(func.without_attr("global_symbol"), "kernel")
        with bb.dataflow():
            ty = [relax.TensorType(*sig(b)) for b in outs]
            out = bb.emit_output(relax.call_tir(gv, xs, ty if len(ty) > 1 else ty[0]))
        bb.emit_func_output(out)
    return bb.get(), [sig(b) for b in ins], [sig(b) for b in outs]


def corpus_kernels(names: list[str], target, rng) -> list[tuple[str, str, tvm.IRModule, dict]]:
    """(name, kind, standalone module, inputs) for every distinct non-contraction kernel that
    FuseOps + FuseTIR make of the corpus models ``names`` (static shapes only). Float inputs
    are uniform in [0.5, 1.5) (no NaN from a logarithm or root), integer ones 0 (a valid index
    of any gather)."""
    from tvm_costfuse.models import corpus
    from tvm_costfuse.pipelines import fuse

    seen, out = set(), []
    for name in names:
        fused = fuse(corpus.load(name, small=False)[0], target, relax.transform.FuseOps())
        for gv, func in fused.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            key = tvm_ffi.structural_hash(func.without_attr("global_symbol"))
            if key in seen:
                continue
            seen.add(key)
            try:
                mod, ins, _ = _standalone(func)
            except (TypeError, ValueError, AttributeError):
                continue  # a symbolic shape
            kind = _kernel_kind(func, target)
            if kind is None:
                continue
            inputs = {f"x{i}": (rng.uniform(0.5, 1.5, s).astype(d) if "float" in d
                                else np.zeros(s, d)) for i, (s, d) in enumerate(ins)}
            out.append((f"{name}:{gv.name_hint}", kind, mod, inputs))
    return out


# --------------------------------------------------------------------------- the report
def _summary(label: str, names: list[str], ratios: list[float]) -> str:
    from tvm_costfuse.measurement.timing import geomean

    worst = min(range(len(ratios)), key=ratios.__getitem__)
    return f"{label} geomean {geomean(ratios):.2f}  worst {ratios[worst]:.2f} ({names[worst]})"


def report(cases: list[MemCase], corpus: list[tuple], target, threads: int, repeat: int) -> None:
    """Build, check, time (interleaved rounds) and print the memory-bound cases; then per class
    the geomean and worst of tvm/torch and of tvm/stream."""
    from tvm_costfuse.measurement.calibrate import stream_timer
    from tvm_costfuse.measurement.timing import (
        call_sampler,
        interleave,
        kernel_calls,
        run,
        vm_sampler,
    )
    from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
    from tvm_costfuse.targets import isa

    lanes = isa.vector_bits(target) // 32
    rng = np.random.default_rng(0)
    rows, samplers = [], {}
    for case in cases:
        mod, inputs, arrays, torch_call = build_case(case, rng)
        ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target),
                         tir_pipeline=tir_pipeline())
        got, ref = run(ex, inputs), torch_call()
        ref = [ref.numpy()]
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-3, atol=1e-4 * np.abs(ref[0]).max())
        rows.append((case.name, case.kind, len(kernel_calls(ex, inputs)), case_bytes(arrays, ref)))
        samplers[(case.name, "tvm")] = vm_sampler(ex, inputs)
        samplers[(case.name, "torch")] = call_sampler(torch_call)
    pipeline = strategy_pipeline("none", target)  # the kernel as fused, no further fusion
    for name, kind, mod, inputs in corpus:
        ex = tvm.compile(mod, target, relax_pipeline=pipeline, tir_pipeline=tir_pipeline())
        outs = run(ex, inputs)
        rows.append((name, kind, 1, case_bytes(list(inputs.values()), outs)))
        samplers[(name, "tvm")] = vm_sampler(ex, inputs)
    streams = {}
    for _, _, _, nbytes in rows:
        if nbytes not in streams:
            moved, timer = stream_timer(nbytes // 2, lanes, threads, target)
            streams[nbytes] = moved
            samplers[(nbytes, "stream")] = lambda timer=timer: timer(1, 50)
    samples = {k: float(np.median(v)) for k, v in interleave(samplers, repeat).items()}
    print(f"{'case':44s} {'kind':11s} {'k':>2s} {'MB':>6s} {'tvm us':>8s} {'torch us':>8s} "
          f"{'tvm GB/s':>8s} {'torch':>6s} {'stream':>6s} {'/torch':>6s} {'/stream':>7s}")
    by_kind: dict[str, dict[str, list]] = {}
    for name, kind, kernels, nbytes in rows:
        t = samples[(name, "tvm")]
        p = samples.get((name, "torch"), math.nan)
        stream_bw = streams[nbytes] / samples[(nbytes, "stream")]
        bw = nbytes / t
        print(f"{name:44s} {kind:11s} {kernels:2d} {nbytes / 1e6:6.2f} {t * 1e6:8.1f} "
              f"{p * 1e6:8.1f} {bw / 1e9:8.1f} {nbytes / p / 1e9:6.1f} {stream_bw / 1e9:6.1f} "
              f"{p / t:6.2f} {bw / stream_bw:7.2f}")
        acc = by_kind.setdefault(kind, {"names": [], "torch": [], "tnames": [], "stream": []})
        acc["names"].append(name)
        acc["stream"].append(bw / stream_bw)
        if not math.isnan(p):
            acc["tnames"].append(name)
            acc["torch"].append(p / t)
    for kind, acc in by_kind.items():
        parts = [_summary("tvm/stream", acc["names"], acc["stream"])]
        if acc["torch"]:
            parts.insert(0, _summary("tvm/torch", acc["tnames"], acc["torch"]))
        print(f"{kind}: " + "; ".join(parts))
