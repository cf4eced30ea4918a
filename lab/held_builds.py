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
from tvm_costfuse.measurement.peers import thread_pool, with_threads
from tvm_costfuse.measurement.quiet import OtherLoad
from tvm_costfuse.measurement.timing import interleave, vm_sampler
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

    def sampler(ex):
        return with_threads(vm_sampler(ex, inputs), args.threads)

    def phase(name, samplers):
        t0 = time.perf_counter()
        with OtherLoad() as load:
            got = interleave(samplers, args.repeat)
        cells = ", ".join(f"{k} {np.median(v) * 1e3:.3f}" for k, v in got.items()
                          if k in ("A", "B"))
        rest = [np.median(v) * 1e3 for k, v in got.items() if k not in ("A", "B")]
        extra = (f"; held builds {min(rest):.3f}-{max(rest):.3f} (median "
                 f"{np.median(rest):.3f})" if rest else "")
        print(f"{name}: {cells} ms{extra} [{time.perf_counter() - t0:.0f} s, other load "
              f"{load.cores:.2f} cores]", flush=True)

    a, b = build(), build()
    base = {"A": sampler(a), "B": sampler(b)}
    phase("1 alone", base)
    held = [build() for _ in range(args.held)]
    phase(f"2 with {args.held} held, idle", base)
    phase(f"3 all {args.held + 2} interleaved",
          {**base, **{f"h{i}": sampler(ex) for i, ex in enumerate(held)}})
    phase("4 alone again", base)


if __name__ == "__main__":
    main()
