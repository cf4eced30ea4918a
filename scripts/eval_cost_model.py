"""Collect measured fusion groups, and evaluate cost models on them (leave-one-model-out).

train: fit the learned model on every record and save it beside the database
    python scripts/eval_cost_model.py train
(Recomputing stored features after the schema grew is ``costfuse refeature``.)
measure: time the candidate groups of zoo models into tuning_logs/<target>/groups
    python scripts/eval_cost_model.py measure --size small --models mlp_gelu attention
  and of random test programs (tvm_costfuse.models.synthetic: synth-0 .. synth-39):
    python scripts/eval_cost_model.py measure --synthetic 40
evaluate: for each zoo model held out, train the learned model on the others' records and
compare it with the analytical model on the held-out model's records:
- decision accuracy on candidate pairs (left, right, left+right all measured): does
  predicted(fused) < predicted(left) + predicted(right) agree with the measured times?
- Kendall tau of predicted vs measured kernel times over the model's measured groups;
and the measured cost model (``cost.measured``: a held-out group that another model measured
priced by that measurement, the rest analytically; ``acc meas``). Then the same scores on each measured synthetic program (``synth-<seed>``, never trained on
by default): a test on programs no zoo architecture resembles. ``--train-synthetic`` adds the
other programs to every training set (and the synthetic rows to the zoo hold-outs' training).
    python scripts/eval_cost_model.py evaluate [--train-synthetic]
"""

from __future__ import annotations

import argparse
import sys

from scipy.stats import kendalltau

from tvm_costfuse import models
from tvm_costfuse.cost.analytical import estimate
from tvm_costfuse.cost.learned import (
    FALLBACK_CONFIDENCE,
    _features_of,
    measured_seconds,
    train,
    train_rows,
)
from tvm_costfuse.cost.measured import MeasuredModel
from tvm_costfuse.targets import for_target, host_target
from tvm_costfuse.tuning.database import GroupDatabase, default_work_dir
from tvm_costfuse.tuning.feedback import MeasureConfig, measure_model


def _measure(args) -> None:
    target = host_target()
    work_dir = args.work_dir or default_work_dir(target)
    config = MeasureConfig(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                           timeout_s=args.timeout)
    if args.synthetic:
        jobs = [(f"{models.synthetic.PREFIX}{i}", False) for i in range(args.synthetic)]
    else:
        jobs = [(name, size == "small") for size in args.size
                for name in args.models or models.zoo.names()]
    for name, small in jobs:
        model = models.variant_name(name, small)
        mod, _ = models.load(name, small=small)
        print(f"{model}:", flush=True)
        s = measure_model(model, mod, target, work_dir, config, max_groups=args.max_groups,
                          log=lambda m: print(m, flush=True))
        print(f"{model}: measured {s.measured}, failed {s.failed}, reused {s.reused}, "
              f"unformable {s.unformable}, views {s.views}, "
              f"skipped {s.skipped} in {s.seconds:.0f} s", flush=True)


def _pairs(rows: list[dict]) -> list[tuple[dict, dict, dict]]:
    """(left, right, union) triples among one model's measured groups: every split of a
    measured group into two measured groups (the planner's decisions, reconstructed)."""
    by_key = {frozenset(r["members"]): r for r in rows}
    out = []
    for union, u_row in by_key.items():
        if len(union) < 2:
            continue
        for left, l_row in by_key.items():
            right = union - left
            if left < union and right in by_key and min(left) < min(right):
                out.append((l_row, by_key[right], u_row))
    return out


def _scores(rows, pred: dict[int, float]) -> tuple[float, float, int, float]:
    """(Kendall tau over groups, decision accuracy over pairs, pairs, share measured fused);
    ``pred`` maps id(row) to the predicted seconds."""
    tau = kendalltau([measured_seconds(r) for r in rows], [pred[id(r)] for r in rows]).statistic
    pairs = _pairs(rows)
    hits = sum(_right(q, pred) for q in pairs)
    fused = sum(measured_seconds(u) < measured_seconds(a) + measured_seconds(b) for a, b, u in pairs)
    n = len(pairs)
    return tau, hits / n if n else float("nan"), n, fused / n if n else float("nan")


def _score_rows(label: str, group: list[dict], model, desc, measured) -> tuple:
    """Print one table line; returns (acc analytical, acc learned, acc measured, pairs,
    fallbacks, analytical and learned predictions in ``group`` order, and per pair (answered
    by the trees alone, analytical right, learned right))."""
    a_est = {id(r): estimate(_features_of(r), desc).seconds for r in group}
    l_full = {id(r): model(_features_of(r), desc) for r in group}
    m_est = {id(r): measured(_features_of(r), desc).seconds for r in group}
    fell = sum(e.confidence == FALLBACK_CONFIDENCE for e in l_full.values())
    l_est = {k: e.seconds for k, e in l_full.items()}
    tau_a, acc_a, n, fused = _scores(group, a_est)
    tau_l, acc_l, _, _ = _scores(group, l_est)
    _, acc_m, _, _ = _scores(group, m_est)
    print(f"{label:<24}{len(group):>7}{n:>7}{100 * fused:>6.0f}%"
          f"{acc_a:>12.2f}{acc_l:>9.2f}{acc_m:>10.2f}{tau_a:>12.2f}{tau_l:>9.2f}"
          f"{f'{fell}/{len(group)}':>10}")
    # Per pair: (all three answered by the trees, analytical right, learned right).
    by_trees = {k: e.confidence != FALLBACK_CONFIDENCE for k, e in l_full.items()}
    split = [(all(by_trees[id(r)] for r in q),
              _right(q, a_est), _right(q, l_est)) for q in _pairs(group)]
    return (acc_a, acc_l, acc_m, n, fell, [a_est[id(r)] for r in group],
            [l_est[id(r)] for r in group], split)


def _right(pair: tuple[dict, dict, dict], pred: dict[int, float]) -> bool:
    """Whether ``pred`` decides fuse / keep apart as the measured medians do."""
    a, b, u = pair
    return (measured_seconds(u) < measured_seconds(a) + measured_seconds(b)) == (pred[id(u)] < pred[id(a)] + pred[id(b)])


def _table(title: str, held_out: dict[str, list[dict]], train_for, desc, min_records: int
           ) -> None:
    """Hold out each unit in turn (its rows by model variant), train on ``train_for(unit)``,
    print per-variant lines and the pooled line."""
    head = (f"{title:<24}{'groups':>7}{'pairs':>7}{'fuse%':>7}"
            f"{'acc analyt':>12}{'acc xgb':>9}{'acc meas':>10}{'tau analyt':>12}{'tau xgb':>9}"
            f"{'fallback':>10}")
    print(head)
    print("-" * len(head))
    pairs = hits_a = hits_l = hits_m = 0
    meas, all_a, all_l, split = [], [], [], []
    for unit, held in held_out.items():
        train = train_for(unit)
        model = train_rows(train, desc, min_records=min_records)
        measured = MeasuredModel.from_rows(train)
        for variant in sorted({r["model"] for r in held}):
            group = [r for r in held if r["model"] == variant]
            acc_a, acc_l, acc_m, n, _, a, lrn, sp = _score_rows(variant, group, model, desc,
                                                                 measured)
            split += sp
            if n:
                pairs += n
                hits_a += acc_a * n
                hits_l += acc_l * n
                hits_m += acc_m * n
            meas += [measured_seconds(r) for r in group]
            all_a += a
            all_l += lrn
    print("-" * len(head))
    if not pairs:
        print("all: no measured pairs to score")
        return
    print(f"{'all (pairs pooled)':<24}{len(meas):>7}{pairs:>7}{'':>7}"
          f"{hits_a / pairs:>12.3f}{hits_l / pairs:>9.3f}{hits_m / pairs:>10.3f}"
          f"{kendalltau(meas, all_a).statistic:>12.2f}{kendalltau(meas, all_l).statistic:>9.2f}")
    for trees, label in ((True, "answered by the trees"), (False, "some part analytical")):
        sub = [s for s in split if s[0] == trees]
        if sub:
            print(f"  pairs {label}: {len(sub)}, accuracy analytical "
                  f"{sum(s[1] for s in sub) / len(sub):.2f}, learned "
                  f"{sum(s[2] for s in sub) / len(sub):.2f}")
    print()


def _evaluate(args) -> None:
    target = host_target()
    desc = for_target(target)
    rows = [r for r in GroupDatabase(args.work_dir or default_work_dir(target)).rows()
            if not r.get("error") and r["run_secs"] and max(r["run_secs"]) < 1e9]
    # A lone reshape is a view in a model (no kernel) but was timed as a copy kernel: no
    # ground truth for it, nor for a decision with it as a part (20 zoo, 28 synthetic pairs).
    views = [r for r in rows if _features_of(r).is_view]
    rows = [r for r in rows if not _features_of(r).is_view]
    synth = [r for r in rows if models.synthetic.is_synthetic(r["model"])]
    zoo_rows = [r for r in rows if not models.synthetic.is_synthetic(r["model"])]
    extra = synth if args.train_synthetic else []
    arch = sorted({r["model"].split("@")[0] for r in zoo_rows})
    print(f"{len(zoo_rows)} measured groups of {len({r['model'] for r in zoo_rows})} zoo "
          f"models, {len(synth)} of {len({r['model'] for r in synth})} synthetic programs; "
          f"training {'with' if extra else 'without'} the synthetic programs; {len(views)} lone "
          "reshapes (views in a model, timed as copies) left out\n")
    print("Leave one zoo architecture out (small and full variants held out together):")
    _table("held out", {a: [r for r in zoo_rows if r["model"].split("@")[0] == a] for a in arch},
           lambda a: [r for r in zoo_rows if r["model"].split("@")[0] != a] + extra, desc,
           args.min_records)
    if not synth:
        return
    print("Unseen synthetic programs (the learned model trained on the whole zoo"
          + (" and the other programs):" if extra else "):"))
    programs = sorted({r["model"] for r in synth}, key=models.synthetic.seed_of)
    _table("program", {p: [r for r in synth if r["model"] == p] for p in programs},
           lambda p: zoo_rows + [r for r in extra if r["model"] != p], desc, args.min_records)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="measure candidate groups of zoo models")
    m.add_argument("--models", nargs="*", default=None)
    m.add_argument("--size", nargs="+", choices=["small", "full"], default=["small"])
    m.add_argument("--max-groups", type=int, default=None)
    m.add_argument("--repeat", type=int, default=3)
    m.add_argument("--min-repeat-ms", type=int, default=30)
    m.add_argument("--timeout", type=float, default=120.0)
    m.add_argument("--work-dir", default=None)
    m.add_argument("--synthetic", type=int, default=0, metavar="N",
                   help="measure the random programs synth-0 .. synth-N-1 instead of the zoo")
    t = sub.add_parser("train", help="train on every record and save xgb_model.json beside it")
    t.add_argument("--work-dir", default=None)
    e = sub.add_parser("evaluate", help="leave-one-model-out: analytical vs learned")
    e.add_argument("--work-dir", default=None)
    e.add_argument("--min-records", type=int, default=30)
    e.add_argument("--train-synthetic", action="store_true",
                   help="train on the synthetic programs too (default: they are test data)")
    args = parser.parse_args(argv)
    if args.cmd == "measure":
        _measure(args)
    elif args.cmd == "train":
        work_dir = args.work_dir or default_work_dir(host_target())
        model = train(work_dir, for_target(host_target()))
        print(f"trained on {model.n_records} records of {len(model.models)} models -> "
              f"{work_dir}/xgb_model.json")
    else:
        _evaluate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
