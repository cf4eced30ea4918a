"""A/B: bert's GELU kernel with erf's far branch through the general ``fast_exp`` ("old",
rebuilt in-process) against ``_exp_of_log_erfc`` ("new"), 1 thread, interleaved.

    python scripts/research/erf_branch_ab.py
"""
import os, sys
os.environ.setdefault("TVM_COSTFUSE_CALIBRATION", "none")
import numpy as np, tvm
from tvm import tirx
from tvm_costfuse.models import corpus
from tvm_costfuse import build_graph, host_target
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.tuning.feedback import group_kernel_and_outputs
from tvm_costfuse.measurement.timing import interleave
from tvm_costfuse.schedules import schedule_pass, fast_math as fm
threads = 1
tgt = host_target(threads); tvm.get_global_func("runtime.config_threadpool")(1, threads)
mod, inputs, _ = corpus.load("bert"); prep = prepare(mod, tgt); g = build_graph(prep)
func, _ = group_kernel_and_outputs(prep, g, ["lv94"])
new = fm.FAST_MATH["tirx.erf"]
def old_erf(x):
    def body(a):
        near = a + a * fm._horner(a * a, fm._ERF_P)
        far = fm._f(1.0) - fm.fast_exp(fm._horner(a - fm._f(fm._ERF_MID), fm._ERF_Q))
        return tirx.Select(a < fm._f(fm._ERF_SPLIT), near, tirx.Select(a < fm._f(fm._ERF_ONE), far, fm._f(1.0)))
    return fm._let(x, lambda v: fm._keep_nan(v, fm._copysign(fm._let(tirx.abs(v), body, "a"), v)), "x")
samplers = {}; outs = {}
x = np.random.uniform(-4, 4, [int(d) for d in func.params[0].shape]).astype("float32")
for label, erf in (("old", old_erf), ("new", new)):
    fm.FAST_MATH["tirx.erf"] = erf
    with tgt:
        m = schedule_pass(tgt)(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
    lib = tvm.compile(m, target=tgt); rt = lib.mod if hasattr(lib, "mod") else lib
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(x, dev), tvm.runtime.tensor(np.zeros([int(d) for d in m["main"].params[-1].shape], "float32"), dev)]
    rt["main"](*args); outs[label] = args[1].numpy().copy()
    f = rt.time_evaluator("main", dev, number=5, repeat=1, min_repeat_ms=50)
    samplers[label] = (lambda f=f, a=args: f(*a).mean)
fm.FAST_MATH["tirx.erf"] = new
print("max |new-old|", float(np.abs(outs["new"] - outs["old"]).max()))
t = interleave(samplers, 9)
print({k: f"{np.median(v)*1e6:.1f} us" for k, v in t.items()})
