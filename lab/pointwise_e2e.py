"""Corpus CNNs end to end with CostFuse, with and without the merged-column pointwise kernel,
next to ONNX Runtime and PyTorch eager, interleaved in one process at one thread count.

"before" undoes the change in-process: ``columns.mergeable`` answers None (each image row is
its own padded column tile, as before), the row tiles are never put outermost
(``gemm._CACHED_STREAM_BYTES = 0``) and the GEMM kernel is priced with the old constants
(``K0_GEMM = 28``, ``E_PATH["gemm"] = 0.78``), and the contraction rule keeps its epilogue's
divisions (``contraction.reciprocal_divisions`` is the identity). Both builds are checked
against each other::

    TVM_COSTFUSE_CALIBRATION=none python lab/pointwise_e2e.py \
        --models mobilenet_v2 efficientnet_b0 --threads 1 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import tvm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_corpus
from tvm_costfuse.schedules import columns, contraction, efficiency, gemm

from tvm_costfuse.measurement.timing import call_sampler, interleave, run, vm_sampler
from tvm_costfuse.models import corpus
from tvm_costfuse.strategies import strategy_pipeline
from tvm_costfuse.targets import host_target


def _build(mod, target, before: bool):
    saved = (columns.mergeable, gemm._CACHED_STREAM_BYTES, efficiency.K0_GEMM,
             dict(efficiency.E_PATH), contraction.reciprocal_divisions)
    if before:
        contraction.reciprocal_divisions = lambda func: func
        columns.mergeable = lambda *a: None
        gemm._CACHED_STREAM_BYTES = 0
        efficiency.K0_GEMM = 28.0
        efficiency.E_PATH["gemm"] = 0.78
    efficiency.fraction_of_peak.cache_clear()
    try:
        return tvm.compile(mod, target=target,
                           relax_pipeline=strategy_pipeline("costfuse", target))
    finally:
        columns.mergeable, gemm._CACHED_STREAM_BYTES, efficiency.K0_GEMM = saved[:3]
        efficiency.E_PATH.update(saved[3])
        contraction.reciprocal_divisions = saved[4]
        efficiency.fraction_of_peak.cache_clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mobilenet_v2"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    print(f"target {target}  threads={args.threads}  repeat={args.repeat}")
    print("| model | before ms | after ms | ort ms | torch ms | before/ort speed | "
          "after/ort speed | kernels before / after | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            mod, inputs, module = corpus.load(name, small=False)
            samplers, kernels, outs = {}, {}, {}
            for variant in ("before", "after"):
                ex = _build(mod, target, variant == "before")
                calls: list[str] = []
                outs[variant] = run(ex, inputs, calls=calls)[0]
                kernels[variant] = len(calls)
                samplers[variant] = vm_sampler(ex, inputs)
            np.testing.assert_allclose(outs["after"], outs["before"], rtol=1e-3,
                                       atol=1e-3 * float(np.abs(outs["before"]).max()))
            targs = corpus.torch_inputs(inputs)
            samplers["torch"] = bench_corpus._torch_sampler(module, targs, args.threads)
            sess = bench_corpus._ort_session(module, targs, list(inputs), args.threads,
                                             os.path.join(tmp, f"{name}.onnx"))
            feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs.values(), strict=True)}
            samplers["ort"] = call_sampler(lambda sess=sess, feed=feed: sess.run(None, feed))
            med = {k: float(np.median(v)) * 1e3
                   for k, v in interleave(samplers, args.repeat).items()}
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"| {name} | {med['before']:.2f} | {med['after']:.2f} | {med['ort']:.2f} | "
                  f"{med['torch']:.2f} | {med['ort'] / med['before']:.2f}x | "
                  f"{med['ort'] / med['after']:.2f}x | {kernels['before']} / "
                  f"{kernels['after']} | {load} |", flush=True)


if __name__ == "__main__":
    main()
