"""The layout step end to end: FuseOps, and CostFuse with ``costfuse.layout`` never, always
and cost, on corpus models at one thread count, interleaved rounds, one build each; outputs
checked against FuseOps' (max relative error printed)::

    python lab/layout_ab.py 1 mobilenet_v2 efficientnet_b0 segformer resnet50
"""

import sys

import numpy as np
import tvm

from tvm_costfuse import host_target, strategy_pipeline, tir_pipeline
from tvm_costfuse.measurement.timing import interleave, run, vm_sampler
from tvm_costfuse.models import corpus

VARIANTS = (("tvm", {}), ("never", {"costfuse.layout": "never"}),
            ("always", {"costfuse.layout": "always"}), ("cost", {"costfuse.layout": "cost"}))


def main() -> None:
    threads = int(sys.argv[1])
    target = host_target(threads)
    tvm.get_global_func("runtime.config_threadpool")(1, threads)
    for name in sys.argv[2:]:
        mod, inputs, _ = corpus.load(name)
        exs = {}
        for variant, config in VARIANTS:
            strategy = "tvm" if variant == "tvm" else "costfuse"
            with tvm.transform.PassContext(opt_level=3, config=config):
                exs[variant] = tvm.compile(mod, target,
                                           relax_pipeline=strategy_pipeline(strategy, target),
                                           tir_pipeline=tir_pipeline())
        ref = run(exs["tvm"], inputs)[0]
        err = max(float(np.abs(run(ex, inputs)[0] - ref).max() / np.abs(ref).max())
                  for ex in exs.values())
        samples = interleave({k: vm_sampler(ex, inputs) for k, ex in exs.items()}, 5)
        med = {k: float(np.median(v)) * 1e3 for k, v in samples.items()}
        print(f"{name:20s} " + " ".join(f"{k} {v:7.3f}" for k, v in med.items())
              + f"  always/never {med['never'] / med['always']:.2f}x  cost/never "
              f"{med['never'] / med['cost']:.2f}x  maxerr {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
