"""A/B: CostFuse planned with the analytical model's L2 tier (``analytical.private_cache``) and
without it (undone in-process), FuseOps, on the calibrated host description, interleaved.

    python lab/l2_tier_ab.py --models bert mobilenet_v2 --threads 1 --repeat 5
"""
import argparse
import os
import sys

import numpy as np
import tvm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from tvm_costfuse.measurement.peers import thread_pool as _thread_pool  # noqa: E402
from tvm_costfuse.measurement.peers import with_threads as _with_threads  # noqa: E402

from tvm_costfuse import host_target, strategy_pipeline  # noqa: E402
from tvm_costfuse.cost import analytical  # noqa: E402
from tvm_costfuse.measurement.quiet import OtherLoad  # noqa: E402
from tvm_costfuse.measurement.timing import interleave, run, vm_sampler  # noqa: E402
from tvm_costfuse.models import corpus  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--models", nargs="+")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--repeat", type=int, default=5)
a = ap.parse_args()
with_l2 = analytical.private_cache
for name in a.models:
    mod, inputs, _ = corpus.load(name)
    t = a.threads
    target = host_target(t)
    _thread_pool(t)
    samplers, kernels = {}, {}
    for label, s, l2 in (("no-l2", "costfuse", False), ("l2", "costfuse", True),
                         ("tvm", "tvm", True)):
        analytical.private_cache = with_l2 if l2 else (lambda target: (0, None))
        ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(s, target))
        calls: list = []
        run(ex, inputs, calls=calls)
        kernels[label] = len(calls)
        samplers[label] = _with_threads(vm_sampler(ex, inputs, min_ms=50), t)
    analytical.private_cache = with_l2
    with OtherLoad() as load:
        timed = interleave(samplers, a.repeat)
    ms = {k: float(np.median(v)) * 1e3 for k, v in timed.items()}
    print(f"{name} t={t} load={load.cores:.2f} kernels={kernels} "
          + " ".join(f"{k}={v:.2f}" for k, v in ms.items())
          + f" l2/no-l2 speed={ms['no-l2'] / ms['l2']:.3f} l2 vs tvm={ms['tvm'] / ms['l2']:.3f}",
          flush=True)
