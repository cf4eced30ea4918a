"""How far any plan could go past FuseOps on a model whose contractions already run near the
host's FMA peak: the model's multiply-adds at that peak, against FuseOps and CostFuse timed.

``lab/fusion_bound.py`` takes the unfused contractions' measured time as the floor, which a
kind that changes the contractions themselves (a channel chain keeping its intermediate in
cache, a blocked channel layout) may go under. This floor holds for every plan, layout and
schedule that computes the same convolutions and matmuls directly:

    floor = 2 * sum(multiply-adds of the contractions) / peak
    roof  = t(FuseOps) / floor

where a contraction's multiply-adds are its output elements times its reduction extent, and
``peak`` is the calibration's FMA-chain kernel (``measurement.calibrate.fma_timer``) at the
same thread count, timed interleaved with the models so that the host's drift hits both.
Everything else (pools, normalizations, elementwise work, launches) is taken as free, so the
roof is generous: only a different algorithm (Winograd, FFT: fewer multiply-adds) can pass it.
``spread`` is the slowest sample of either build over its fastest: at 2 threads this host
sometimes runs a build 2x slower for a while (docs/log/2026-12-07c.md), which the interleaved
rounds only cancel where it hits both builds alike.

    python3 lab/compute_floor.py --models resnet50 mobilenet_v2 --threads 1 --repeat 5
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import tvm

from tvm_costfuse import models
from tvm_costfuse.cost.features import op_class
from tvm_costfuse.graph import build_graph
from tvm_costfuse.measurement.calibrate import fma_timer
from tvm_costfuse.measurement.peers import thread_pool, with_threads
from tvm_costfuse.measurement.timing import geomean, interleave, vm_sampler
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target, isa

STRATEGIES = ("tvm", "costfuse")


def contraction_flops(mod: tvm.IRModule, target) -> tuple[float, float]:
    """(2 x multiply-adds of the contractions, the part of them with a reduction extent of at
    most 49: depthwise convolutions, stems, 1x1 convolutions of few input channels, matmuls
    over short rows) over the legalized, unfused graph."""
    total = small = 0.0
    for node in build_graph(prepare(mod, target)).nodes:
        if op_class(node) != "contraction":
            continue
        out = sum(int(np.prod(t.shape)) for t in node.outputs)
        flops = 2.0 * out * node.reduction_extent
        total += flops
        if node.reduction_extent <= 49:
            small += flops
    return total, small


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--builds", type=int, default=1)
    args = ap.parse_args()
    target = host_target(args.threads)
    thread_pool(args.threads)
    # built once: the peak is timed in every round, seconds per FLOP as the models' samples
    peak_flops, peak_timer = fma_timer(isa.vector_bits(target) // 32, args.threads, target,
                                       1 << 14)
    print(f"target {target}, load average {os.getloadavg()[0]:.2f}")
    print(f"{'model':<20}{'GFLOP':>7}{'small':>7}{'peak GF/s':>10}{'floor ms':>9}"
          f"{'tvm ms':>9}{'costfuse ms':>12}{'tvm/cf':>8}{'roof':>7}{'cf share':>9}{'spread':>8}")
    roofs, achieved, shares = [], [], []
    for name in args.models:
        mod, inputs = models.load(name)
        flops, small = contraction_flops(mod, target)
        samplers = {s: [with_threads(vm_sampler(tvm.compile(
            mod, target, relax_pipeline=strategy_pipeline(s, target), tir_pipeline=tir_pipeline(
                s)), inputs), args.threads) for _ in range(args.builds)] for s in STRATEGIES}
        samplers["peak"] = [with_threads(lambda: peak_timer(1, 50) / peak_flops, args.threads)]
        samples = interleave(samplers, args.repeat)
        t = {k: float(np.median(v)) for k, v in samples.items()}
        spread = max(max(samples[s]) / min(samples[s]) for s in STRATEGIES)
        peak = 1.0 / t["peak"]
        floor = flops / peak
        roof = t["tvm"] / floor
        ratio = t["tvm"] / t["costfuse"]
        # The share of the headroom over FuseOps that CostFuse's plan takes (0: none, 1: all).
        share = (ratio - 1.0) / (roof - 1.0) if roof > 1.0 else float("nan")
        roofs.append(roof)
        achieved.append(ratio)
        shares.append(share)
        print(f"{name:<20}{flops / 1e9:>7.3f}{small / 1e9:>7.3f}{peak / 1e9:>10.1f}"
              f"{floor * 1e3:>9.3f}{t['tvm'] * 1e3:>9.3f}{t['costfuse'] * 1e3:>12.3f}"
              f"{ratio:>8.3f}{roof:>7.2f}{share:>9.2f}{spread:>8.2f}", flush=True)
    print(f"geomean over {len(roofs)}: tvm/costfuse {geomean(achieved):.3f}x, "
          f"roof {geomean(roofs):.2f}x")


if __name__ == "__main__":
    main()
