"""How close a decode step's GEMV kernels run to the stream bandwidth the calibration measured.

A decode step multiplies one token's row by every weight matrix: each such kernel reads its
weight once and does two FLOPs per weight element, so its floor is the weight's bytes at the
machine's streaming bandwidth. Per kernel of CostFuse's build (``fusion_bound._kernel_seconds``:
VM-instrumented, per-call instrument cost removed): the bytes of its arguments (read and
written once, a lower bound of its traffic), its time, their ratio, and that ratio over the
calibration's DRAM bandwidth (``TargetDesc.dram_bw``; the weights of a step are read once per
step, from DRAM unless the whole step's weights fit in the last-level cache). GEMVs here: the
matmul kernels whose largest argument holds at least 80% of their bytes::

    python lab/gemv_bandwidth.py qwen2_decode1024 --threads 1 [--huge-pages]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import tvm
from tvm import relax

sys.path.insert(0, os.path.dirname(__file__))
from fusion_bound import _kernel_seconds

from tvm_costfuse import huge_pages
from tvm_costfuse.measurement.calibrate import DRAM_STREAM_BYTES, stream_timer
from tvm_costfuse.models import corpus
from tvm_costfuse.pipelines import fuse
from tvm_costfuse.strategies import fusion_pass, strategy_pipeline
from tvm_costfuse.targets import host_target, isa, resolve


def _nbytes(ty) -> int:
    if isinstance(ty, relax.TupleType):
        return sum(_nbytes(f) for f in ty.fields)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return 0
    dims = list(ty.shape.values)
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return 0
    return math.prod(int(d) for d in dims) * tvm.DataType(ty.dtype).bits // 8


def _kernel_bytes(fused: tvm.IRModule) -> dict[str, list[int]]:
    """Per kernel: the bytes of each argument and of its output, summed over its calls in
    ``main`` (a layer's kernel is called once per layer; ``_kernel_seconds`` sums its calls'
    time too)."""
    out: dict[str, list[int]] = {}
    for block in fused["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if isinstance(call, relax.Call) and call.op.same_as(tvm.ir.Op.get("relax.call_tir")):
                sizes = [*(_nbytes(a.ty) for a in call.args[1].fields), _nbytes(binding.var.ty)]
                name = call.args[0].name_hint
                out[name] = [a + b for a, b in zip(out.get(name, [0] * len(sizes)), sizes,
                                                   strict=True)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--huge-pages", action="store_true",
                    help="the build's memory in 2 MiB pages (tvm_costfuse.huge_pages)")
    args = ap.parse_args()
    target = host_target(args.threads)
    desc = resolve(target).desc
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    mod, inputs, _ = corpus.load(args.model, small=args.small)
    fused = fuse(mod, target, fusion_pass("costfuse", target))
    sizes = _kernel_bytes(fused)
    ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("costfuse", target))
    if args.huge_pages:
        print(huge_pages.collapse().describe())
    seconds = _kernel_seconds(ex, inputs, args.runs)
    llc = desc.l3_bytes or desc.l2_bytes
    print(f"{args.model}, {args.threads} thread(s), calibrated DRAM {desc.dram_bw / 1e9:.1f} GB/s"
          f", last-level cache {llc >> 20} MiB ({desc.source})")
    total_bytes = total_s = 0.0
    for symbol, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        args_bytes = sizes.get(symbol)
        if not args_bytes or s <= 0:
            continue
        big = max(args_bytes)
        if big < 0.8 * sum(args_bytes) or "matmul" not in symbol:
            continue
        rate = sum(args_bytes) / s
        total_bytes, total_s = total_bytes + sum(args_bytes), total_s + s
        print(f"  {symbol:40s} {sum(args_bytes) / 2**20:8.2f} MiB {s * 1e6:9.1f} us "
              f"{rate / 1e9:6.1f} GB/s  {rate / desc.dram_bw:5.2f} of DRAM")
    if total_s:
        rate = total_bytes / total_s
        print(f"GEMVs together: {total_bytes / 2**20:.1f} MiB in {total_s * 1e3:.2f} ms, "
              f"{rate / 1e9:.1f} GB/s, {rate / desc.dram_bw:.2f} of the calibrated DRAM bandwidth")
        # The host's bandwidth moves within the hour: the calibration's stream again, now, in
        # the same kind of pages as the model's weights.
        moved, timer = stream_timer(DRAM_STREAM_BYTES, isa.vector_bits(target) // 32, args.threads,
                                    target)
        if args.huge_pages:
            timer(1, 1)  # both buffers written, so that both are resident and move
            huge_pages.collapse()
        now = moved / timer(9, 50)
        print(f"the calibration's stream, timed now: {now / 1e9:.1f} GB/s; the GEMVs at "
              f"{rate / now:.2f} of it")


if __name__ == "__main__":
    main()
