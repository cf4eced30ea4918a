"""How often a committed label flips when its decision's three kernels are timed side by side.

The feedback loop times each group alone, one after another in a worker process, and reuses a
workload's time across models: a pair's left, right and union may have been timed minutes
apart, in another model's run. This re-times the top-stake pairs of the committed rows
(``evaluation.Pair.stake``, one pair per union workload) with the three kernels built as the
feedback loop builds them and sampled interleaved in this process (``time_evaluator``, no
Relax VM around the call, so small kernels come out cheaper than the committed rows say), and
prints the old and new label per pair; the records go to ``--out`` (JSON lines).

    taskset -c 1 python lab/label_drift.py --pairs 6 --models bert t5_encoder \
        clip_text swin_t resnet50 gpt2
"""

import argparse
import json
import logging
import os

os.environ.setdefault("TVM_COSTFUSE_CALIBRATION", "none")

import numpy as np
import tvm

from tvm_costfuse import host_target, models
from tvm_costfuse.cost import evaluation
from tvm_costfuse.cost.features import GroupFeatures
from tvm_costfuse.cost.learned import usable_row, measured_seconds
from tvm_costfuse.graph import build_graph
from tvm_costfuse.measurement.timing import interleave
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.schedules.prepack import mark_constant_weights
from tvm_costfuse.records.database import GroupDatabase
from tvm_costfuse.tuning.feedback import group_kernel_and_outputs, schedule_kernel


def _sampler(prep, graph, marked, members, target):
    func, _ = group_kernel_and_outputs(prep, graph, members, marked)
    sched, _ = schedule_kernel(func, target)
    rt = tvm.compile(tvm.IRModule({"main": sched.with_attr("global_symbol", "main")}),
                     target=target).mod
    dev, rng = tvm.cpu(), np.random.default_rng(0)
    args = [tvm.runtime.tensor((rng.standard_normal([int(d) for d in b.shape]) * 0.1)
                               .astype(str(b.dtype)), dev) for b in sched.params]
    ev = rt.time_evaluator("main", dev, number=3, repeat=1, min_repeat_ms=20)
    return lambda: ev(*args).mean


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work-dir", default="tuning_logs/llvm-rocketlake/groups")
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--pairs", type=int, default=6, help="top-stake pairs per model")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    target = host_target(1)
    tvm.get_global_func("runtime.config_threadpool")(1, 1)
    rows = [r for r in GroupDatabase(args.work_dir).rows() if usable_row(r)]
    out = open(args.out, "a") if args.out else None
    flips = n = 0
    for name in args.models:
        pairs = evaluation.pairs([r for r in rows if r["model"] == name])
        seen, pick = set(), []
        for p in sorted(pairs, key=lambda p: -p.stake):
            if p.union["workload_hash"] not in seen:
                seen.add(p.union["workload_hash"])
                pick.append(p)
        mod, _ = models.load(name, small=False)
        prep = prepare(mod, target)
        graph, marked = build_graph(prep), mark_constant_weights(prep)
        for p in pick[:args.pairs]:
            fns = {k: _sampler(prep, graph, marked, getattr(p, k)["members"], target)
                   for k in ("union", "left", "right")}
            new = {k: float(np.median(v)) for k, v in interleave(fns, args.rounds).items()}
            old = {k: measured_seconds(getattr(p, k)) for k in ("union", "left", "right")}
            new_fuse = new["union"] < new["left"] + new["right"]
            kind = str(GroupFeatures.from_row(p.union).schedule_on("llvm"))
            flips += new_fuse != p.fuse_wins
            n += 1
            if out:
                out.write(json.dumps({"model": name, "members": p.union["members"],
                                      "class": kind, "stake": p.stake, "clear": p.clear,
                                      "old": old, "new": new, "old_fuse": p.fuse_wins,
                                      "new_fuse": new_fuse}) + "\n")
            noise = "clear" if p.clear else "within its runs' spread"
            print(f"{name} {kind:12s} stake {p.stake * 1e6:7.0f} us, label "
                  f"{'fuse' if p.fuse_wins else 'split'} -> {'fuse' if new_fuse else 'split'} "
                  f"({noise}); union / left / "
                  f"right us: committed {[round(old[k] * 1e6) for k in old]}, side by side "
                  f"{[round(new[k] * 1e6) for k in new]}", flush=True)
    print(f"{flips} of {n} labels flip")


if __name__ == "__main__":
    main()
