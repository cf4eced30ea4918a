"""A/B of ``depthwise.unroll_short_row`` in the channel chain: the chain's kernel built with
the stride-2 plane's half-column loop as it was (a loop) and unrolled, one process,
interleaved, 7 rounds, outputs compared bit for bit. The first argument is an LLVM ``mcpu``
(``host`` for this host's), then cases as ``IC,CM,SIZE,K,STRIDE`` (``lab/chain_ab.py``'s)::

    python3 lab/chain_unroll_ab.py host 64,384,14,3,2 96,576,14,3,2
    python3 lab/chain_unroll_ab.py haswell 64,384,14,3,2 96,576,14,3,2
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tvm
from tvm import relax
from tvm_costfuse.schedules import depthwise

from tvm_costfuse.pipelines import scheduled_pipeline
from tvm_costfuse.targets import host_target

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chain_ab import block, groups_pass


def main() -> None:
    mcpu, cases = sys.argv[1], sys.argv[2:]
    target = host_target(1) if mcpu == "host" else tvm.target.Target(
        {"kind": "llvm", "mcpu": mcpu, "num-cores": 1})
    tvm.get_global_func("runtime.config_threadpool")(1, 1)
    unrolled = depthwise.unroll_short_row
    for case in cases:
        mod, x = block(*(int(v) for v in case.split(",")), np.random.default_rng(0))
        vms = {}
        for name, fn in (("loop", lambda *a: None), ("unrolled", unrolled)):
            depthwise.unroll_short_row = fn
            try:
                ex = tvm.compile(mod, target, relax_pipeline=scheduled_pipeline(
                    target, groups_pass(False)))
            finally:
                depthwise.unroll_short_row = unrolled
            vms[name] = relax.VirtualMachine(ex, tvm.cpu())
        xt = tvm.runtime.tensor(x)
        outs = {k: vm["main"](xt).numpy() for k, vm in vms.items()}
        assert np.array_equal(outs["loop"], outs["unrolled"]), case
        times = {k: [] for k in vms}
        for _ in range(7):
            for k, vm in vms.items():
                times[k].append(vm.time_evaluator("main", tvm.cpu(), number=20)(xt).mean)
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        print(f"{mcpu} {case}: loop {med['loop']:.3f} ms, unrolled {med['unrolled']:.3f} ms, "
              f"loop / unrolled {med['loop'] / med['unrolled']:.3f}", flush=True)


if __name__ == "__main__":
    main()
