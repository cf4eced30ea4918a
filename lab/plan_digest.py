"""Every plan's groups, estimates, decisions and card classes, and every kernel after our
schedules, as one JSON file: run it before and after a change that should change nothing
(``pip install --no-deps --target DIR`` the old commit, run with ``PYTHONPATH=DIR``), then
diff the two files.

    python3 lab/plan_digest.py OUT.json MODEL...

Plans for an AVX2 CPU (``haswell``, 2 cores; the same on every host) and an H100, with the
analytical and the learned model; corpus models at their small shapes. Kernels: the CPU
module after fusion and our schedule pass, by the hash of each function's script.
"""

import hashlib
import json
import sys

import tvm

from tvm_costfuse import CostFuse, FusionConfig, build_graph, models
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.pipelines import default_schedule, fuse, prepare
from tvm_costfuse.targets import preset, resolve
from tvm_costfuse.transform import plan_module

cpu = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
gpu = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
out = {}
for name in sys.argv[2:]:
    mod0 = models.load(name, small=name in models.corpus_names())[0]
    for tname, target, desc in [("cpu", cpu, resolve(cpu).desc), ("h100", gpu, preset("h100"))]:
        for cm in ("analytical", "xgb"):
            mod = prepare(mod0, target)
            graph, plan = build_graph(mod), plan_module(mod, desc, FusionConfig(cost_model=cm))
            out[f"{name}/{tname}/{cm}"] = {
                "groups": [list(g) for g in plan.groups],
                "est": {"+".join(k): [v.seconds, v.breakdown, v.registers, v.spill_bytes]
                        for k, v in plan.estimates.items()},
                "dec": [[d.kind, d.left, d.right, d.gain_s, d.accepted, d.reason]
                        for d in plan.decisions],
                "cls": {"+".join(k): str(group_features(graph, k).schedule_on(desc.kind))
                        for k in plan.estimates}}
    fused = fuse(mod0, cpu, CostFuse(target=resolve(cpu)))
    with cpu:
        scheduled = default_schedule(cpu)(fused)
    out[f"{name}/cpu/kernels"] = {gv.name_hint: hashlib.sha1(f.script().encode()).hexdigest()
                                  for gv, f in scheduled.functions.items()
                                  if isinstance(f, tvm.tirx.PrimFunc)}
    print(name, flush=True)
json.dump(out, open(sys.argv[1], "w"), sort_keys=True, default=str)
