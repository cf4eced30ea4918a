"""Collect measured fusion groups, and evaluate cost models on them (leave one family out).

train: fit the learned model on every record and save it beside the database
    python scripts/eval_cost_model.py train
(Recomputing stored features after the schema grew is ``costfuse refeature``.)
measure: time the candidate groups of zoo or corpus models into tuning_logs/<target>/groups
    python scripts/eval_cost_model.py measure --size small --models mlp_gelu bert wav2vec2
  and of random test programs (tvm_costfuse.models.synthetic: synth-0 .. synth-39):
    python scripts/eval_cost_model.py measure --synthetic 40
evaluate: hold out each architecture family (``models.family``: cnn, encoder, decoder,
vision_transformer, seq2seq, speech, elementwise; ``--by architecture`` holds out one model at
a time), train the learned model on the rest (``--seeds`` times) and score every model on the
held-out family's measured groups (``cost.evaluation``):
- decision accuracy on candidate pairs (left, right, left+right all measured), next to the
  better trivial baseline (always fuse / never fuse), and on the *clear* pairs (measured gain
  larger than the spread of their repeated runs: ``evaluation.Pair.clear``); coverage and
  accuracy on the decided
  pairs when the model may abstain (the learned model where it falls back, the analytical one
  below a predicted gain of ``--margin``); the share of the measured seconds at stake in
  the pairs decided right (``Decisions.stake_accuracy``: what end-to-end time weighs);
- Kendall tau and the predicted / measured time ratio (p10, median, p90) over the groups;
- the measured cost model (``cost.measured``: a held-out group another model measured priced
  by that measurement, the rest analytically).
Then the same on each measured synthetic program (``synth-<seed>``, never trained on by
default); ``--train-synthetic`` adds the other programs to every training set.
    python scripts/eval_cost_model.py evaluate [--by family|architecture] [--seeds 5]
pairs: time each candidate decision's three kernels (left, right, union) side by side, in
rounds (``tuning.side_by_side``); ``evaluate`` then also scores every model on these labels:
    taskset -c 1 python scripts/eval_cost_model.py pairs --size full --models bert --max-pairs 10
label: time each final decision of CostFuse's plan inside the whole model, fused and split
with the rest of the plan fixed (``tuning.in_model``); ``evaluate`` then also scores every
model on these in-model labels, and says how often the isolated timings agree with them:
    python scripts/eval_cost_model.py label --size small --models bert wav2vec2
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from scipy.stats import kendalltau
from tvm_costfuse.schedules import schedule_pass

from tvm_costfuse import models
from tvm_costfuse.config import FusionConfig
from tvm_costfuse.cost import evaluation
from tvm_costfuse.cost.analytical import estimate
from tvm_costfuse.cost.learned import (
    FALLBACK_CONFIDENCE,
    _features_of,
    measured_seconds,
    train,
    train_rows,
)
from tvm_costfuse.cost.measured import MeasuredModel
from tvm_costfuse.measurement.quiet import OtherLoad
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.targets import for_target, host_target
from tvm_costfuse.transform import plan_module
from tvm_costfuse.tuning import in_model, side_by_side
from tvm_costfuse.records.database import GroupDatabase, default_work_dir
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
        with OtherLoad() as load:
            s = measure_model(model, mod, target, work_dir, config, max_groups=args.max_groups,
                              log=lambda m: print(m, flush=True))
        # The kernels run in a worker process, so the machine's whole load is what tells a
        # disturbed model: other work on the other vCPU of a small host slows them too.
        print(f"{model}: measured {s.measured}, failed {s.failed}, reused {s.reused}, "
              f"unformable {s.unformable}, views {s.views}, "
              f"skipped {s.skipped}, re-timed (recorded for other kernels) {s.stale} in "
              f"{s.seconds:.0f} s; the machine was busy "
              f"{load.all_cores:.2f} cores (this measurement's share: about "
              f"{int(target.attrs.get('num-cores', 1))})", flush=True)


def _pairs(args) -> None:
    target = host_target()
    work_dir = args.work_dir or default_work_dir(target)
    config = MeasureConfig(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                           timeout_s=args.timeout)
    for size in args.size:
        for name in args.models or models.zoo.names():
            model = models.variant_name(name, size == "small")
            mod, _ = models.load(name, small=size == "small")
            print(f"{model}:", flush=True)
            with OtherLoad() as load:
                s = side_by_side.label_pairs(model, mod, target, work_dir, config,
                                             max_pairs=args.max_pairs,
                                             processes=args.processes,
                                             log=lambda m: print(m, flush=True))
            print(f"{model}: {s.timed} decisions timed side by side, {s.failed} failed, "
                  f"{s.unformable} unformable, {s.views} with a view part, {s.repeated} "
                  "repeated layers in "
                  f"{s.seconds:.0f} s; the machine was busy {load.all_cores:.2f} cores",
                  flush=True)


def _predictors(train: list[dict], desc, min_records: int, seeds: int):
    """(analytical, measured, [learned per seed]) predictors trained on ``train``."""
    def analytical(r):
        return estimate(_features_of(r), desc).seconds, True

    measured_model = MeasuredModel.from_rows(train)

    def measured(r):  # confident where a measurement answers
        e = measured_model(_features_of(r), desc)
        return e.seconds, "measured" in e.breakdown

    def learned_of(model):
        def predict(r):
            e = model(_features_of(r), desc)
            return e.seconds, e.confidence != FALLBACK_CONFIDENCE
        return predict

    learned = [learned_of(train_rows(train, desc, min_records=min_records, seed=s))
               for s in range(seeds)]
    return analytical, measured, learned


def _pct(x: float) -> str:
    return "   n/a" if math.isnan(x) else f"{100 * x:6.1f}"


def _mean_std(values: list[float]) -> str:
    return f"{100 * np.mean(values):5.1f}+-{100 * np.std(values):3.1f}"


def _reconstructed(held: list[dict]) -> tuple[list[dict], list[evaluation.Pair]]:
    """The groups and the pairs among each model's measured groups."""
    return held, [p for v in sorted({r["model"] for r in held})
                  for p in evaluation.pairs([r for r in held if r["model"] == v])]


def _table(title: str, held_out: dict[str, tuple[list[dict], list[evaluation.Pair]]],
           train_for, desc, args) -> None:
    """Hold out each unit in turn, train on ``train_for(unit)``, print one line per unit
    and the pooled line (accuracies in %, pooled over pairs). ``held_out``: per unit, its
    groups (times, rank correlation) and its decisions."""
    head = (f"{title:<20}{'groups':>7}{'pairs':>6}{'fuse%':>7}{'best triv':>10}"
            f"{'analyt':>8}{'cov@m':>7}{'dec acc':>8}{'xgb mean+-std':>15}{'xgb cov':>8}"
            f"{'xgb dec':>8}{'meas':>7}{'tau a':>7}{'tau x':>7}{'a/meas p10 p50 p90':>20}"
            f"{'x/meas p50':>11}{'clear%':>7}{'a clear':>8}{'x clear':>8}{'a stake':>8}"
            f"{'x stake':>8}")
    print(head)
    print("-" * len(head))
    pooled: dict[str, list] = {"n": [], "fuse": [], "a": [], "a_cov": [], "a_dec": [],
                               "x": [], "x_cov": [], "x_dec": [], "m": [], "clear": [],
                               "a_clear": [], "x_clear": [], "stake_s": [], "a_stake": [],
                               "x_stake": []}
    all_meas, all_a, all_x = [], [], []
    for unit, (held, pair_list) in held_out.items():
        analytical, measured, learned = _predictors(train_for(unit), desc, args.min_records,
                                                    args.seeds)
        a = evaluation.decide(pair_list, analytical, margin=args.margin)
        # A decision the trees (or measurements) do not answer whole is the analytical
        # model's, as in the planner (``analytical.one_footing``).
        xs = [evaluation.decide(pair_list, f, analytical) for f in learned]
        m = evaluation.decide(pair_list, measured, analytical)
        ta, tx = evaluation.times(held, analytical), evaluation.times(held, learned[0])
        print(f"{unit:<20}{len(held):>7}{a.pairs:>6}{_pct(a.fuse_share):>7}"
              f"{_pct(a.best_trivial):>10}{_pct(a.accuracy):>8}{_pct(a.coverage):>7}"
              f"{_pct(a.decided_accuracy):>8}{_mean_std([x.accuracy for x in xs]):>15}"
              f"{_pct(xs[0].coverage):>8}{_pct(xs[0].decided_accuracy):>8}"
              f"{_pct(m.accuracy):>7}{ta.tau:>7.2f}{tx.tau:>7.2f}"
              f"{ta.ratio_p10:>8.2f}{ta.ratio_median:>6.2f}{ta.ratio_p90:>6.2f}"
              f"{tx.ratio_median:>11.2f}{_pct(a.clear_share):>7}{_pct(a.clear_accuracy):>8}"
              f"{_pct(np.mean([x.clear_accuracy for x in xs])):>8}{_pct(a.stake_accuracy):>8}"
              f"{_pct(np.mean([x.stake_accuracy for x in xs])):>8}")
        if a.pairs:
            for key, value in (("n", a.pairs), ("fuse", a.fuse_share), ("a", a.accuracy),
                               ("a_cov", a.coverage), ("a_dec", a.decided_accuracy),
                               ("x", [x.accuracy for x in xs]), ("x_cov", xs[0].coverage),
                               ("x_dec", xs[0].decided_accuracy), ("m", m.accuracy),
                               ("clear", a.clear_share), ("a_clear", a.clear_accuracy),
                               ("x_clear", np.mean([x.clear_accuracy for x in xs])),
                               ("stake_s", sum(p.stake for p in pair_list) / a.pairs),
                               ("a_stake", a.stake_accuracy),
                               ("x_stake", np.mean([x.stake_accuracy for x in xs]))):
                pooled[key].append(value)
        all_meas += [measured_seconds(r) for r in held]
        all_a += [analytical(r)[0] for r in held]
        all_x += [learned[0](r)[0] for r in held]
    print("-" * len(head))
    n = np.asarray(pooled["n"], dtype=float)
    if not n.sum():
        print("all: no measured pairs to score\n")
        return

    def pool(key, weight=None):
        v = np.asarray(pooled[key], dtype=float)
        w = n if weight is None else n * np.asarray(pooled[weight], dtype=float)
        ok = ~np.isnan(v) & ~np.isnan(w)
        return float((v[ok] * w[ok]).sum() / w[ok].sum()) if ok.any() else float("nan")

    fuse = pool("fuse")
    seeds = [float((np.asarray(pooled["x"])[:, s] * n).sum() / n.sum())
             for s in range(args.seeds)]
    print(f"{'all (pooled)':<20}{len(all_meas):>7}{int(n.sum()):>6}{_pct(fuse):>7}"
          f"{_pct(max(fuse, 1 - fuse)):>10}{_pct(pool('a')):>8}{_pct(pool('a_cov')):>7}"
          f"{_pct(pool('a_dec')):>8}{_mean_std(seeds):>15}{_pct(pool('x_cov')):>8}"
          f"{_pct(pool('x_dec')):>8}{_pct(pool('m')):>7}"
          f"{kendalltau(all_meas, all_a).statistic:>7.2f}"
          f"{kendalltau(all_meas, all_x).statistic:>7.2f}{'':>31}{_pct(pool('clear')):>7}"
          f"{_pct(pool('a_clear', 'clear')):>8}{_pct(pool('x_clear', 'clear')):>8}"
          f"{_pct(pool('a_stake', 'stake_s')):>8}{_pct(pool('x_stake', 'stake_s')):>8}")
    print(f"(xgb: {args.seeds} training seeds, mean +- std; coverage and decided accuracy of "
          f"seed 0; analytical abstains below a predicted gain of {args.margin:.0%}; clear: "
          "pairs whose measured gain exceeds their runs' spread, accuracy there, xgb over "
          "the seeds; stake: the share of the measured seconds at stake decided right)\n")


def _label(args) -> None:
    target = host_target()
    desc = for_target(target)
    work_dir = args.work_dir or default_work_dir(target)
    for size in args.size:
        for name in args.models or models.zoo.names():
            model = models.variant_name(name, size == "small")
            mod, inputs = models.load(name, small=size == "small")
            prepared = prepare(mod, target)
            plan = plan_module(prepared, desc, FusionConfig.resolve())
            print(f"{model}:", flush=True)
            records = in_model.label_decisions(model, mod, prepared, plan, inputs, target,
                                               work_dir, schedule_pass(target), args.repeat,
                                               args.max_decisions,
                                               log=lambda m: print(m, flush=True))
            agree = sum((r["fused_s"] < r["split_s"]) == r["accepted"] for r in records)
            print(f"{model}: {len(records)} decisions timed in the model, the planner's "
                  f"verdict right on {agree}", flush=True)


def _in_model_table(records: list[dict], real: list[dict], unit_of, desc, args) -> None:
    """Each family's in-model decisions, scored by models trained without that family, and
    how often the kernels' isolated timings (where all three were measured) agree."""
    isolated = {(r["model"], frozenset(r["members"])): r for r in real}
    print(f"{'held out':<20}{'pairs':>6}{'fuse%':>7}{'best triv':>10}{'analyt':>8}"
          f"{'xgb mean+-std':>15}{'isolated agrees':>17}")
    for unit in sorted({unit_of(r["model"]) for r in records}):
        held = [r for r in records if unit_of(r["model"]) == unit]
        analytical, _, learned = _predictors(
            [r for r in real if unit_of(r["model"]) != unit], desc, args.min_records,
            args.seeds)
        pairs = evaluation.in_model_pairs(held)
        a = evaluation.decide(pairs, analytical)
        xs = [evaluation.decide(pairs, f, analytical) for f in learned]
        both = []
        for r in held:
            rows = [isolated.get((r["model"], frozenset(r[k]["members"])))
                    for k in ("left", "right", "union")]
            if all(rows):
                both.append(evaluation.Pair(*rows).fuse_wins == (r["fused_s"] < r["split_s"]))
        agrees = f"{sum(both)}/{len(both)}" if both else "n/a"
        print(f"{unit:<20}{a.pairs:>6}{_pct(a.fuse_share):>7}{_pct(a.best_trivial):>10}"
              f"{_pct(a.accuracy):>8}{_mean_std([x.accuracy for x in xs]):>15}{agrees:>17}")
    print()


def _training(real: list[dict], extra: list[dict], together: list[dict], unit_of):
    """unit -> the rows to train on when that unit is held out: the other units' measured
    groups, with their side-by-side rows (``together``) in place of the separately timed
    ones."""
    def train_of(unit: str) -> list[dict]:
        return side_by_side.with_side_by_side(
            [r for r in real if unit_of(r["model"]) != unit],
            [rec for rec in together if unit_of(rec["model"]) != unit]) + extra
    return train_of


def _evaluate(args) -> None:
    target = host_target()
    desc = for_target(target)
    rows = [r for r in GroupDatabase(args.work_dir or default_work_dir(target)).rows()
            if not r.get("error") and r["run_secs"] and max(r["run_secs"]) < 1e9]
    # A lone reshape is a view in a model (no kernel) but was timed as a copy kernel: no
    # ground truth for it, nor for a decision with it as a part.
    views = [r for r in rows if _features_of(r).is_view]
    rows = [r for r in rows if not _features_of(r).is_view]
    synth = [r for r in rows if models.synthetic.is_synthetic(r["model"])]
    real = [r for r in rows if not models.synthetic.is_synthetic(r["model"])]
    extra = synth if args.train_synthetic else []
    unit_of = (models.family if args.by == "family"
               else (lambda model: model.split("@")[0]))
    units = sorted({unit_of(r["model"]) for r in real})
    print(f"{len(real)} measured groups of {len({r['model'] for r in real})} model variants "
          f"({len(units)} {args.by} units), {len(synth)} of "
          f"{len({r['model'] for r in synth})} synthetic programs; training "
          f"{'with' if extra else 'without'} the synthetic programs; {len(views)} lone "
          "reshapes (views in a model, timed as copies) left out\n")
    together = side_by_side.latest_pairs(
        side_by_side.read_pairs(args.work_dir or default_work_dir(target)))
    train_of = _training(real, extra, together if args.train_side_by_side else [], unit_of)
    if args.train_side_by_side:
        print("Training on the side-by-side groups of the other units in place of their "
              "separately timed rows\n")
    print(f"Leave one {args.by} out (every variant of it held out together):")
    _table("held out", {u: _reconstructed([r for r in real if unit_of(r["model"]) == u])
                        for u in units}, train_of, desc, args)
    if together:
        # The held-out rows are the records' own three groups (times of one moment); the
        # models train on the other families' groups as above.
        by_unit: dict[str, list[dict]] = {}
        for rec in together:
            by_unit.setdefault(unit_of(rec["model"]), []).append(rec)
        versions = sorted({rec.get("kernels", "unstamped") for rec in together})
        procs = sorted({rec.get("processes", 1) for rec in together})
        print(f"Side-by-side labels ({len(together)} decisions, each decision's three kernels "
              f"timed together; `pairs` records them; kernel versions: {', '.join(versions)}; "
              "processes per decision: " + ", ".join(
                  f"{n} ({sum(rec.get('processes', 1) == n for rec in together)})"
                  for n in procs) + "):")
        _table("held out", {u: ([rec[k] for rec in recs for k in ("left", "right", "union")],
                                evaluation.side_by_side_pairs(recs))
                            for u, recs in sorted(by_unit.items())}, train_of, desc, args)
    labels = in_model.read_labels(args.work_dir or default_work_dir(target))
    if labels:
        print(f"In-model labels ({len(labels)} final decisions, each timed fused and split "
              "inside its model; `label` records them):")
        _in_model_table(labels, real, unit_of, desc, args)
    if not synth:
        return
    print("Unseen synthetic programs (trained on every real model"
          + (" and the other programs):" if extra else "):"))
    programs = sorted({r["model"] for r in synth}, key=models.synthetic.seed_of)
    _table("program", {p: _reconstructed([r for r in synth if r["model"] == p])
                       for p in programs},
           lambda p: real + [r for r in extra if r["model"] != p], desc, args)


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
    lb = sub.add_parser("label", help="time each final decision of the plan inside the model")
    lb.add_argument("--models", nargs="*", default=None)
    lb.add_argument("--size", nargs="+", choices=["small", "full"], default=["small"])
    lb.add_argument("--max-decisions", type=int, default=None)
    lb.add_argument("--repeat", type=int, default=5)
    lb.add_argument("--work-dir", default=None)
    pr = sub.add_parser("pairs", help="time each candidate decision's three kernels together")
    pr.add_argument("--models", nargs="*", default=None)
    pr.add_argument("--size", nargs="+", choices=["small", "full"], default=["small"])
    pr.add_argument("--max-pairs", type=int, default=None,
                    help="decisions per model (a repeated layer's counted once)")
    pr.add_argument("--repeat", type=int, default=7, help="rounds in each process")
    pr.add_argument("--processes", type=int, default=1,
                    help="time each decision in this many worker processes (a process's "
                         "code and buffer placement can slow a kernel steadily); a kernel "
                         "costs the mean of their medians")
    pr.add_argument("--min-repeat-ms", type=int, default=30)
    pr.add_argument("--timeout", type=float, default=120.0)
    pr.add_argument("--work-dir", default=None)
    t = sub.add_parser("train", help="train on every record and save xgb_model.json beside it")
    t.add_argument("--work-dir", default=None)
    e = sub.add_parser("evaluate", help="leave one family out: analytical vs learned")
    e.add_argument("--work-dir", default=None)
    e.add_argument("--by", choices=["family", "architecture"], default="family")
    e.add_argument("--seeds", type=int, default=5, help="learned-model training seeds")
    e.add_argument("--margin", type=float, default=0.05,
                   help="the analytical model abstains below this predicted gain")
    e.add_argument("--min-records", type=int, default=30)
    e.add_argument("--train-side-by-side", action="store_true",
                   help="train on the other units' side-by-side groups in place of their "
                        "separately timed rows")
    e.add_argument("--train-synthetic", action="store_true",
                   help="train on the synthetic programs too (default: they are test data)")
    args = parser.parse_args(argv)
    if args.cmd == "measure":
        _measure(args)
    elif args.cmd == "label":
        _label(args)
    elif args.cmd == "pairs":
        _pairs(args)
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
