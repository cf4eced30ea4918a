"""Does a process holding many builds time a plan slower, and does interleaving many builds?

`costfuse regret` timed llama_decode1024's CostFuse plan 10-30% slower than `lab/plan_ab.py`
did the same hour (docs/log/2026-12-06i.md). This times two builds of one plan (A, B) in four
phases of one process, each ``--repeat`` interleaved rounds:

1. A and B alone;
2. A and B again, after ``--held`` more builds of the same plan are compiled and kept;
3. A, B and every held build interleaved (as regret's second round does);
4. A and B alone again.

    python lab/held_builds.py llama_decode1024 --threads 1 --held 12 --repeat 7
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tvm

from tvm_costfuse import host_target, strategy_pipeline, tir_pipeline
from tvm_costfuse.measurement.peers import thread_pool, time_builds
from tvm_costfuse.models import corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--held", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--strategy", default="costfuse")
    args = ap.parse_args()
    mod, inputs, _ = corpus.load(args.model)
    target = host_target(args.threads)
    thread_pool(args.threads)

    def build():
        return tvm.compile(mod, target=target,
                           relax_pipeline=strategy_pipeline(args.strategy, target),
                           tir_pipeline=tir_pipeline(args.strategy))

    def phase(name, builds):
        t0 = time.perf_counter()
        ms, load = time_builds(builds, inputs, args.threads, args.repeat)
        rest = ms.get("held", [])
        extra = (f"; held builds {min(rest):.3f}-{max(rest):.3f} (median "
                 f"{np.median(rest):.3f})" if rest else "")
        print(f"{name}: A {ms['A'][0]:.3f}, B {ms['B'][0]:.3f} ms{extra} "
              f"[{time.perf_counter() - t0:.0f} s, other load {load:.2f} cores]", flush=True)

    base = {"A": [build()], "B": [build()]}
    phase("1 alone", base)
    held = [build() for _ in range(args.held)]
    phase(f"2 with {args.held} held, idle", base)
    phase(f"3 all {args.held + 2} interleaved", {**base, "held": held})
    phase("4 alone again", base)

if __name__ == "__main__":
    main()
