"""Build every synthetic program (full size) under no fusion, FuseOps and CostFuse with our CPU
schedules, and check each against the unfused outputs.

Why: the random programs combine ops in ways the zoo does not (an epilogue member read outside
its kernel, transposed norms, reductions in a row); a strategy that cannot build one, or builds
it wrong, is a bug. Exits non-zero on any failure or mismatch.

    TVM_COSTFUSE_CALIBRATION=none python scripts/check_synthetic.py [SEED ...]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tvm

from tvm_costfuse import models
from tvm_costfuse.measurement.timing import max_mismatch, run
from tvm_costfuse.strategies import strategy_pipeline
from tvm_costfuse.targets import host_target

STRATEGIES = ("tvm", "costfuse")
PROGRAMS = 40  # synth-0 .. synth-39: the measured set


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seeds", nargs="*", type=int, help=f"default: 0 .. {PROGRAMS - 1}")
    args = ap.parse_args()
    target = host_target()
    bad = 0
    for seed in args.seeds or range(PROGRAMS):
        name = f"synth-{seed}"
        mod, inputs = models.load(name)
        try:
            ref = run(tvm.compile(mod, target=target,
                                  relax_pipeline=strategy_pipeline("none", target)), inputs)
            errs = {s: max_mismatch(ref, run(tvm.compile(
                mod, target=target, relax_pipeline=strategy_pipeline(s, target)), inputs))
                for s in STRATEGIES}
        except Exception as err:  # noqa: BLE001 -- a failed build is a reported result
            bad += 1
            print(f"{name}: FAILED {type(err).__name__}: {str(err).splitlines()[-1][:300]}")
            continue
        finite = all(np.isfinite(r).all() for r in ref)
        ok = finite and all(e <= 1.0 for e in errs.values())  # within rtol 1e-4 / atol 1e-5
        bad += not ok
        print(f"{name}: " + ", ".join(f"{s} mismatch {e:.3g}" for s, e in errs.items())
              + ("" if finite else ", NON-FINITE reference") + ("" if ok else "  <-- BAD"),
              flush=True)
    print(f"{bad} bad of {len(args.seeds) or PROGRAMS}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
