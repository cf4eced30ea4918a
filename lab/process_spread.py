"""How much a side-by-side label depends on the worker process that timed it.

``costfuse tune --labels pairs --processes N`` times each decision's three kernels in N worker
processes and keeps each process's samples (``run_secs_by_process``). This prints, over the
records timed in more than one process: how often one process alone would have labelled the
decision otherwise than all of them do (a kernel's time: the mean of its processes' medians,
``learned.measured_seconds``), how often the processes disagree among
themselves, the spread of a kernel's per-process medians (max / min), and, for the decisions
also timed earlier in a single process, how often that label differs from the pooled one.

    python lab/process_spread.py [--work-dir tuning_logs/llvm-rocketlake/groups]
"""

import argparse
import os

os.environ.setdefault("TVM_COSTFUSE_CALIBRATION", "none")

import numpy as np

from tvm_costfuse import host_target
from tvm_costfuse.cost.learned import measured_seconds
from tvm_costfuse.records.database import default_work_dir
from tvm_costfuse.tuning.side_by_side import read_pairs

_PARTS = ("left", "right", "union")


def _fuses(left: float, right: float, union: float) -> bool:
    return union < left + right


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--worst", type=int, default=10, help="list this many widest spreads")
    args = ap.parse_args()
    records = read_pairs(args.work_dir or default_work_dir(host_target()))
    multi = [r for r in records if r.get("processes", 1) > 1]
    single = {(r["model"], r["union"]["workload_hash"]): r for r in records
              if r.get("processes", 1) == 1}
    if not multi:
        raise SystemExit("no record was timed in more than one process")
    alone_differs = split = old_differs = old_seen = 0
    spreads, worst = [], []
    for rec in multi:
        pooled = _fuses(*(measured_seconds(rec[k]) for k in _PARTS))
        per = [[np.median(s) for s in rec[k]["run_secs_by_process"]] for k in _PARTS]
        labels = [_fuses(*t) for t in zip(*per)]
        alone_differs += sum(lab != pooled for lab in labels)
        split += len(set(labels)) > 1
        for k, meds in zip(_PARTS, per):
            spreads.append(max(meds) / min(meds))
            worst.append((spreads[-1], rec["model"], k, "+".join(rec[k]["members"]),
                          [round(m * 1e6) for m in meds]))
        old = single.get((rec["model"], rec["union"]["workload_hash"]))
        if old is not None:
            old_seen += 1
            old_differs += pooled != _fuses(*(measured_seconds(old[k]) for k in _PARTS))
    n = len(multi)
    n_proc = sum(r["processes"] for r in multi)
    s = np.asarray(spreads)
    print(f"{n} decisions timed in several processes ({n_proc} process timings)")
    print(f"  a single process would label otherwise than all of them: "
          f"{alone_differs} of {n_proc} ({100 * alone_differs / n_proc:.1f}%)")
    print(f"  decisions whose processes disagree: {split} ({100 * split / n:.1f}%)")
    print(f"  per-kernel spread of the process medians (max / min): median "
          f"{np.median(s):.3f}, p90 {np.quantile(s, 0.9):.3f}, max {s.max():.2f}; "
          f"over 1.2x: {(s > 1.2).sum()} of {len(s)}")
    if old_seen:
        print(f"  timed earlier in one process: {old_seen}; label differs from the pooled "
              f"one on {old_differs} ({100 * old_differs / old_seen:.1f}%)")
    print(f"widest {args.worst} (spread, model, part, members, per-process medians in us):")
    for row in sorted(worst, reverse=True)[:args.worst]:
        print(f"  {row[0]:.2f}  {row[1]}  {row[2]}  {row[3]}  {row[4]}")


if __name__ == "__main__":
    main()
