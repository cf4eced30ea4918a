"""A/B: CostFuse with unit reshapes as no data movement and CPU contractions walked through views
("new") against both undone in-process ("old"), FuseOps and PyTorch, interleaved.

    python lab/views_ab.py --models bert gpt2 --threads 1 --repeat 7
"""
import argparse, os, sys
os.environ.setdefault("TVM_COSTFUSE_CALIBRATION", "none")
import numpy as np, tvm
import dataclasses
from tvm_costfuse.measurement.peers import thread_pool as _thread_pool, with_threads as _with_threads, eager_sampler
from tvm_costfuse import host_target, strategy_pipeline
from tvm_costfuse.measurement.timing import interleave, run, vm_sampler
from tvm_costfuse.measurement.quiet import OtherLoad
from tvm_costfuse.models import corpus
from tvm_costfuse.cost import extract
from tvm_costfuse.schedules import catalog

ap = argparse.ArgumentParser(); ap.add_argument("--models", nargs="+"); ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--repeat", type=int, default=5); a = ap.parse_args()
new_unit, new_cards = extract._unit_reshape, catalog.CARDS
old_cards = tuple(dataclasses.replace(c, through_views=frozenset()) if c is catalog.CONTRACTION_CARD else c
                  for c in new_cards)
def mode(new):  # "old": no unit reshapes as views, contractions not walked through views
    extract._unit_reshape = new_unit if new else (lambda g, n: False)
    catalog.CARDS = new_cards if new else old_cards
for name in a.models:
    mod, inputs, module = corpus.load(name)
    t = a.threads; target = host_target(t); _thread_pool(t)
    samplers, kernels, outs = {}, {}, {}
    for label, s, new in (("old", "costfuse", False), ("new", "costfuse", True), ("tvm", "tvm", True)):
        mode(new)
        ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(s, target))
        calls = []; out = run(ex, inputs, calls=calls); kernels[label] = len(calls); outs[label] = out[0]
        samplers[label] = _with_threads(vm_sampler(ex, inputs, min_ms=50), t)
    import torch
    args = corpus.torch_inputs(inputs)
    samplers["torch"] = eager_sampler(lambda: module(*args), t)
    err = {k: float(np.abs(v - outs["tvm"]).max() / max(1e-30, np.abs(outs["tvm"]).max())) for k, v in outs.items()}
    with OtherLoad() as load:
        timed = interleave(samplers, a.repeat)
    ms = {k: float(np.median(v)) * 1e3 for k, v in timed.items()}
    print(f"{name} t={t} load={load.cores:.2f} kernels={kernels} err={ {k: f'{e:.1e}' for k, e in err.items()} }")
    print("   ms " + " ".join(f"{k}={v:.2f}" for k, v in ms.items()),
          f" new/old speed={ms['old']/ms['new']:.3f} new vs tvm={ms['tvm']/ms['new']:.3f} old vs tvm={ms['tvm']/ms['old']:.3f}", flush=True)
