"""Depthwise and 1x1 convolutions NCHW against channels-last (NHWC), each with a bias and
ReLU6 as the CNNs have them: measured and as the cost model prices them, side by side.

Each case is one Relax program per layout (NHWC weights ``HWOI`` / ``HWIO``, what
``layouts.py`` gives), planned by CostFuse (the price: the plan's seconds) and built with
our schedules; outputs checked against PyTorch, then timed in interleaved rounds::

    python lab/layout_kernels.py --threads 1 --repeat 5
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import tvm
from tvm import relax
from tvm_costfuse.schedules.efficiency import K0

from tvm_costfuse import host_target, strategy_pipeline, tir_pipeline
from tvm_costfuse.graph import build_graph
from tvm_costfuse.horizontal import legalized
from tvm_costfuse.measurement.timing import geomean, interleave, run, vm_sampler
from tvm_costfuse.targets import host
from tvm_costfuse.transform import CostFuse, plan_module

CASES = [  # kind (dw: depthwise, pw: 1x1), in and out channels, size, kernel, stride
    ("dw", 96, 96, 112, 3, 2), ("dw", 144, 144, 56, 3, 1), ("dw", 144, 144, 56, 3, 2),
    ("dw", 192, 192, 28, 3, 1), ("dw", 384, 384, 14, 3, 1), ("dw", 960, 960, 7, 3, 1),
    ("dw", 240, 240, 28, 5, 1), ("dw", 672, 672, 14, 5, 2), ("dw", 72, 72, 56, 3, 1),
    ("dw", 192, 192, 28, 3, 2), ("dw", 576, 576, 14, 3, 1), ("dw", 480, 480, 14, 5, 1),
    ("dw", 1152, 1152, 7, 5, 1), ("dw", 120, 120, 28, 5, 1), ("dw", 200, 200, 14, 3, 1),
    ("pw", 16, 96, 112, 1, 1), ("pw", 96, 24, 56, 1, 1), ("pw", 24, 144, 56, 1, 1),
    ("pw", 144, 32, 28, 1, 1), ("pw", 192, 64, 14, 1, 1), ("pw", 384, 96, 14, 1, 1),
    ("pw", 576, 160, 7, 1, 1), ("pw", 960, 320, 7, 1, 1), ("pw", 320, 1280, 7, 1, 1),
]


def program(kind, cin, cout, size, k, s, layout, w, b):
    shape = (1, cin, size, size) if layout == "NCHW" else (1, size, size, cin)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    groups = cin if kind == "dw" else 1
    if layout == "NCHW":
        weight, kl, bias = w, "OIHW", b.reshape(1, cout, 1, 1)
    else:
        weight = w.transpose(2, 3, 0, 1) if kind == "dw" else w.transpose(2, 3, 1, 0)
        kl, bias = ("HWOI" if kind == "dw" else "HWIO"), b.reshape(1, 1, 1, cout)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ascontiguousarray(weight)),
                                           strides=s, padding=k // 2, groups=groups,
                                           data_layout=layout, kernel_layout=kl))
            y = bb.emit(relax.op.add(y, relax.const(bias)))
            out = bb.emit_output(relax.op.clip(y, 0.0, 6.0))
        bb.emit_func_output(out)
    return bb.get()


def price(mod, target) -> float:
    cf = CostFuse(target=target, layout="never")
    config = cf.config()
    with target:
        prepared = legalized(mod, target)
        return plan_module(prepared, cf.describe_target(config), config, compile_target=target,
                           graph=build_graph(prepared)).seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    samplers, prices = {}, {}
    for case in CASES:
        kind, cin, cout, size, k, s = case
        x = rng.standard_normal((1, cin, size, size)).astype("float32")
        w = rng.standard_normal((cout, 1 if kind == "dw" else cin, k, k)).astype("float32")
        b = rng.standard_normal(cout).astype("float32")
        want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b),
                                          stride=s, padding=k // 2,
                                          groups=cin if kind == "dw" else 1).clamp(0, 6).numpy()
        for layout in ("NCHW", "NHWC"):
            mod = program(kind, cin, cout, size, k, s, layout, w, b)
            prices[(case, layout)] = price(mod, target)
            ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target),
                             tir_pipeline=tir_pipeline())
            data = {"x": x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))}
            got = run(ex, data)[0]
            got = got if layout == "NCHW" else got.transpose(0, 3, 1, 2)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
            samplers[(case, layout)] = vm_sampler(ex, data)
    samples = interleave(samplers, args.repeat)
    print(f"target {target}, {args.threads} thread(s), {args.repeat} rounds")
    print(f"{'case':28s} {'NCHW us':>8s} {'pred':>8s} {'NHWC us':>8s} {'pred':>8s} "
          f"{'meas x':>7s} {'pred x':>7s}")
    ratios = {"NCHW": [], "NHWC": []}
    for case in CASES:
        t = {lay: float(np.median(samples[(case, lay)])) for lay in ("NCHW", "NHWC")}
        p = {lay: prices[(case, lay)] for lay in ("NCHW", "NHWC")}
        for lay, seconds in t.items():
            ratios[lay].append(p[lay] / seconds)
        kind, cin, cout, size, k, s = case
        name = f"{kind} {cin}->{cout} {size}px k{k} s{s}"
        print(f"{name:28s} {t['NCHW'] * 1e6:8.1f} {p['NCHW'] * 1e6:8.1f} {t['NHWC'] * 1e6:8.1f} "
              f"{p['NHWC'] * 1e6:8.1f} {t['NCHW'] / t['NHWC']:7.2f} {p['NCHW'] / p['NHWC']:7.2f}")
    for lay, r in ratios.items():
        print(f"predicted / measured {lay}: geomean {geomean(r):.2f}, "
              f"range {min(r):.2f}-{max(r):.2f}")
    # each depthwise kernel's share of the FMA peak over the K term, as efficiency.py fits
    # E_DEPTHWISE (NCHW) and E_CHANNELS_LAST (NHWC)
    peak = host(args.threads).peak("float32")
    for lay in ("NCHW", "NHWC"):
        shares: dict[int, list[float]] = {}
        for case in CASES:
            kind, cin, _cout, size, k, s = case
            if kind != "dw":
                continue
            out = (size + 2 * (k // 2) - k) // s + 1
            flops = 2.0 * cin * k * k * out * out
            seconds = float(np.median(samples[(case, lay)]))
            shares.setdefault(s, []).append(flops / seconds / peak / (k * k / (k * k + K0)))
        print(f"depthwise {lay} share over the K term, geomean by stride: " + ", ".join(
            f"stride {s} {geomean(v):.2f} ({len(v)} shapes, {min(v):.2f}-{max(v):.2f})"
            for s, v in sorted(shares.items())))


if __name__ == "__main__":
    main()
