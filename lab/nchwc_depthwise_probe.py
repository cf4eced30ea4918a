"""How fast a depthwise convolution runs on blocked channels (NCHW[x]c) against today's NCHW
kernel: a probe for issue 29's blocked layouts, kernel alone, the input already blocked.

``Y[n, cb, y, x, c] = sum_{ry, rx} P[n, cb, y * s + ry, x * s + rx, c] * W[cb, ry, rx, c]``:
the lanes are channels, so every output vector is ``KH * KW`` FMAs of whole input vectors and
weight vectors, whatever the image width. The blocked kernel here reads a pre-padded input
(the pad is a copy on either side); timed beside the NCHW kernel (pad included)::

    python lab/nchwc_depthwise_probe.py --threads 1 --repeat 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import s_tir, te

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kernels
import depthwise_bench

from tvm_costfuse.measurement.timing import call_sampler, geomean, interleave, vm_sampler
from tvm_costfuse.schedules._common import vector_lanes
from tvm_costfuse.targets import host_target

SHAPES = [  # channels, size, taps, stride
    (96, 112, 3, 2), (144, 56, 3, 1), (144, 56, 3, 2), (192, 28, 3, 1), (192, 28, 3, 2),
    (384, 14, 3, 1), (576, 14, 3, 1), (960, 7, 3, 1), (240, 28, 5, 1), (480, 14, 5, 1),
    (672, 14, 5, 2), (1152, 7, 5, 1),
]


def blocked(c, size, k, s, lanes, cols, rows):
    pad = k // 2
    out = (size + 2 * pad - k) // s + 1
    cb = c // lanes
    xp = te.placeholder((1, cb, size + 2 * pad, size + 2 * pad, lanes), name="x")
    w = te.placeholder((cb, k, k, lanes), name="w")
    ry = te.reduce_axis((0, k), "ry")
    rx = te.reduce_axis((0, k), "rx")
    y = te.compute((1, cb, out, out, lanes), lambda n, b, i, j, l: te.sum(
        xp[n, b, i * s + ry, j * s + rx, l] * w[b, ry, rx, l], axis=[ry, rx]), name="y")
    sch = s_tir.Schedule(te.create_prim_func([xp, w, y]))
    blk = sch.get_sblock("y")
    n, b, i, j, l, r1, r2 = sch.get_loops(blk)
    io, ii = sch.split(i, [None, rows])
    jo, ji = sch.split(j, [None, cols])
    sch.reorder(n, b, io, jo, r1, r2, ii, ji, l)
    fused = sch.fuse(n, b, io)
    sch.parallel(fused)
    sch.vectorize(l)
    acc = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(acc, jo)
    sch.decompose_reduction(blk, r1)
    for loop in (r1, r2, ii, ji):
        sch.unroll(loop)
    la = sch.get_loops(acc)
    sch.vectorize(la[-1])
    return sch.mod["main"], (xp.shape, w.shape, y.shape), pad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cols", type=int, default=4)
    ap.add_argument("--rows", type=int, default=2)
    args = ap.parse_args()
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    lanes = vector_lanes(target, "float32")
    rng = np.random.default_rng(0)
    samplers, flops = {}, {}
    for c, size, k, s in SHAPES:
        name = f"dw{k}x{k}_s{s}_{c}x{size}"
        case = bench_kernels.Conv(name, (1, c, size, size), (c, 1, k, k), stride=s,
                                  pad=k // 2, groups=c)
        flops[name] = case.flops()
        ex, inputs, arrays = depthwise_bench.build(case, rng, target, False)
        samplers[(name, "nchw")] = vm_sampler(ex, inputs)
        out = (size + 2 * (k // 2) - k) // s + 1
        cols = min(args.cols, out)
        rows = args.rows if out % args.rows == 0 else 1
        while out % cols:
            cols -= 1
        func, shapes, pad = blocked(c, size, k, s, lanes, cols, rows)
        lib = tvm.compile(func, target)
        x, w = arrays[0], arrays[1]
        xb = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        xb = xb.reshape(1, c // lanes, lanes, size + 2 * pad, size + 2 * pad).transpose(0, 1, 3, 4, 2)
        wb = w.reshape(c // lanes, lanes, k, k).transpose(0, 2, 3, 1)
        dev = tvm.cpu()
        bufs = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in (xb, wb)]
        bufs.append(tvm.runtime.tensor(np.zeros([int(d) for d in shapes[2]], "float32"), dev))
        lib(*bufs)
        got = bufs[2].numpy().transpose(0, 1, 4, 2, 3).reshape(1, c, out, out)
        ref = bench_kernels.torch_call(case, arrays)().numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
        samplers[(name, "nchwc")] = call_sampler(lambda f=lib, b=bufs: f(*b))
    samples = interleave(samplers, args.repeat)
    print(f"target {target} threads={args.threads} lanes={lanes} tile {args.rows}x{args.cols}")
    print(f"{'case':24s} {'nchw us':>9s} {'nchwc us':>9s} {'nchw GF/s':>10s} "
          f"{'nchwc GF/s':>10s} {'speed-up':>9s}")
    gains = []
    for name in flops:
        a = float(np.median(samples[(name, "nchw")]))
        b = float(np.median(samples[(name, "nchwc")]))
        gains.append(a / b)
        print(f"{name:24s} {a * 1e6:9.1f} {b * 1e6:9.1f} {flops[name] / a / 1e9:10.1f} "
              f"{flops[name] / b / 1e9:10.1f} {a / b:9.2f}")
    print(f"geomean speed-up {geomean(gains):.2f}")


if __name__ == "__main__":
    main()
