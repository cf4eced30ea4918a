"""Weight pre-packing on and off, side by side: time and build-to-build spread per model.

Why: ``schedules/prepack.py`` stores constant contraction weights tile-major so a kernel's time
no longer depends on where the allocator put its weight. This compiles each model's FuseOps
plan (the same partition both ways) ``--builds`` times with packing and without, times every
build interleaved in one process (``timing.interleaved_samples``), checks each build's outputs
against TVM's stock build, and prints per variant the median over all samples and the span of
the builds' medians.

    TVM_COSTFUSE_CALIBRATION=none python lab/prepack_effect.py
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm_costfuse.schedules import schedule_pass

from tvm_costfuse import models
from tvm_costfuse.measurement.timing import geomean, interleaved_samples, max_mismatch, run
from tvm_costfuse.pipelines import build_pipeline
from tvm_costfuse.strategies import fusion_pass, strategy_pipeline
from tvm_costfuse.targets import host_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=models.zoo.names(), choices=models.zoo.names())
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    target = host_target()
    print(f"target {target}  builds={args.builds}  repeat={args.repeat}  small={args.small}")
    print(f"{'model':<20}{'unpacked ms':>12}{'span':>8}{'packed ms':>11}{'span':>8}"
          f"{'unpacked/packed':>17}")
    ratios = []
    for name in args.models:
        mod, inputs = models.load(name, small=args.small)
        ref = run(tvm.compile(mod, target, relax_pipeline=strategy_pipeline("stock", target)),
                  inputs)
        builds = {}
        for packed in (False, True):
            for b in range(args.builds):
                pipeline = build_pipeline(target, fusion_pass("tvm", target),
                                          schedule_pass(target, prepack=packed))
                ex = tvm.compile(mod, target, relax_pipeline=pipeline)
                err = max_mismatch(ref, run(ex, inputs))
                if err > 1.0:
                    raise SystemExit(f"{name}: build {b} (packed={packed}) does not match "
                                     f"stock (mismatch {err:.3g})")
                builds[(packed, b)] = ex
        samples = interleaved_samples(builds, inputs, repeat=args.repeat)
        cells = []
        for packed in (False, True):
            per_build = [float(np.median(samples[(packed, b)])) for b in range(args.builds)]
            every = [s for b in range(args.builds) for s in samples[(packed, b)]]
            cells.append((float(np.median(every)), max(per_build) / min(per_build) - 1))
        ratios.append(cells[0][0] / cells[1][0])
        print(f"{name:<20}{cells[0][0] * 1e3:>12.3f}{100 * cells[0][1]:>7.1f}%"
              f"{cells[1][0] * 1e3:>11.3f}{100 * cells[1][1]:>7.1f}%{ratios[-1]:>17.2f}",
              flush=True)
    print(f"geomean unpacked/packed: {geomean(ratios):.2f}x over {len(ratios)} models")


if __name__ == "__main__":
    main()
