"""Analytical predicted / measured time of the recorded groups, by schedule class and size.

The evaluation's one median hides where the model is off; this splits it. The host
description is this host's (calibrated unless ``TVM_COSTFUSE_CALIBRATION=none``), with as
many cores as the process may use (run it under ``taskset`` with the core count the groups
were measured with).

    taskset -c 1 python lab/price_ratio.py tuning_logs/llvm-rocketlake/groups

``--without-l2-tier`` prices every intermediate as before ``analytical.private_cache`` (at the
last-level cache's bandwidth or DRAM's).
"""

import collections
import sys

import numpy as np

import tvm_costfuse.measurement  # noqa: F401 -- registers the calibration measurement
from tvm_costfuse.cost import analytical
from tvm_costfuse.cost.features import GroupFeatures
from tvm_costfuse.targets import host
from tvm_costfuse.records.database import GroupDatabase


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    work_dir = args[0] if args else "tuning_logs/llvm-rocketlake/groups"
    if "--without-l2-tier" in sys.argv:
        analytical.private_cache = lambda target: (0, None)
    target = host()
    print(f"{target.arch} {target.cores} cores ({target.source}): peak "
          f"{target.peak('float32') / 1e9:.0f} GFLOP/s, DRAM {target.dram_bw / 1e9:.1f} GB/s, "
          f"L2 {(target.l2_bw or 0) / 1e9:.1f} GB/s, L3 {(target.l3_bw or 0) / 1e9:.1f} GB/s")
    by = collections.defaultdict(list)
    for row in GroupDatabase(work_dir).rows():
        if not row.get("measured") or row.get("error"):
            continue
        f = GroupFeatures.from_row(row)
        measured = float(np.median(row["run_secs"]))
        size = ("< 20 us" if measured < 20e-6 else "< 200 us" if measured < 200e-6
                else ">= 200 us")
        by[(f.schedule_on(target.kind).value, size)].append(
            analytical.estimate(f, target).seconds / measured)
    print(f"{'class':20s} {'measured':>10s} {'groups':>7s} {'p10':>6s} {'p50':>6s} {'p90':>6s}")
    for (cls, size), ratios in sorted(by.items()):
        p10, p50, p90 = np.percentile(ratios, [10, 50, 90])
        print(f"{cls:20s} {size:>10s} {len(ratios):7d} {p10:6.2f} {p50:6.2f} {p90:6.2f}")


if __name__ == "__main__":
    main()
