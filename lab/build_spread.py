"""The same plan compiled several times: how much do separate builds differ in measured time?

Why: on this 2-vCPU VM, identical partitions measured up to ~10% apart between benchmark runs.
This times ``--builds`` independent compilations of each given strategy, all interleaved in one
process (median and range of ``--repeat`` samples each): a spread between builds of one
strategy is placement (code, constants, buffers), not fusion, and is why ``bench_cpu.py``
samples several builds; two strategies with the same partition should overlap.

    TVM_COSTFUSE_CALIBRATION=none python lab/build_spread.py gpt2_block costfuse --builds 4
    TVM_COSTFUSE_CALIBRATION=none python lab/build_spread.py layernorm_mlp tvm costfuse
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm

from tvm_costfuse import models
from tvm_costfuse.measurement.timing import interleaved_samples
from tvm_costfuse.strategies import STRATEGIES, strategy_pipeline
from tvm_costfuse.targets import host_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=models.zoo.names())
    ap.add_argument("strategies", nargs="+", choices=STRATEGIES)
    ap.add_argument("--builds", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    target = host_target()
    mod, inputs = models.load(args.model)
    builds = {(strategy, b): tvm.compile(mod, target=target,
                                         relax_pipeline=strategy_pipeline(strategy, target))
              for strategy in args.strategies for b in range(args.builds)}
    samples = interleaved_samples(builds, inputs, repeat=args.repeat)
    for strategy in args.strategies:
        medians = []
        for b in range(args.builds):
            s = samples[(strategy, b)]
            medians.append(float(np.median(s)))
            print(f"{strategy} build {b}: median {medians[-1] * 1e3:.3f} ms  "
                  f"(samples {min(s) * 1e3:.3f}-{max(s) * 1e3:.3f})")
        print(f"{args.model} {strategy}: builds' medians {min(medians) * 1e3:.3f}-"
              f"{max(medians) * 1e3:.3f} ms, span {100 * (max(medians) / min(medians) - 1):.1f}%")


if __name__ == "__main__":
    main()
