"""A/B: bert's GELU kernel (128 x 3072) with erf in its earlier form against the current one
and PyTorch's ``gelu``, interleaved at one thread count.

The earlier form ("exp-far") computed erf's far branch as ``1 - exp(Q(|x| - 2.515))`` with
``log(erfc)`` fitted by a degree-8 polynomial and the exp without clamps, split at |x| = 1.1
from a degree-6 near branch, and tested NaN on the bits; it is kept here so the comparison stays
runnable.
The current form is ``schedules.fast_math.fast_erf``. Both are built in-process from the same
PrimFunc; outputs are checked against a float64 GELU.

    python lab/erf_form_ab.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TVM_COSTFUSE_CALIBRATION", "none")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402
from tvm import tirx  # noqa: E402

from tvm_costfuse import build_graph, host_target  # noqa: E402
from tvm_costfuse.measurement.timing import interleave  # noqa: E402
from tvm_costfuse.models import corpus  # noqa: E402
from tvm_costfuse.pipelines import prepare  # noqa: E402
from tvm_costfuse.schedules import fast_math as fm  # noqa: E402
from tvm_costfuse.schedules import schedule_pass  # noqa: E402
from tvm_costfuse.tuning.feedback import group_kernel_and_outputs  # noqa: E402

_OLD_P = (0.12837916612625122, -0.3761259913444519, 0.1128329187631607,
          -0.02684144116938114, 0.00516486307606101, -0.0007805791683495045,
          7.187995652202517e-05)
_OLD_Q = (-7.887318134307861, -5.381004810333252, -0.9443793892860413,
          -0.01072943676263094, 0.002133917063474655, -0.00041336598224006593,
          7.599671516800299e-05, -1.307680122408783e-05, 1.6176786630239803e-06)


def _exp_of_log_erfc(t):
    """exp(t) for t in [-17.4, -1.7]: ``fast_exp`` without its clamps and NaN test."""
    return fm._let(tirx.floor(t * fm._f(fm._LOG2E) + fm._f(0.5)), lambda n: fm._let(
        t - n * fm._f(fm._LN2_HI) - n * fm._f(fm._LN2_LO), lambda r: (
            fm._horner(r, fm._EXP_P) * r * r + r + fm._f(1.0)) * fm._pow2(
                tirx.Cast("int32", n)), "r"), "n")


def exp_far_erf(x):
    """erf as ``fast_math`` computed it before the far branch became a polynomial."""
    def body(a):
        near = a + a * fm._horner(a * a, _OLD_P)
        far = fm._f(1.0) - _exp_of_log_erfc(fm._horner(a - fm._f(2.515), _OLD_Q))
        return tirx.Select(a < fm._f(1.1), near,
                           tirx.Select(a < fm._f(3.92), far, fm._f(1.0)))
    return fm._let(x, lambda v: fm._keep_nan(
        v, fm._copysign(fm._let(tirx.abs(v), body, "a"), v)), "x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    tgt = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    torch.set_num_threads(args.threads)
    mod, _, _ = corpus.load("bert")
    prep = prepare(mod, tgt)
    func, _ = group_kernel_and_outputs(prep, build_graph(prep), ["lv94"])  # the GELU group
    shape = [int(d) for d in func.params[0].shape]
    x = np.random.default_rng(0).uniform(-6, 6, shape).astype("float32")
    ref = torch.nn.functional.gelu(torch.from_numpy(x).double()).numpy()
    current = fm.FAST_MATH["tirx.erf"]
    samplers = {}
    dev = tvm.cpu()
    try:
        for label, erf in (("exp-far", exp_far_erf), ("current", current)):
            fm.FAST_MATH["tirx.erf"] = erf
            with tgt:
                m = schedule_pass(tgt)(tvm.IRModule({"main": func.with_attr("global_symbol",
                                                                             "main")}))
            rt = tvm.compile(m, target=tgt).mod
            out = [tvm.runtime.tensor(np.zeros([int(d) for d in p.shape], "float32"), dev)
                   for p in list(m["main"].params)[1:]]
            call = [tvm.runtime.tensor(x, dev), *out]
            rt["main"](*call)
            print(f"{label}: max |gelu - float64 gelu| = "
                  f"{float(np.abs(out[-1].numpy() - ref).max()):.2e}")
            f = rt.time_evaluator("main", dev, number=5, repeat=1, min_repeat_ms=50)
            samplers[label] = lambda f=f, a=call: f(*a).mean
    finally:
        fm.FAST_MATH["tirx.erf"] = current
    tx = torch.from_numpy(x)

    def torch_gelu() -> float:
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < 0.05:
            torch.nn.functional.gelu(tx)
            n += 1
        return (time.perf_counter() - start) / n

    samplers["torch"] = torch_gelu
    times = interleave(samplers, args.rounds)
    print(f"{args.threads} thread(s), median of {args.rounds} interleaved rounds:")
    for label, values in times.items():
        print(f"  {label:8s} {np.median(values) * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
