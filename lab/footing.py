"""Why the learned model decided worse than the analytical one on some families: decisions that
mix the trees' times with the analytical model's.

Leave one family out on the measured rows (as ``costfuse evaluate --by family``),
every pair sorted by how many of its three groups (left, right, union) the trees answer
(0-3; the others fall back to the analytical model), with the pairs each model decides right
in each bucket; then the pooled accuracy of ways to answer a decision:

- ``analytical``: the analytical model's three times;
- ``mixed``: the learned model's times, each group on its own (trees or fallback): how the
  planner weighed a merge before ``analytical.one_footing``;
- ``mixed, class-corrected fallback``: the same, a fallback time scaled by the median
  measured / analytical ratio of the training groups of its schedule class and size
  (shrunk toward 1 by n / (n + 10)): can a cheaper correction of the fallback remove the bias?
- ``one footing``: the trees' times where they answer all three, else the analytical three
  (what the planner and the evaluation do now);
- ``one footing, class-corrected``: the same with the corrected fallback;

and the measured seconds at stake (``evaluation.Pair.stake``) in all pairs and in those whose
three groups the trees answer.

    taskset -c 1 python lab/footing.py [tuning_logs/llvm-rocketlake/groups]
"""

import collections
import logging
import math
import sys

import numpy as np

from tvm_costfuse import models
from tvm_costfuse.cost import evaluation
from tvm_costfuse.cost.analytical import estimate
from tvm_costfuse.cost.features import GroupFeatures
from tvm_costfuse.cost.learned import FALLBACK_CONFIDENCE, usable_row, measured_seconds, train_rows
from tvm_costfuse.targets import for_target, host_target
from tvm_costfuse.records.database import GroupDatabase

_EDGES = (2e-5, 2e-4, 2e-3)  # seconds: the size buckets of the class correction
_SHRINK = 10


def _rows(work_dir: str) -> list[dict]:
    return [r for r in GroupDatabase(work_dir).rows()
            if usable_row(r) and not models.synthetic.is_synthetic(r["model"])]


def _correction(train: list[dict], desc) -> dict:
    residuals = collections.defaultdict(list)
    for r in train:
        f = GroupFeatures.from_row(r)
        a = estimate(f, desc).seconds
        residuals[(f.schedule_on("llvm"), int(np.searchsorted(_EDGES, a)))].append(
            math.log(measured_seconds(r) / a))
    return {k: float(np.median(v)) * len(v) / (len(v) + _SHRINK) for k, v in residuals.items()}


def main() -> None:
    logging.disable(logging.WARNING)
    desc = for_target(host_target())
    rows = _rows(sys.argv[1] if len(sys.argv) > 1 else "tuning_logs/llvm-rocketlake/groups")
    total, total_stake, n = collections.Counter(), collections.Counter(), 0
    for family in sorted({models.family(r["model"]) for r in rows}):
        held = [r for r in rows if models.family(r["model"]) == family]
        train = [r for r in rows if models.family(r["model"]) != family]
        learned, corr = train_rows(train, desc), _correction(train, desc)

        def times(row: dict) -> tuple[float, bool, float, float]:
            f = GroupFeatures.from_row(row)
            e, a = learned(f, desc), estimate(f, desc).seconds
            bucket = (f.schedule_on("llvm"), int(np.searchsorted(_EDGES, a)))
            return e.seconds, e.confidence != FALLBACK_CONFIDENCE, a, a * math.exp(
                corr.get(bucket, 0.0))

        buckets = collections.defaultdict(lambda: [0, 0, 0])
        right = collections.Counter()
        stake = {"all": 0.0, "trees answer all three": 0.0}
        pairs = [p for m in sorted({r["model"] for r in held})
                 for p in evaluation.pairs([r for r in held if r["model"] == m])]
        for p in pairs:
            t = [times(r) for r in (p.union, p.left, p.right)]
            whole = all(c for _, c, _, _ in t)
            ways = {
                "analytical": [a for _, _, a, _ in t],
                "mixed": [s for s, _, _, _ in t],
                "mixed, class-corrected fallback": [s if c else k for s, c, _, k in t],
                "one footing": [s for s, _, _, _ in t] if whole else [a for _, _, a, _ in t],
                "one footing, class-corrected": ([s for s, _, _, _ in t] if whole
                                                 else [k for _, _, _, k in t]),
            }
            ok = {w: (u < a + b) == p.fuse_wins for w, (u, a, b) in ways.items()}
            stake["all"] += p.stake
            stake["trees answer all three"] += whole * p.stake
            right.update(w for w, v in ok.items() if v)
            b = buckets[sum(c for _, c, _, _ in t)]
            b[0], b[1], b[2] = b[0] + 1, b[1] + ok["mixed"], b[2] + ok["analytical"]
        print(f"{family}: {len(pairs)} pairs; by groups the trees answer (pairs, mixed right, "
              "analytical right): " + ", ".join(f"{k}: {v[0]} / {v[1]} / {v[2]}"
                                                for k, v in sorted(buckets.items())))
        print("  " + ", ".join(f"{w} {100 * v / len(pairs):.1f}" for w, v in right.items()))
        print("  seconds at stake: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in stake.items()))
        total.update(right)
        total_stake.update(stake)
        n += len(pairs)
    print(f"pooled ({n} pairs): " + ", ".join(f"{w} {100 * v / n:.1f}" for w, v in total.items()))
    print("seconds at stake: " + ", ".join(f"{k} {v * 1e3:.1f} ms"
                                           for k, v in total_stake.items()))


if __name__ == "__main__":
    main()
