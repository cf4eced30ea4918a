import sys, time, numpy as np, tvm
from tvm_costfuse import host_target, strategy_pipeline, tir_pipeline
from tvm_costfuse.models import corpus
from tvm_costfuse.measurement.timing import run, vm_sampler, interleave
threads = int(sys.argv[1])
target = host_target(threads)
tvm.get_global_func("runtime.config_threadpool")(1, threads)
for name in sys.argv[2:]:
    mod, inputs, _ = corpus.load(name)
    exs = {}
    for strat, cfg in (("tvm", {}), ("never", {"costfuse.layout": "never"}), ("always", {"costfuse.layout": "always"}), ("cost", {})):
        with tvm.transform.PassContext(opt_level=3, config=cfg):
            exs[strat] = tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm" if strat == "tvm" else "costfuse", target), tir_pipeline=tir_pipeline())
    ref = run(exs["tvm"], inputs)[0]
    err = {k: float(np.abs(run(ex, inputs)[0] - ref).max() / np.abs(ref).max()) for k, ex in exs.items()}
    s = interleave({k: vm_sampler(ex, inputs) for k, ex in exs.items()}, 5)
    med = {k: np.median(v) * 1e3 for k, v in s.items()}
    print(f"{name:20s} " + " ".join(f"{k} {v:7.3f}" for k, v in med.items()) + f"  always/never {med['never']/med['always']:.2f}x  cost/never {med['never']/med['cost']:.2f}x  maxerr {max(err.values()):.1e}", flush=True)
