"""Per-kernel time of a CNN's build next to its convolution's shape, GFLOP/s and GB/s: which
convolutions (depthwise, pointwise, dense) are bound by what, before a fusion kind is chosen.

    python3 lab/conv_roofline.py mobilenet_v2 --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import tvm

sys.path.insert(0, os.path.dirname(__file__))
from fusion_bound import _kernel_seconds

from tvm_costfuse.models import corpus
from tvm_costfuse.pipelines import fuse
from tvm_costfuse.strategies import fusion_pass, strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target


def _shapes(mod):
    """Argument and result shapes of the call_tirs in ``main`` and their count, by kernel."""
    out = {}
    call_tir = tvm.ir.Op.get("relax.call_tir")

    def visit(expr):
        if isinstance(expr, tvm.relax.Call) and expr.op.same_as(call_tir):
            args = [a.ty.shape.values for a in expr.args[1].fields]
            shapes = [tuple(int(d) for d in s) for s in args] + [
                tuple(int(d) for d in expr.ty.shape.values)]
            name = expr.args[0].name_hint
            out[name] = (shapes, out.get(name, (None, 0))[1] + 1)

    tvm.relax.analysis.post_order_visit(mod["main"], visit)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--strategy", default="costfuse")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    mod, inputs, _ = corpus.load(args.model, small=args.small)
    shapes = _shapes(fuse(mod, target, fusion_pass(args.strategy, target)))
    ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline(args.strategy, target),
                     tir_pipeline=tir_pipeline(args.strategy))
    per = _kernel_seconds(ex, inputs, args.runs)
    total = sum(per.values())
    rows = []
    for name, sec in per.items():
        sh, calls = shapes.get(name, ([], 1))
        nbytes = 4 * calls * sum(int(np.prod(s)) for s in sh)
        flops = 0
        kind = ""
        if "conv2d" in name and len(sh) >= 2:
            x, w, y = sh[0], sh[1], sh[-1]
            if len(w) == 4 and len(y) == 4:
                flops = 2 * calls * int(np.prod(y)) * w[1] * w[2] * w[3]
                kind = ("dw" if w[1] == 1 and x[1] > 1 else
                        "pw" if w[2] == w[3] == 1 else f"{w[2]}x{w[3]}")
                kind += f" {x[1]}->{y[1]} {x[2]}x{x[3]}->{y[2]}x{y[3]} x{calls}"
        sec = max(sec, 1e-9)
        rows.append((sec, name, kind, flops / sec / 1e9, nbytes / sec / 1e9, nbytes))
    rows.sort(reverse=True)
    print(f"{args.model}, {args.strategy}, {args.threads} thread(s): kernels {total * 1e3:.2f} ms")
    by = {}
    for sec, name, kind, gf, gb, nb in rows:
        print(f"  {sec * 1e6:8.1f} us {sec / total:6.1%} {gf:7.1f} GF/s {gb:6.1f} GB/s "
              f"{nb / 1e6:6.2f} MB  {name:34s} {kind}")
        key = kind.split(" ")[0] if kind else "other"
        by[key] = by.get(key, 0.0) + sec
    for key, sec in sorted(by.items(), key=lambda kv: -kv[1]):
        print(f"  {key:6s} {sec * 1e3:7.3f} ms {sec / total:6.1%}")


if __name__ == "__main__":
    main()
