"""The fused attention kernel as the code stands ("new") against the same kernel built with
module attributes set otherwise ("old", ``plan_ab.py``'s ``--old``), the split kernels beside
them, interleaved at the given thread count; outputs compared. Cases as
``scripts/bench_attention.py``'s (``B,H,S,D,FORM[,ROWS]``)::

    python3 lab/attention_kernel_ab.py --threads 1 --old MODULE.ATTR=EXPR 1,12,128,64,masked
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from bench_attention import _builds
from plan_ab import _parse, overridden

from tvm_costfuse.measurement.peers import thread_pool
from tvm_costfuse.measurement.timing import interleave, run, vm_sampler
from tvm_costfuse.targets import host_target
from tvm_costfuse.testing import attention_program


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="B,H,S,D,FORM[,ROWS]")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--old", action="append", required=True, metavar="MODULE[.OBJECT].ATTR=EXPR")
    args = ap.parse_args()
    settings = [_parse(s) for s in args.old]
    target = host_target(args.threads)
    thread_pool(args.threads)
    for case in args.cases:
        b, h, s, d, form, *rows = case.split(",")
        mod, inputs = attention_program(int(b), int(h), int(s), int(d), form,
                                        rows=int(rows[0]) if rows else None)
        new, split = _builds(mod, target)
        with overridden(settings):
            old, _ = _builds(mod, target)
        ref = run(split, inputs)[0]
        for ex in (new, old):
            np.testing.assert_allclose(run(ex, inputs)[0], ref, rtol=1e-4, atol=1e-5)
        samples = interleave({"old": vm_sampler(old, inputs), "new": vm_sampler(new, inputs),
                              "split": vm_sampler(split, inputs)}, args.repeat)
        med = {k: float(np.median(v)) * 1e6 for k, v in samples.items()}
        print(f"{case} threads={args.threads} "
              + " ".join(f"{k}={v:.1f}us" for k, v in med.items())
              + f" old/new={med['old'] / med['new']:.3f}", flush=True)


if __name__ == "__main__":
    main()
