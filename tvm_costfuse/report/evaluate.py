"""``costfuse evaluate``: the cost models scored on measured fusion decisions of models they
were not trained on.

Each unit (an architecture family, ``models.family``, or with ``by="architecture"`` one model
with its small and full variants) is held out in turn: the learned model trains on the other
units' measured groups (``seeds`` times, the trees' subsamples drawn anew) and every model is
scored on the held-out unit's decisions (``cost.evaluation``): the analytical model, the
learned one (where its trees do not answer, the analytical model's, as in the planner), and
the measured model (a held-out group that another unit measured priced by that measurement).
Holding out a whole family, not a model, is what makes the score one for an architecture
nobody measured: variants of one family share their kernels' workloads.

Tables, one line per held-out unit and a pooled line:

1. the decisions reconstructed from separately timed groups (``features.jsonl``);
2. the side-by-side labels, where ``pairs.jsonl`` holds some (``costfuse tune --labels pairs``);
3. the in-model labels, where ``in_model.jsonl`` holds some (``--labels in-model``), with how
   often the isolated timings agree with them;
4. each synthetic program (``synth-<seed>``), never trained on unless ``train_synthetic``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from .. import models
from ..cost import evaluation
from ..cost.analytical import estimate
from ..cost.learned import (
    FAILED,
    FALLBACK_CONFIDENCE,
    MIN_RECORDS,
    features_of,
    measured_seconds,
    train_rows,
)
from ..cost.measured import MeasuredModel
from ..records.database import GroupDatabase
from ..targets import TargetDesc
from ..tuning import in_model, side_by_side

__all__ = ["EvalOptions", "evaluate", "table", "usable_rows"]

UNITS = ("family", "architecture")

Out = Callable[[str], None]


@dataclass(frozen=True)
class EvalOptions:
    """What ``costfuse evaluate`` holds out and how the learned model is trained."""

    by: str = "family"  # one of UNITS
    seeds: int = 5  # learned-model trainings per held-out unit
    margin: float = 0.05  # the analytical model abstains below this predicted gain
    min_records: int = MIN_RECORDS  # fewer training rows: the learned model falls back
    train_side_by_side: bool = False  # train on the side-by-side rows of the other units
    train_synthetic: bool = False  # train on the synthetic programs too

    def __post_init__(self) -> None:
        if self.by not in UNITS:
            raise ValueError(f"EvalOptions.by must be one of {UNITS}, got {self.by!r}")

    def unit_of(self, model: str) -> str:
        return models.family(model) if self.by == "family" else model.split("@")[0]


def _predictors(train: list[dict], desc: TargetDesc, opts: EvalOptions):
    """(analytical, measured, [learned per seed]) predictors trained on ``train``."""
    def analytical(r):
        return estimate(features_of(r), desc).seconds, True

    measured_model = MeasuredModel.from_rows(train)

    def measured(r):  # confident where a measurement answers
        e = measured_model(features_of(r), desc)
        return e.seconds, "measured" in e.breakdown

    def learned_of(model):
        def predict(r):
            e = model(features_of(r), desc)
            return e.seconds, e.confidence != FALLBACK_CONFIDENCE
        return predict

    learned = [learned_of(train_rows(train, desc, min_records=opts.min_records, seed=s))
               for s in range(opts.seeds)]
    return analytical, measured, learned


def _pct(x: float) -> str:
    return "   n/a" if math.isnan(x) else f"{100 * x:6.1f}"


def _mean_std(values: list[float]) -> str:
    return f"{100 * np.mean(values):5.1f}+-{100 * np.std(values):3.1f}"


def _reconstructed(held: list[dict]) -> tuple[list[dict], list[evaluation.Pair]]:
    """The groups and the pairs among each model's measured groups."""
    return held, [p for v in sorted({r["model"] for r in held})
                  for p in evaluation.pairs([r for r in held if r["model"] == v])]


def table(title: str, held_out: dict[str, tuple[list[dict], list[evaluation.Pair]]],
          train_for: Callable[[str], list[dict]], desc: TargetDesc, opts: EvalOptions,
          out: Out = print) -> None:
    """Hold out each unit in turn, train on ``train_for(unit)``, write one line per unit and
    the pooled line (accuracies in %, pooled over pairs). ``held_out``: per unit, its groups
    (times, rank correlation) and its decisions."""
    head = (f"{title:<20}{'groups':>7}{'pairs':>6}{'fuse%':>7}{'best triv':>10}"
            f"{'analyt':>8}{'cov@m':>7}{'dec acc':>8}{'xgb mean+-std':>15}{'xgb cov':>8}"
            f"{'xgb dec':>8}{'meas':>7}{'tau a':>7}{'tau x':>7}{'a/meas p10 p50 p90':>20}"
            f"{'x/meas p50':>11}{'clear%':>7}{'a clear':>8}{'x clear':>8}{'a stake':>8}"
            f"{'x stake':>8}")
    out(head)
    out("-" * len(head))
    pooled: dict[str, list] = {k: [] for k in (
        "n", "fuse", "a", "a_cov", "a_dec", "x", "x_cov", "x_dec", "m", "clear", "a_clear",
        "x_clear", "stake_s", "a_stake", "x_stake")}
    all_meas, all_a, all_x = [], [], []
    for unit, (held, pair_list) in held_out.items():
        analytical, measured, learned = _predictors(train_for(unit), desc, opts)
        a = evaluation.decide(pair_list, analytical, margin=opts.margin)
        # A decision the trees (or measurements) do not answer whole is the analytical
        # model's, as in the planner (``analytical.one_footing``).
        xs = [evaluation.decide(pair_list, f, analytical) for f in learned]
        m = evaluation.decide(pair_list, measured, analytical)
        ta, tx = evaluation.times(held, analytical), evaluation.times(held, learned[0])
        x_clear = np.mean([x.clear_accuracy for x in xs])
        x_stake = np.mean([x.stake_accuracy for x in xs])
        out(f"{unit:<20}{len(held):>7}{a.pairs:>6}{_pct(a.fuse_share):>7}"
            f"{_pct(a.best_trivial):>10}{_pct(a.accuracy):>8}{_pct(a.coverage):>7}"
            f"{_pct(a.decided_accuracy):>8}{_mean_std([x.accuracy for x in xs]):>15}"
            f"{_pct(xs[0].coverage):>8}{_pct(xs[0].decided_accuracy):>8}"
            f"{_pct(m.accuracy):>7}{ta.tau:>7.2f}{tx.tau:>7.2f}"
            f"{ta.ratio_p10:>8.2f}{ta.ratio_median:>6.2f}{ta.ratio_p90:>6.2f}"
            f"{tx.ratio_median:>11.2f}{_pct(a.clear_share):>7}{_pct(a.clear_accuracy):>8}"
            f"{_pct(x_clear):>8}{_pct(a.stake_accuracy):>8}{_pct(x_stake):>8}")
        if a.pairs:
            for key, value in (("n", a.pairs), ("fuse", a.fuse_share), ("a", a.accuracy),
                               ("a_cov", a.coverage), ("a_dec", a.decided_accuracy),
                               ("x", [x.accuracy for x in xs]), ("x_cov", xs[0].coverage),
                               ("x_dec", xs[0].decided_accuracy), ("m", m.accuracy),
                               ("clear", a.clear_share), ("a_clear", a.clear_accuracy),
                               ("x_clear", x_clear),
                               ("stake_s", sum(p.stake for p in pair_list) / a.pairs),
                               ("a_stake", a.stake_accuracy), ("x_stake", x_stake)):
                pooled[key].append(value)
        all_meas += [measured_seconds(r) for r in held]
        all_a += [analytical(r)[0] for r in held]
        all_x += [learned[0](r)[0] for r in held]
    out("-" * len(head))
    n = np.asarray(pooled["n"], dtype=float)
    if not n.sum():
        out("all: no measured pairs to score\n")
        return

    def pool(key, weight=None):
        v = np.asarray(pooled[key], dtype=float)
        w = n if weight is None else n * np.asarray(pooled[weight], dtype=float)
        ok = ~np.isnan(v) & ~np.isnan(w)
        return float((v[ok] * w[ok]).sum() / w[ok].sum()) if ok.any() else float("nan")

    def tau(predicted: list[float]) -> float:
        return kendalltau(all_meas, predicted).statistic if len(all_meas) > 1 else math.nan

    fuse = pool("fuse")
    seeds = [float((np.asarray(pooled["x"])[:, s] * n).sum() / n.sum())
             for s in range(opts.seeds)]
    out(f"{'all (pooled)':<20}{len(all_meas):>7}{int(n.sum()):>6}{_pct(fuse):>7}"
        f"{_pct(max(fuse, 1 - fuse)):>10}{_pct(pool('a')):>8}{_pct(pool('a_cov')):>7}"
        f"{_pct(pool('a_dec')):>8}{_mean_std(seeds):>15}{_pct(pool('x_cov')):>8}"
        f"{_pct(pool('x_dec')):>8}{_pct(pool('m')):>7}{tau(all_a):>7.2f}{tau(all_x):>7.2f}"
        f"{'':>31}{_pct(pool('clear')):>7}"
        f"{_pct(pool('a_clear', 'clear')):>8}{_pct(pool('x_clear', 'clear')):>8}"
        f"{_pct(pool('a_stake', 'stake_s')):>8}{_pct(pool('x_stake', 'stake_s')):>8}")
    out(f"(xgb: {opts.seeds} training seeds, mean +- std; coverage and decided accuracy of "
        f"seed 0; analytical abstains below a predicted gain of {opts.margin:.0%}; clear: "
        "pairs whose measured gain exceeds their runs' spread, accuracy there, xgb over "
        "the seeds; stake: the share of the measured seconds at stake decided right)\n")


def _in_model_table(records: list[dict], real: list[dict], desc: TargetDesc,
                    opts: EvalOptions, out: Out) -> None:
    """Each unit's in-model decisions, scored by models trained without that unit, and how
    often the kernels' isolated timings (where all three were measured) agree."""
    isolated = {(r["model"], frozenset(r["members"])): r for r in real}
    out(f"{'held out':<20}{'pairs':>6}{'fuse%':>7}{'best triv':>10}{'analyt':>8}"
        f"{'xgb mean+-std':>15}{'isolated agrees':>17}")
    for unit in sorted({opts.unit_of(r["model"]) for r in records}):
        held = [r for r in records if opts.unit_of(r["model"]) == unit]
        analytical, _, learned = _predictors(
            [r for r in real if opts.unit_of(r["model"]) != unit], desc, opts)
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
        out(f"{unit:<20}{a.pairs:>6}{_pct(a.fuse_share):>7}{_pct(a.best_trivial):>10}"
            f"{_pct(a.accuracy):>8}{_mean_std([x.accuracy for x in xs]):>15}{agrees:>17}")
    out("")


def _side_by_side_table(together: list[dict], train_of, desc: TargetDesc, opts: EvalOptions,
                        out: Out) -> None:
    """The held-out rows are the records' own three groups (times of one moment); the models
    train on the other units' groups as in the first table."""
    by_unit: dict[str, list[dict]] = {}
    for rec in together:
        by_unit.setdefault(opts.unit_of(rec["model"]), []).append(rec)
    versions = sorted({rec.get("kernels", "unstamped") for rec in together})
    procs = sorted({rec.get("processes", 1) for rec in together})
    out(f"Side-by-side labels ({len(together)} decisions, each decision's three kernels timed "
        f"together by `costfuse tune --labels pairs`; kernel versions: {', '.join(versions)}; "
        "processes per decision: " + ", ".join(
            f"{n} ({sum(rec.get('processes', 1) == n for rec in together)})" for n in procs)
        + "):")
    table("held out", {u: ([rec[k] for rec in recs for k in ("left", "right", "union")],
                           evaluation.side_by_side_pairs(recs))
                       for u, recs in sorted(by_unit.items())}, train_of, desc, opts, out)


def usable_rows(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(rows with a successful timing that are kernels, lone reshapes): a lone reshape is a
    view in a model (no kernel) but was timed as a copy kernel, so neither it nor a decision
    with it as a part has a ground truth."""
    timed = [r for r in rows
             if not r.get("error") and r["run_secs"] and max(r["run_secs"]) < FAILED]
    views = [r for r in timed if features_of(r).is_view]
    return [r for r in timed if not features_of(r).is_view], views


def evaluate(work_dir: str | Path, desc: TargetDesc, opts: EvalOptions,
             out: Out = print) -> None:
    """Every table of the module docstring for the records in ``work_dir``, priced with
    ``desc``, written line by line to ``out``."""
    rows, views = usable_rows(GroupDatabase(work_dir).rows())
    synth = [r for r in rows if models.synthetic.is_synthetic(r["model"])]
    real = [r for r in rows if not models.synthetic.is_synthetic(r["model"])]
    extra = synth if opts.train_synthetic else []
    units = sorted({opts.unit_of(r["model"]) for r in real})
    out(f"{len(real)} measured groups of {len({r['model'] for r in real})} model variants "
        f"({len(units)} {opts.by} units), {len(synth)} of "
        f"{len({r['model'] for r in synth})} synthetic programs; training "
        f"{'with' if extra else 'without'} the synthetic programs; {len(views)} lone "
        "reshapes (views in a model, timed as copies) left out\n")
    together = side_by_side.latest_pairs(side_by_side.read_pairs(work_dir))
    trained_together = together if opts.train_side_by_side else []

    def train_of(unit: str) -> list[dict]:
        """The other units' groups, their side-by-side rows in place of the separately
        timed ones when asked."""
        return side_by_side.with_side_by_side(
            [r for r in real if opts.unit_of(r["model"]) != unit],
            [rec for rec in trained_together if opts.unit_of(rec["model"]) != unit]) + extra

    if opts.train_side_by_side:
        out("Training on the side-by-side groups of the other units in place of their "
            "separately timed rows\n")
    out(f"Leave one {opts.by} out (every variant of it held out together):")
    table("held out", {u: _reconstructed([r for r in real if opts.unit_of(r["model"]) == u])
                       for u in units}, train_of, desc, opts, out)
    if together:
        _side_by_side_table(together, train_of, desc, opts, out)
    labels = in_model.read_labels(work_dir)
    if labels:
        out(f"In-model labels ({len(labels)} final decisions, each timed fused and split "
            "inside its model by `costfuse tune --labels in-model`):")
        _in_model_table(labels, real, desc, opts, out)
    if not synth:
        return
    out("Unseen synthetic programs (trained on every real model"
        + (" and the other programs):" if extra else "):"))
    programs = sorted({r["model"] for r in synth}, key=models.synthetic.seed_of)
    table("program", {p: _reconstructed([r for r in synth if r["model"] == p])
                      for p in programs},
          lambda p: real + [r for r in extra if r["model"] != p], desc, opts, out)
