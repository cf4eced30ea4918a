"""Does the CPU schedule class the features predict for reduction groups match what our rules do?

Why: ``GroupFeatures.schedule_on("cpu")`` says "reduction" when our row-reduction rule will
schedule a fused group and "fallback" when it will decline (a second output, a transpose after
the reduction). This applies the rules themselves to every measured multi-op reduction group
in the group database (no contraction, no pooling window) and counts agreements; it exits
non-zero on any disagreement.

    TVM_COSTFUSE_CALIBRATION=none python scripts/check_reduction_class.py
"""

from __future__ import annotations

import sys
from collections import Counter

from tvm_costfuse.schedules.cpu import Contraction, RowReduction

from tvm_costfuse import models
from tvm_costfuse.cost.features import GroupFeatures
from tvm_costfuse.graph import build_graph
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.targets import host_target
from tvm_costfuse.tuning.database import GroupDatabase, default_work_dir
from tvm_costfuse.tuning.feedback import group_kernel_and_outputs


def main() -> int:
    target = host_target()
    graphs = {}
    counts: Counter[tuple[str, str]] = Counter()
    for row in GroupDatabase(default_work_dir(target)).rows():
        f = GroupFeatures.from_row(row)
        if (row.get("error") or len(row["members"]) < 2 or f.n_contractions
                or not f.n_reductions or f.window_reductions):
            continue
        model = row["model"]
        if model not in graphs:
            mod = prepare(models.load_variant(model)[0], target)
            graphs[model] = (mod, build_graph(mod))
        mod, graph = graphs[model]
        func, _ = group_kernel_and_outputs(mod, graph, row["members"])
        if Contraction().apply(func, target, False) is not None:
            actual = "contraction"
        elif RowReduction().apply(func, target, False) is not None:
            actual = "reduction"
        else:
            actual = "fallback"
        counts[(f.schedule_on("cpu"), actual)] += 1
    for (predicted, actual), n in sorted(counts.items()):
        print(f"features say {predicted:<10} rules do {actual:<10} {n:>4} groups")
    wrong = sum(n for (p, a), n in counts.items() if p != a)
    print(f"{sum(counts.values())} groups, {wrong} disagreements")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
