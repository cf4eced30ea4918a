"""Which of CostFuse's own groups make a model faster or slower, measured inside the model.

A kernel timed alone can look neutral and still slow the model down (cache state, a pass that
runs inside the fused kernel differently). For each group CostFuse forms that FuseOps does not,
this builds the CostFuse plan with that one group split back into FuseOps' groups, and times
all variants side by side (interleaved medians) against FuseOps and the full CostFuse plan.

    python lab/ablate_groups.py bert_layer [--repeat 7]   (zoo or corpus names)

``-i`` rows are the CostFuse plan without its i-th own group: a ``-i`` faster than ``costfuse``
means that group costs time in the model.
"""

from __future__ import annotations

import argparse

from tvm_costfuse.schedules import schedule_pass

from tvm_costfuse import models
from tvm_costfuse.config import FusionConfig
from tvm_costfuse.measurement.timing import build, interleaved_medians
from tvm_costfuse.partition import ApplyPartition, fuseops_groups
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.targets import for_target, host_target
from tvm_costfuse.transform import plan_module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=models.names())
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    target = host_target()
    mod, inputs = models.load(args.model)
    prepared = prepare(mod, target)
    fuseops = [list(g) for g in fuseops_groups(prepared)]
    costfuse = [list(g) for g in plan_module(prepared, for_target(target), FusionConfig()).groups]
    theirs = {frozenset(g) for g in fuseops}
    own = [g for g in costfuse if frozenset(g) not in theirs]
    variants = {"tvm": fuseops, "costfuse": costfuse}
    for i, group in enumerate(own):
        print(f"-{i}: {'+'.join(group)}")
        split_back = [g for g in fuseops if set(g) <= set(group)]
        variants[f"-{i}"] = [g for g in costfuse if g is not group] + split_back
    executables = {k: build(mod, target, ApplyPartition(v), schedule_pass(target))
                   for k, v in variants.items()}
    medians = interleaved_medians(executables, inputs, repeat=args.repeat)
    for k, v in medians.items():
        print(f"{k:<10}{v * 1e3:>10.3f} ms   tvm/{k} {medians['tvm'] / v:.3f}")


if __name__ == "__main__":
    main()
