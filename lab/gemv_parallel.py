"""One matmul ``x[M, K] @ W[K, N]`` (constant weights) built with its tile loop serial and
parallel, timed interleaved at the given thread count: where the thread pool's wake-up pays
(``schedules._common.contraction_parallel``)::

    python3 lab/gemv_parallel.py --threads 2 1,768,128 1,768,256 1,256,256
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm import relax

import tvm_costfuse.schedules._loops as loops
from tvm_costfuse import strategy_pipeline, tir_pipeline
from tvm_costfuse.measurement.peers import thread_pool
from tvm_costfuse.measurement.timing import interleave, vm_sampler
from tvm_costfuse.targets import host_target


def matmul(m: int, k: int, n: int, rng) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((n, k)).astype("float32"))
            y = bb.emit_output(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w))))
        bb.emit_func_output(y)
    return bb.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="M,K,N")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    thread_pool(args.threads)
    target = host_target(args.threads)
    for case in args.cases:
        m, k, n = map(int, case.split(","))
        rng = np.random.default_rng(0)
        mod = matmul(m, k, n, rng)
        builds = {}
        saved = loops.contraction_parallel
        for label, parallel in (("serial", False), ("parallel", True)):
            loops.contraction_parallel = lambda *_a, p=parallel: p
            try:
                builds[label] = tvm.compile(mod, target=target,
                                            relax_pipeline=strategy_pipeline("costfuse", target),
                                            tir_pipeline=tir_pipeline())
            finally:
                loops.contraction_parallel = saved
        inputs = {"x": rng.standard_normal((m, k)).astype("float32")}
        samples = interleave({k: vm_sampler(ex, inputs) for k, ex in builds.items()},
                             args.repeat)
        us = {k: float(np.median(v)) * 1e6 for k, v in samples.items()}
        print(f"{case} threads={args.threads} weights={k * n * 4 / 1024:.0f}KiB "
              f"fmas={m * k * n} serial={us['serial']:.2f}us parallel={us['parallel']:.2f}us "
              f"serial/parallel={us['serial'] / us['parallel']:.2f}", flush=True)


if __name__ == "__main__":
    main()
