"""The corpus's depthwise convolutions: the depthwise kernel against the general contraction
tiling it replaced and PyTorch, interleaved in one process at one thread count.

Shapes are read from the imported corpus models (``bench_kernels.corpus_convs``, groups ==
channels); each is compiled twice, with ``schedules/depthwise.py`` and with its ``analyze``
answering None (the general tiling), checked against PyTorch, then timed in interleaved rounds::

    python lab/depthwise_bench.py --threads 1 --repeat 5 \
        --models mobilenet_v2 mobilenet_v3_large efficientnet_b0 mnasnet1_0 shufflenet_v2_x1_0
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import tvm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_kernels
from tvm_costfuse.schedules import depthwise, efficiency

from tvm_costfuse.measurement.timing import call_sampler, geomean, interleave, run, vm_sampler
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host, host_target


def depthwise_convs(models: list[str], cache: Path | None) -> list[bench_kernels.Conv]:
    """The distinct depthwise convolutions of ``models`` (cached as JSON: importing a model
    costs more than timing its convolutions)."""
    if cache is not None and cache.exists():
        return [bench_kernels.Conv(c["name"], tuple(c["x"]), tuple(c["w"]), c["stride"],
                                   tuple(c["pad"]), c["groups"])
                for c in json.loads(cache.read_text())]
    seen, out = set(), []
    for conv in bench_kernels.corpus_convs(models):
        key = (conv.x, conv.w, conv.stride, conv.pads, conv.groups)
        if conv.groups == conv.x[1] == conv.w[0] and conv.w[1] == 1 and key not in seen:
            seen.add(key)
            out.append(conv)
    if cache is not None:
        cache.write_text(json.dumps([{"name": c.name, "x": c.x, "w": c.w, "stride": c.stride,
                                      "pad": c.pads, "groups": c.groups} for c in out]))
    return out


def build(case, rng, target, general: bool, tir: str | None = None):
    """The compiled conv of ``case`` (general tiling when ``general``; ``tir``: the TIR
    pipeline, ours by default), checked."""
    mod, inputs, ref, arrays = bench_kernels.conv_module(case, rng)
    analyze = depthwise.analyze
    if general:
        depthwise.analyze = lambda *a: None
    try:
        ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target),
                         tir_pipeline=tir or tir_pipeline())
    finally:
        depthwise.analyze = analyze
    got = run(ex, inputs)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
    return ex, inputs, arrays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mobilenet_v2"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cases", nargs="*", help="substrings of case names to keep")
    ap.add_argument("--cache", type=Path, default=None, help="JSON list of the shapes")
    ap.add_argument("--no-general", action="store_true", help="skip the general tiling")
    ap.add_argument("--tir-ab", action="store_true",
                    help="the general column is the depthwise kernel under TVM's default TIR "
                         "pipeline (a workspace call per tile) instead of the general tiling")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    cases = depthwise_convs(args.models, args.cache)
    if args.cases:
        cases = [c for c in cases if any(s in c.name for s in args.cases)]
    rng = np.random.default_rng(0)
    samplers = {}
    for case in cases:
        variants = ("dw",) if args.no_general else ("dw", "general")
        for variant in variants:
            if args.tir_ab:
                ex, inputs, arrays = build(case, rng, target, False,
                                           "default" if variant == "general" else None)
            else:
                ex, inputs, arrays = build(case, rng, target, variant == "general")
            samplers[(case.name, variant)] = vm_sampler(ex, inputs)
        samplers[(case.name, "torch")] = call_sampler(bench_kernels.torch_call(case, arrays))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"target {target}  threads={args.threads}  repeat={args.repeat}  load {load}")
    samples = interleave(samplers, args.repeat)
    print(f"{'case':48s} {'dw ms':>8s} {'gen ms':>8s} {'torch ms':>8s} {'dw GF/s':>8s} "
          f"{'dw/torch':>8s} {'gen/torch':>9s}")
    ratios, before = [], []
    for case in cases:
        med = {v: float(np.median(samples[(case.name, v)])) for v in ("dw", "general", "torch")
               if (case.name, v) in samples}
        gen = med.get("general", float("nan"))
        ratios.append(med["torch"] / med["dw"])
        before.append(med["torch"] / gen)
        print(f"{case.name:48s} {med['dw'] * 1e3:8.3f} {gen * 1e3:8.3f} "
              f"{med['torch'] * 1e3:8.3f} {case.flops() / med['dw'] / 1e9:8.1f} "
              f"{ratios[-1]:8.2f} {before[-1]:9.2f}")
    peak = host(args.threads).peak("float32")
    shares: dict[int, list[float]] = {}
    for case in cases:
        taps = math.prod(case.w[2:])
        dw = float(np.median(samples[(case.name, "dw")]))
        shares.setdefault(case.stride, []).append(
            case.flops() / dw / peak / (taps / (taps + efficiency.K0)))
    print("E_DEPTHWISE fit (share of peak over K / (K + K0), geomean by stride): "
          + ", ".join(f"stride {s} {geomean(v):.3f} ({len(v)} shapes)"
                      for s, v in sorted(shares.items())))
    if args.tir_ab:
        gains: dict[int, list[float]] = {}
        for case in cases:
            gains.setdefault(case.stride, []).append(
                float(np.median(samples[(case.name, "general")]))
                / float(np.median(samples[(case.name, "dw")])))
        print("speed-up of our TIR pipeline over TVM's default, geomean by stride: "
              + ", ".join(f"stride {s} {geomean(v):.3f} ({len(v)} shapes)"
                          for s, v in sorted(gains.items())))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"geomean speed vs torch: depthwise {geomean(ratios):.2f}, general "
          f"{geomean(before) if not args.no_general else float('nan'):.2f}  load {load}")


if __name__ == "__main__":
    main()
