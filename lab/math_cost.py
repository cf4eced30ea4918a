"""Per-element cost of each math call in a scheduled CPU kernel, vectorized and libm.

Why: ``schedules/math_calls.MATH_COST`` prices math calls relative to exp, and the host's
exp (``TargetDesc.exp_seconds``, ``calibrate.math_seconds``) gives exp's time per call. This builds one single-op
kernel per op over ``--elems`` float32 elements with our CPU schedules, with the vectorized
math (``schedules/fast_math``) and without it, times all of them interleaved in one process
(``timing.interleaved_samples``) and prints the median machine-wide ns per element, next to an
add kernel's (the loads and stores every op pays), and each op's time beyond the add's as a
multiple of exp's: the weights of ``MATH_COST``. The default 64K elements stay in L2, so the
math, not DRAM, is what is timed (1M elements timed DRAM: every op read about alike).

    TVM_COSTFUSE_CALIBRATION=none python lab/math_cost.py --threads 1
"""

from __future__ import annotations

import argparse

import numpy as np
from tvm import relax
from tvm.script import relax as R
from tvm_costfuse.schedules import schedule_pass

from tvm_costfuse.measurement.peers import thread_pool
from tvm_costfuse.measurement.timing import build, interleave, vm_sampler
from tvm_costfuse.strategies import no_fusion
from tvm_costfuse.targets import host_target

OPS = {"add": lambda x: relax.op.add(x, x), "exp": relax.op.exp, "sigmoid": relax.op.sigmoid,
       "silu": relax.op.nn.silu, "tanh": relax.op.tanh, "log": relax.op.log,
       "erf": relax.op.erf, "gelu": relax.op.nn.gelu, "gelu_tanh": relax.op.nn.gelu_tanh,
       "softplus": relax.op.nn.softplus, "cos": relax.op.cos}


def _module(op, elems: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((elems // 1024, 1024), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op(x))
        bb.emit_func_output(out)
    return bb.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elems", type=int, default=1 << 16)
    ap.add_argument("--threads", type=int, default=None, help="default: the host's cores")
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    target = host_target(args.threads) if args.threads else host_target()
    # The target's core count does not size TVM's pool: without this a 1-thread run ran on 2.
    thread_pool(int(target.attrs["num-cores"]))
    rng = np.random.default_rng(0)
    inputs = {"x": rng.uniform(0.05, 4.0, (args.elems // 1024, 1024)).astype("float32")}
    samplers = {}
    for name, op in OPS.items():
        for fast in (True, False):
            ex = build(_module(op, args.elems), target, no_fusion,
                       schedule_pass(target, fast_math=fast))
            samplers[(name, fast)] = vm_sampler(ex, inputs)
    samples = interleave(samplers, args.repeat)
    exp_fast = np.median(samples[("exp", True)])
    exp_libm = np.median(samples[("exp", False)])
    add = np.median(samples[("add", True)])
    print(f"target {target}, {args.elems} elements, median of {args.repeat}")
    print(f"{'op':10} {'vector ns/elem':>15} {'libm ns/elem':>13} {'vector / exp':>13} "
          f"{'beyond add':>11}")
    for name in OPS:
        fast, libm = (np.median(samples[(name, f)]) for f in (True, False))
        print(f"{name:10} {fast / args.elems * 1e9:15.3f} {libm / args.elems * 1e9:13.3f} "
              f"{fast / exp_fast:13.2f} {(fast - add) / (exp_fast - add):11.2f}")
    print(f"exp libm / vector: {exp_libm / exp_fast:.1f}x whole, "
          f"{(exp_libm - add) / (exp_fast - add):.1f}x beyond add")


if __name__ == "__main__":
    main()
