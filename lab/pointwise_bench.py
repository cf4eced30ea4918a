"""The corpus's pointwise (1x1) convolutions: the GEMM micro-kernel with the image's pixels as
one column axis (``schedules/columns.py``) against the same kernel tiled along the image row
alone (``columns.mergeable`` answering None) and PyTorch, interleaved in one process.

``--epilogue`` adds the folded batch norm's bias and a ReLU6, as the models' fused groups
have them::

    python lab/pointwise_bench.py --threads 1 --repeat 5 --epilogue \
        --models mobilenet_v2 efficientnet_b0
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_kernels
from tvm_costfuse.schedules import columns, gemm

from tvm_costfuse.measurement.timing import call_sampler, geomean, interleave, run, vm_sampler
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target

VARIANTS = ("merged", "row", "channels")


def module(case, rng, epilogue: bool):
    """The 1x1 conv (+ bias + ReLU6) as Relax, its input, and a PyTorch callable."""
    import torch

    x = rng.standard_normal(case.x, dtype=np.float32)
    w = (rng.standard_normal(case.w) / math.sqrt(case.w[1])).astype(np.float32)
    bias = rng.standard_normal((case.w[0], 1, 1), dtype=np.float32)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(case.x, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            out = bb.emit(relax.op.nn.conv2d(xv, relax.const(w)))
            if epilogue:
                out = bb.emit(relax.op.add(out, relax.const(bias)))
                out = bb.emit(relax.op.clip(out, 0.0, 6.0))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    tx, tw, tb = (torch.from_numpy(a) for a in (x, w, bias))

    def peer():
        with torch.no_grad():
            y = torch.nn.functional.conv2d(tx, tw)
            return torch.clamp(y + tb, 0.0, 6.0) if epilogue else y

    return bb.get(), {"x": x}, peer


def build(mod, inputs, ref, target, variant: str):
    """``merged``: the GEMM kernel over merged pixels; ``row``: over image rows; ``channels``:
    the GEMM kernel refused, so the direct conv kernel (``conv.py``) vectorizes channels."""
    mergeable, gemm_schedule = columns.mergeable, gemm.schedule
    if variant == "row":
        columns.mergeable = lambda *a: None
    if variant == "channels":
        gemm.schedule = lambda *a: None
    try:
        ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target),
                         tir_pipeline=tir_pipeline())
    finally:
        columns.mergeable, gemm.schedule = mergeable, gemm_schedule
    got = run(ex, inputs)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
    return ex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mobilenet_v2"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cases", nargs="*", help="substrings of case names to keep")
    ap.add_argument("--epilogue", action="store_true", help="+ bias + ReLU6")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    seen, cases = set(), []
    for c in bench_kernels.corpus_convs(args.models):
        key = (c.x, c.w)
        if c.w[2:] == (1, 1) and c.groups == 1 and c.stride == 1 and key not in seen:
            seen.add(key)
            cases.append(c)
    if args.cases:
        cases = [c for c in cases if any(s in c.name for s in args.cases)]
    rng = np.random.default_rng(0)
    samplers = {}
    for case in cases:
        mod, inputs, peer = module(case, rng, args.epilogue)
        ref = peer().numpy()
        for variant in VARIANTS:
            ex = build(mod, inputs, ref, target, variant)
            samplers[(case.name, variant)] = vm_sampler(ex, inputs)
        samplers[(case.name, "torch")] = call_sampler(peer)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"target {target}  threads={args.threads}  repeat={args.repeat}  "
          f"epilogue={args.epilogue}  load {load}")
    samples = interleave(samplers, args.repeat)
    print(f"{'case':44s} {'merged ms':>9s} {'row ms':>8s} {'chan ms':>8s} {'torch ms':>8s} "
          f"{'mrg GF/s':>8s} {'mrg/torch':>9s} {'row/torch':>9s} {'chan/torch':>10s}")
    speed = {v: [] for v in VARIANTS}
    for case in cases:
        med = {v: float(np.median(samples[(case.name, v)])) for v in (*VARIANTS, "torch")}
        for v in VARIANTS:
            speed[v].append(med["torch"] / med[v])
        name = f"{case.name}_to{case.w[0]}"
        print(f"{name:44s} {med['merged'] * 1e3:9.3f} {med['row'] * 1e3:8.3f} "
              f"{med['channels'] * 1e3:8.3f} {med['torch'] * 1e3:8.3f} "
              f"{case.flops() / med['merged'] / 1e9:8.1f} {speed['merged'][-1]:9.2f} "
              f"{speed['row'][-1]:9.2f} {speed['channels'][-1]:10.2f}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print("geomean speed vs torch: " + ", ".join(
        f"{v} {geomean(speed[v]):.2f}" for v in VARIANTS) + f"  load {load}")


if __name__ == "__main__":
    main()
