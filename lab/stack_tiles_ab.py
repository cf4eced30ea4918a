"""A/B of the "costfuse" TIR pipeline (``schedules/lowering.py``: register tiles on the stack)
against TVM's default TIR pipeline (a workspace allocation per tile), same relax pipeline,
interleaved in one process, outputs compared bit for bit::

    python3 lab/stack_tiles_ab.py --models resnet50 bert --threads 1 --repeat 7
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm

from tvm_costfuse import host_target, strategy_pipeline, tir_pipeline
from tvm_costfuse.measurement.peers import thread_pool, with_threads
from tvm_costfuse.measurement.quiet import OtherLoad
from tvm_costfuse.measurement.timing import interleave, run, vm_sampler
from tvm_costfuse.models import corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--strategies", default="tvm,costfuse")
    args = ap.parse_args()
    strategies = args.strategies.split(",")
    for name in args.models:
        mod, inputs, _ = corpus.load(name)
        target = host_target(args.threads)
        thread_pool(args.threads)
        samplers, outs = {}, {}
        for s in strategies:
            for tir in ("default", tir_pipeline(s)):
                ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(s, target),
                                 tir_pipeline=tir)
                outs[s, tir] = run(ex, inputs)[0]
                samplers[s, tir] = with_threads(vm_sampler(ex, inputs, min_ms=50), args.threads)
            assert np.array_equal(outs[s, "default"], outs[s, tir_pipeline(s)]), (name, s)
        with OtherLoad() as load:
            timed = interleave(samplers, args.repeat)
        ms = {k: float(np.median(v)) * 1e3 for k, v in timed.items()}
        print(f"{name} threads={args.threads} load={load.cores:.2f} " + " ".join(
            f"{s}: {ms[s, 'default']:.2f} -> {ms[s, tir_pipeline(s)]:.2f} ms "
            f"({ms[s, 'default'] / ms[s, tir_pipeline(s)]:.3f}x)" for s in strategies),
            flush=True)


if __name__ == "__main__":
    main()
