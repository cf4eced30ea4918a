"""Kernel benchmark: our CPU contraction kernels against the same PyTorch op, one thread count.

Each case is one contraction as the corpus models contain it (a Linear with its bias, an
attention batch matmul with a transposed operand, a batch matmul of unequal batch ranks, a
ResNet or MobileNet convolution),
built as a small Relax function, compiled with FuseOps + our CPU rules (weights bound as
constants, so prepacking applies as in a model) and checked against NumPy (convolutions:
against PyTorch). PyTorch runs the
same op (``torch.nn.functional.linear`` / ``torch.matmul`` / ``conv2d``) at the same thread count
(``torch.set_num_threads`` = the target's ``num-cores``). Both are sampled in interleaved
rounds in one process; medians, GFLOP/s, their ratio, the geomean and the worst ratio print.

``--from-corpus NAME...`` adds every distinct matmul shape of those corpus models (read from
the module that fusion sees; inputs and weights random), ``--convs-from-corpus NAME...`` every
distinct convolution of them (read from the imported module), e.g.::

    python scripts/bench_kernels.py --threads 1 --repeat 7
    python scripts/bench_kernels.py --threads 1 --from-corpus vit_b_16 bert

Reductions and elementwise kernels (softmax, norms, GELU...; ``bench_memory.py``) are judged
in GB/s against PyTorch and calibrate's stream kernel; ``--classes`` picks what runs, and
``--from-corpus`` adds each distinct fused kernel of those classes::

    python scripts/bench_kernels.py --threads 1 --classes reduction elementwise
    python scripts/bench_kernels.py --threads 1 --no-builtin --convs-from-corpus wav2vec2

(the last: only the convolutions of a corpus model, without the built-in cases).
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass

import bench_memory
import numpy as np
import tvm
from tvm import relax

from tvm_costfuse.measurement.timing import call_sampler, geomean, interleave, run, vm_sampler
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target, isa


@dataclass(frozen=True)
class Case:
    """``a @ b`` (b^T when ``trans_b``), then ``+ bias`` when ``bias``; ``b`` a constant
    weight when ``weight``. Shapes broadcast like ``torch.matmul``."""

    name: str
    a: tuple[int, ...]
    b: tuple[int, ...]
    trans_b: bool = False
    bias: bool = False
    weight: bool = True

    @property
    def b_logical(self) -> tuple[int, ...]:
        return (*self.b[:-2], self.b[-1], self.b[-2]) if self.trans_b else self.b

    def flops(self) -> float:
        m, k = self.a[-2:]
        n = self.b_logical[-1]
        batch = np.broadcast_shapes(self.a[:-2], self.b[:-2])
        return 2.0 * math.prod(batch) * m * n * k


@dataclass(frozen=True)
class Conv:
    """``conv2d(x, w)`` (NCHW, OIHW) or ``conv1d`` (NCW, OIW, a 3-d ``x``), a constant weight,
    with ``stride``, ``pad`` (one int, or one per spatial dim), ``groups``."""

    name: str
    x: tuple[int, ...]
    w: tuple[int, ...]
    stride: int = 1
    pad: int | tuple[int, ...] = 0
    groups: int = 1

    @property
    def pads(self) -> tuple[int, ...]:
        return self.pad if isinstance(self.pad, tuple) else (self.pad,) * (len(self.x) - 2)

    def out_spatial(self) -> tuple[int, ...]:
        return tuple((size + 2 * p - k) // self.stride + 1
                     for size, k, p in zip(self.x[2:], self.w[2:], self.pads))

    def flops(self) -> float:
        return 2.0 * self.x[0] * math.prod(self.w) * math.prod(self.out_spatial())


# Shapes from the corpus's vision transformers and BERT (sequence 197 and 128, width 768).
CASES = [
    Case("linear_197x384x1536", (197, 384), (384, 1536), bias=True),
    Case("vit_qkv_197x768x2304", (1, 197, 768), (768, 2304), bias=True),
    Case("vit_fc1_197x768x3072", (1, 197, 768), (768, 3072), bias=True),
    Case("vit_fc2_197x3072x768", (1, 197, 3072), (3072, 768), bias=True),
    Case("vit_qkT_12x197x64x197", (1, 12, 197, 64), (1, 12, 197, 64), trans_b=True,
         weight=False),
    Case("vit_pv_12x197x197x64", (1, 12, 197, 197), (1, 12, 197, 64), weight=False),
    Case("bert_qkT_12x128x64x128", (1, 12, 128, 64), (1, 12, 128, 64), trans_b=True,
         weight=False),
    Case("bcast_b_12x197x64x64", (1, 12, 197, 64), (64, 64), weight=False),
    # ResNet-50 (1x1 and 3x3 at 56x56 and 14x14) and MobileNetV2 (depthwise) at 224 px.
    Conv("r50_conv1x1_64x56x56_to256", (1, 64, 56, 56), (256, 64, 1, 1)),
    Conv("r50_conv1x1_256x14x14_to1024", (1, 256, 14, 14), (1024, 256, 1, 1)),
    Conv("r50_conv3x3_64x56x56", (1, 64, 56, 56), (64, 64, 3, 3), pad=1),
    Conv("mnv2_dw3x3_96x56x56_s2", (1, 96, 56, 56), (96, 1, 3, 3), stride=2, pad=1, groups=96),
    # ResNet-50's stem, 3x3 at 28/14/7 and a strided 3x3; ResNeXt's grouped 3x3 (4 and 16
    # channels per group); Inception v3's 1x7 / 7x1 at 17x17, 3x3 at 35x35 and its stem at
    # 147 and 73 (prime widths); wav2vec2-base's feature encoder (k10/s5 on 16000 samples,
    # k3/s2 at 3199 and 199, k2/s2 at 99 frames) and its grouped positional conv (k128, g16).
    Conv("r50_stem7x7_s2_3x224x224", (1, 3, 224, 224), (64, 3, 7, 7), stride=2, pad=3),
    Conv("r50_conv3x3_128x28x28", (1, 128, 28, 28), (128, 128, 3, 3), pad=1),
    Conv("r50_conv3x3_256x14x14", (1, 256, 14, 14), (256, 256, 3, 3), pad=1),
    Conv("r50_conv3x3_512x7x7", (1, 512, 7, 7), (512, 512, 3, 3), pad=1),
    Conv("r50_conv3x3_128x56x56_s2", (1, 128, 56, 56), (128, 128, 3, 3), stride=2, pad=1),
    Conv("rx50_g32_3x3_128x56x56", (1, 128, 56, 56), (128, 4, 3, 3), pad=1, groups=32),
    Conv("rx50_g32_3x3_512x14x14", (1, 512, 14, 14), (512, 16, 3, 3), pad=1, groups=32),
    Conv("inc_1x7_128x17x17", (1, 128, 17, 17), (128, 128, 1, 7), pad=(0, 3)),
    Conv("inc_7x1_128x17x17_to192", (1, 128, 17, 17), (192, 128, 7, 1), pad=(3, 0)),
    Conv("inc_3x3_64x35x35_to96", (1, 64, 35, 35), (96, 64, 3, 3), pad=1),
    Conv("inc_stem3x3_32x147x147_to64", (1, 32, 147, 147), (64, 32, 3, 3), pad=1),
    Conv("inc_stem3x3_80x73x73_to192", (1, 80, 73, 73), (192, 80, 3, 3)),
    Conv("w2v_conv1d_k10s5_1x16000", (1, 1, 16000), (512, 1, 10), stride=5),
    Conv("w2v_conv1d_k3s2_512x3199", (1, 512, 3199), (512, 512, 3), stride=2),
    Conv("w2v_conv1d_k3s2_512x199", (1, 512, 199), (512, 512, 3), stride=2),
    Conv("w2v_conv1d_k2s2_512x99", (1, 512, 99), (512, 512, 2), stride=2),
    Conv("w2v_posconv_k128g16_768x49", (1, 768, 49), (768, 48, 128), pad=64, groups=16),
]


def conv_module(case: Conv, rng):
    """The conv case as a Relax function, its inputs, PyTorch's output, and the arrays."""

    x = rng.standard_normal(case.x, dtype=np.float32)
    w = (rng.standard_normal(case.w) / math.sqrt(math.prod(case.w[1:]))).astype(np.float32)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(case.x, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            op = relax.op.nn.conv1d if len(case.x) == 3 else relax.op.nn.conv2d
            gv = bb.emit_output(op(xv, relax.const(w), strides=case.stride, padding=case.pads,
                                   groups=case.groups))
        bb.emit_func_output(gv)
    ref = torch_call(case, (x, w, None))().numpy()
    return bb.get(), {"x": x}, ref, (x, w, None)


def relax_module(case: Case, rng) -> tuple[tvm.IRModule, dict[str, np.ndarray], np.ndarray, tuple]:
    """The case as a Relax function, its inputs, and the NumPy reference output."""
    a = rng.standard_normal(case.a, dtype=np.float32)
    b = (rng.standard_normal(case.b) / math.sqrt(case.a[-1])).astype(np.float32)
    n = case.b_logical[-1]
    bias = rng.standard_normal((n,), dtype=np.float32)
    bb = relax.BlockBuilder()
    xa = relax.Var("a", relax.TensorType(case.a, "float32"))
    params = [xa]
    inputs = {"a": a}
    if case.weight:
        xb = relax.const(b)
    else:
        xb = relax.Var("b", relax.TensorType(case.b, "float32"))
        params.append(xb)
        inputs["b"] = b
    with bb.function("main", params):
        with bb.dataflow():
            rhs = bb.emit(relax.op.permute_dims(xb, [*range(len(case.b) - 2), len(case.b) - 1,
                                                     len(case.b) - 2])) if case.trans_b else xb
            out = bb.emit(relax.op.matmul(xa, rhs))
            if case.bias:
                out = bb.emit(relax.op.add(out, relax.const(bias)))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    b_log = np.swapaxes(b, -1, -2) if case.trans_b else b
    ref = np.matmul(a, b_log) + (bias if case.bias else 0)
    return bb.get(), inputs, ref, (a, b, bias)


def torch_call(case: Case | Conv, arrays):
    import torch

    if isinstance(case, Conv):
        x, w = torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1])
        conv = torch.nn.functional.conv1d if len(case.x) == 3 else torch.nn.functional.conv2d
        return lambda: conv(x, w, stride=case.stride, padding=case.pads, groups=case.groups)
    a, b, bias = (torch.from_numpy(x) for x in arrays)
    if case.bias and not case.trans_b and b.ndim == 2:
        w = b.t().contiguous()  # nn.Linear's (out, in) weight
        return lambda: torch.nn.functional.linear(a, w, bias)
    bt = b.transpose(-1, -2) if case.trans_b else b
    if case.bias:
        return lambda: torch.matmul(a, bt) + bias
    return lambda: torch.matmul(a, bt)


def corpus_cases(names: list[str]) -> list[Case]:
    """Every distinct ``matmul`` PrimFunc call in the prepared modules of ``names``."""
    from tvm_costfuse.models import corpus
    from tvm_costfuse.pipelines import prepare

    call_tir = tvm.ir.Op.get("relax.call_tir")
    seen, out = set(), []
    for name in names:
        mod = prepare(corpus.load(name, small=False)[0])

        def visit(expr, model=name):
            if not (isinstance(expr, relax.Call) and expr.op.same_as(call_tir)):
                return
            if not expr.args[0].name_hint.startswith("matmul"):
                return
            args = expr.args[1].fields
            shapes = [tuple(int(d) for d in a.ty.shape.values) for a in args[:2]]
            weight = isinstance(args[1], tvm.ir.expr.GenericConst)
            key = (*shapes, weight)
            if key not in seen:
                seen.add(key)
                tag = "x".join(map(str, shapes[0])) + "@" + "x".join(map(str, shapes[1]))
                out.append(Case(f"{model}_{tag}", shapes[0], shapes[1], weight=weight))

        relax.analysis.post_order_visit(mod["main"], visit)
    return out


KERNEL_CLASSES = ("contraction", "reduction", "elementwise")


def memory_section(args, target) -> None:
    """The reduction / elementwise cases (``bench_memory``) of the chosen classes."""
    kinds = [k for k in args.classes if k != "contraction"]
    if not kinds:
        return
    mem = [c for c in bench_memory.MEM_CASES if c.kind in kinds
           and (not args.cases or any(s in c.name for s in args.cases))]
    corpus = [k for k in bench_memory.corpus_kernels(args.from_corpus, target,
                                                     np.random.default_rng(1))
              if k[1] in kinds or (k[1] == "fallback" and "reduction" in kinds)]
    print(f"\nmemory-bound kernels  load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    bench_memory.report(mem, corpus, target, args.threads, args.repeat)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def corpus_convs(names: list[str]) -> list[Conv]:
    """Every distinct ``conv1d`` / ``conv2d`` call (shapes, stride, padding, groups) in the
    imported modules of ``names``; dilated ones and asymmetric padding are left out (``Conv``
    does not express them)."""
    from tvm_costfuse.models import corpus

    ops = {"relax.nn.conv1d", "relax.nn.conv2d"}
    seen, out = set(), []
    for name in names:
        mod = corpus.load(name, small=False)[0]

        def visit(expr, model=name):
            if not (isinstance(expr, relax.Call) and getattr(expr.op, "name", None) in ops):
                return
            attrs = expr.attrs
            dims = len(expr.args[0].ty.shape.values) - 2
            pads = [int(p) for p in attrs.padding]
            strides = {int(s) for s in attrs.strides}
            if (any(int(d) != 1 for d in attrs.dilation) or len(strides) != 1
                    or pads[:dims] != pads[dims:]):
                return
            x, w = (tuple(int(d) for d in a.ty.shape.values) for a in expr.args[:2])
            key = (x, w, *strides, tuple(pads[:dims]), int(attrs.groups))
            if key not in seen:
                seen.add(key)
                tag = "x".join(map(str, x[1:])) + "_k" + "x".join(map(str, w[2:]))
                out.append(Conv(f"{model}_{tag}_s{key[2]}_g{key[4]}", x, w, key[2],
                                key[3], key[4]))

        relax.analysis.post_order_visit(mod["main"], visit)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--cases", nargs="*", help="substrings of case names to keep")
    ap.add_argument("--from-corpus", nargs="*", default=[], metavar="MODEL")
    ap.add_argument("--convs-from-corpus", nargs="*", default=[], metavar="MODEL",
                    help="add every distinct convolution of these corpus models")
    ap.add_argument("--no-builtin", action="store_true", help="only the corpus cases")
    ap.add_argument("--peak", action="store_true",
                    help="also time calibrate's FMA-chain kernel: each kernel's share of peak")
    ap.add_argument("--classes", nargs="*", default=list(KERNEL_CLASSES), choices=KERNEL_CLASSES,
                    help="kernel classes to run (default all)")
    args = ap.parse_args()

    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)  # TVM's pool = torch's
    cases = []
    if "contraction" in args.classes:
        cases = ([] if args.no_builtin else CASES) + corpus_cases(args.from_corpus) \
            + corpus_convs(args.convs_from_corpus)
    if args.cases:
        cases = [c for c in cases if any(s in c.name for s in args.cases)]
    try:
        import torch

        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    print(f"target {target}  threads={args.threads}  repeat={args.repeat}  "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rng = np.random.default_rng(0)
    samplers, flops = {}, {}
    for case in cases:
        if isinstance(case, Conv) and torch is None:
            continue  # PyTorch is the conv reference
        build = conv_module if isinstance(case, Conv) else relax_module
        mod, inputs, ref, arrays = build(case, rng)
        ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target),
                         tir_pipeline=tir_pipeline())
        got = run(ex, inputs)[0]
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
        samplers[(case.name, "tvm")] = vm_sampler(ex, inputs)
        if torch is not None:
            samplers[(case.name, "torch")] = call_sampler(torch_call(case, arrays))
        flops[case.name] = case.flops()
    if args.peak:
        from tvm_costfuse.measurement.calibrate import fma_timer

        # built once: the peak is timed in every round, as seconds per FLOP
        peak_flops, peak_timer = fma_timer(isa.vector_bits(target) // 32, args.threads, target,
                                           1 << 14)
        samplers[("peak", "tvm")] = lambda: peak_timer(1, 50) / peak_flops
    samples = interleave(samplers, args.repeat)
    peak = 1.0 / float(np.median(samples[("peak", "tvm")])) if args.peak else math.nan
    if args.peak:
        print(f"FMA-chain peak: {peak / 1e9:.1f} GFLOP/s")
    print(f"{'case':40s} {'tvm ms':>9s} {'torch ms':>9s} {'tvm GF/s':>9s} {'torch GF/s':>10s} "
          f"{'tvm/torch':>9s} {'tvm/peak':>8s}")
    ratios = []
    cases = [c for c in cases if c.name in flops]
    for case in cases:
        t = float(np.median(samples[(case.name, "tvm")]))
        p = float(np.median(samples[(case.name, "torch")])) if torch is not None else math.nan
        ratios.append(p / t)
        print(f"{case.name:40s} {t * 1e3:9.3f} {p * 1e3:9.3f} {flops[case.name] / t / 1e9:9.1f} "
              f"{flops[case.name] / p / 1e9:10.1f} {p / t:9.2f} {flops[case.name] / t / peak:8.2f}")
    if torch is not None and ratios:
        worst = min(range(len(cases)), key=lambda i: ratios[i])
        print(f"geomean tvm/torch speed: {geomean(ratios):.2f}  worst {ratios[worst]:.2f} "
              f"({cases[worst].name})  load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    memory_section(args, target)


if __name__ == "__main__":
    main()
