"""Variants of the learned cost model tried against the analytical one, on the same
measured rows and the same decision-accuracy metric as ``costfuse evaluate``.

Two held-out sets: each zoo architecture in turn (small and full variants together), and each
synthetic program in turn. Variants (XGBoost at the shallow hyper-parameters the learned model
had before the coverage radius, analytical log time as the base margin):

- ``regression``: that model (squared error on log kernel time, every input);
- ``terms``: the same on the analytical terms, schedule class and ratios only (no raw sizes,
  which let trees recognise an architecture by its shapes);
- ``pairwise``: a decision-aware objective: squared error on log(fused / (left + right)) over
  the training pairs, plus 0.1 x the per-kernel squared error to keep the scale (custom
  XGBoost objective, Gauss-Newton Hessian);

each trained on the zoo only, or with the synthetic programs too (``+synth``; every synthetic
program weighted as one architecture, or all of them as one).

Then, zoo only, what else could carry to a held-out architecture:

- ``regression, loose``: that model with little regularization (lambda 1, depth 6,
  200 rounds): can the trees simply learn more?
- ``recalibrated terms``: no trees; the analytical terms (launch, max and min of memory and
  compute, spill) with one non-negative multiplier per term and schedule class, fit by relative
  least squares: a smooth correction gives a merged group and its parts correlated errors;
- ``pair classifier``: XGBoost on the pairs themselves (fuse or not), starting from the
  analytical verdict (base margin 20 x its log ratio) with shallow trees;
- ``database lookup``: a held-out kernel whose workload another architecture measured
  (same workload hash) takes that measured time; the others keep the analytical (or the
  shallow learned) estimate.

The "coverage radius": the trees answer a held-out group only where some training group
lies within a radius on every feature (log1p units), the analytical model elsewhere; three tree
settings (the session-2 shallow point, a looser one, the committed deep one) at radii 0.05, 0.2,
0.5 and unbounded. Shows where the trees carry (near measured workloads) and where they do not.

The "per-store features": meta-schedule's ``PerStoreFeature`` of each measured kernel
(its workload and our rules' trace, replayed from the TVM ``JSONDatabase``; per kernel the
maximum and mean over stores and log1p of the store count) added to the inputs, or in place of
the raw features (keeping the analytical log time), each at radii 0.05, 0.5 and unbounded. The
held-out kernels' own schedules are given, which a planner weighing a candidate would not have.

    TVM_COSTFUSE_CALIBRATION=none python lab/learned_variants.py [coverage | perstore]

(``coverage`` or ``perstore``: that table alone; ``perstore`` needs the database files.)
"""

from __future__ import annotations

import math
import sys
from collections import Counter

import numpy as np
import xgboost as xgb

from tvm_costfuse import models
from tvm_costfuse.cost import learned
from tvm_costfuse.cost.evaluation import pairs as decision_pairs
from tvm_costfuse.cost.learned import measured_seconds
from tvm_costfuse.records.database import GroupDatabase, default_work_dir
from tvm_costfuse.targets import for_target, host_target

PAIR_SCALE = 0.1  # weight of the per-kernel term in the pairwise objective
# The learned model's trees before the coverage radius, which the variants
# below were scored with; and a looser setting.
_SHALLOW = {**learned._PARAMS, "max_depth": 3, "eta": 0.08, "min_child_weight": 10.0,
            "reg_lambda": 20.0}
_SHALLOW_ROUNDS = 50
_LOOSE = {**learned._PARAMS, "max_depth": 6, "eta": 0.1, "min_child_weight": 1.0,
          "reg_lambda": 1.0}


class Data:
    """The usable rows as arrays, with every pair (left, right, union) as row indices."""

    def __init__(self) -> None:
        target = host_target()
        self.desc = for_target(target)
        self.rows = [r for r in GroupDatabase(default_work_dir(target)).rows()
                     if learned.usable_row(r)]
        self.x = np.array([learned._inputs(learned.features_of(r), self.desc)[0]
                           for r in self.rows])
        self.y = np.array([math.log(measured_seconds(r)) for r in self.rows])
        names = learned.input_names()
        self.margin = self.x[:, names.index("log_analytical")]
        self.terms = [i for i, n in enumerate(names) if n.startswith(("is_", "log_"))
                      or "_per_" in n]
        self.model = np.array([r["model"] for r in self.rows])
        self.synth = np.array([models.synthetic.is_synthetic(m) for m in self.model])
        self.unit = np.array([m if s else m.split("@")[0]
                              for m, s in zip(self.model, self.synth, strict=True)])
        where = {id(r): i for i, r in enumerate(self.rows)}
        pairs = []
        for m in sorted(set(self.model)):
            group = [self.rows[i] for i in np.flatnonzero(self.model == m)]
            pairs += [(where[id(p.left)], where[id(p.right)], where[id(p.union)])
                      for p in decision_pairs(group)]
        self.pairs = np.array(pairs)


def _weights(units: np.ndarray, synth_as_one: bool) -> np.ndarray:
    keys = np.array(["synth" if synth_as_one and u.startswith(models.synthetic.PREFIX) else u
                     for u in units])
    counts = Counter(keys)
    w = np.array([1.0 / counts[k] for k in keys])
    return w * len(w) / w.sum()


def _fit(d: Data, train: np.ndarray, variant: str, synth_as_one: bool):
    idx = np.flatnonzero(train)
    cols = d.terms if variant == "terms" else slice(None)
    w = _weights(d.unit[idx], synth_as_one)
    dm = xgb.DMatrix(d.x[idx][:, cols], label=d.y[idx], base_margin=d.margin[idx], weight=w)
    if variant != "pairwise":
        return xgb.train(_SHALLOW, dm, num_boost_round=_SHALLOW_ROUNDS), cols
    local = -np.ones(len(d.rows), dtype=int)
    local[idx] = np.arange(len(idx))
    p = local[np.array([q for q in d.pairs if train[q].all()])]
    y, pw = d.y[idx], w[p[:, 2]]
    target = y[p[:, 2]] - np.logaddexp(y[p[:, 0]], y[p[:, 1]])

    def objective(s, _dm):
        g = 2 * PAIR_SCALE * w * (s - y)
        h = 2 * PAIR_SCALE * w.copy()
        parts = np.logaddexp(s[p[:, 0]], s[p[:, 1]])
        share_a = np.exp(s[p[:, 0]] - parts)
        r = 2 * (s[p[:, 2]] - parts - target) * pw
        for col, dz in ((2, 1.0), (0, -share_a), (1, -(1 - share_a))):
            np.add.at(g, p[:, col], r * dz)
            np.add.at(h, p[:, col], 2 * pw * dz * dz)
        return g, h + 1e-6

    params = {k: v for k, v in _SHALLOW.items() if k != "objective"}
    return xgb.train(params, dm, num_boost_round=_SHALLOW_ROUNDS, obj=objective), cols


def _hits(d: Data, idx: np.ndarray, log_pred: np.ndarray) -> tuple[int, int, int, int]:
    """(correct decisions, pairs, wrong "fuse", wrong "keep apart") among the pairs inside
    ``idx`` (one model variant)."""
    pred = dict(zip(idx.tolist(), np.exp(log_pred), strict=True))
    meas = np.exp(d.y)
    pairs = [q for q in d.pairs if all(int(i) in pred for i in q)]
    says = [(meas[u] < meas[a] + meas[b], pred[u] < pred[a] + pred[b]) for a, b, u in pairs]
    return (sum(m == p for m, p in says), len(says), sum(p and not m for m, p in says),
            sum(m and not p for m, p in says))


def _score(d: Data, held_units: list[str], variant: str, with_synth: bool,
           synth_as_one: bool) -> tuple[float, float, tuple[int, int], tuple[int, int]]:
    """(analytical, learned) decision accuracy pooled over ``held_units`` held out in turn, and
    each model's (wrong "fuse", wrong "keep apart") counts."""
    h_a = h_l = n = 0
    err_a, err_l = [0, 0], [0, 0]
    for unit in held_units:
        test = d.unit == unit
        train = ~test & (~d.synth | with_synth)
        booster, cols = _fit(d, train, variant, synth_as_one)
        for m in sorted(set(d.model[test])):
            idx = np.flatnonzero(d.model == m)
            s = booster.predict(xgb.DMatrix(d.x[idx][:, cols], base_margin=d.margin[idx]),
                                output_margin=True)
            hits, k, wf, ws = _hits(d, idx, s)
            h_l += hits
            n += k
            err_l = [err_l[0] + wf, err_l[1] + ws]
            hits, _, wf, ws = _hits(d, idx, d.margin[idx])
            h_a += hits
            err_a = [err_a[0] + wf, err_a[1] + ws]
    if not n:
        raise SystemExit("no measured pairs in the held-out units: measure first")
    return h_a / n, h_l / n, tuple(err_a), tuple(err_l)


def _zoo_lomo(d: Data, predict) -> float:
    """Decision accuracy over the zoo, each architecture held out in turn; ``predict(train,
    test)`` returns predicted seconds for the rows in ``test`` (boolean masks)."""
    zoo = ~d.synth
    pred = np.zeros(len(d.rows))
    for unit in sorted(set(d.unit[zoo])):
        test = d.unit == unit
        pred[test] = predict(zoo & ~test, test)
    return _pair_accuracy(d, pred, zoo)


def _pair_accuracy(d: Data, pred: np.ndarray, mask: np.ndarray) -> float:
    meas = np.exp(d.y)
    says = [(meas[u] < meas[a] + meas[b]) == (pred[u] < pred[a] + pred[b])
            for a, b, u in d.pairs if mask[u]]
    return sum(says) / len(says)


def _loose(d: Data, train, test) -> np.ndarray:
    params = _LOOSE
    dm = xgb.DMatrix(d.x[train], label=d.y[train], base_margin=d.margin[train],
                     weight=_weights(d.unit[train], False))
    booster = xgb.train(params, dm, num_boost_round=200)
    return np.exp(booster.predict(xgb.DMatrix(d.x[test], base_margin=d.margin[test]),
                                  output_margin=True))


def _term_matrix(d: Data) -> np.ndarray:
    """Per row: (launch, max(memory, compute), min(memory, compute), spill) in the column block
    of its schedule class, zero elsewhere."""
    from tvm_costfuse.cost.analytical import estimate

    classes = learned._SCHEDULES
    out = np.zeros((len(d.rows), 4 * len(classes)))
    for i, row in enumerate(d.rows):
        f = learned.features_of(row)
        b = estimate(f, d.desc).breakdown
        k = 4 * classes.index(f.schedule_on(d.desc.kind))
        out[i, k:k + 4] = (b["launch"], max(b["memory"], b["compute"]),
                           min(b["memory"], b["compute"]), b["spill"])
    return out


def _recalibrated(d: Data, terms: np.ndarray, train, test) -> np.ndarray:
    # scipy (an xgboost dependency) for non-negative least squares: a multiplier below zero
    # would make a cost term a gain.
    from scipy.optimize import nnls

    meas = np.exp(d.y[train])
    w = np.sqrt(_weights(d.unit[train], False))
    coef, _ = nnls(terms[train] / meas[:, None] * w[:, None], w)
    return terms[test] @ coef


def _pair_classifier(d: Data) -> float:
    meas, est = np.exp(d.y), np.exp(d.margin)
    a, b, u = d.pairs.T
    prior = -20 * np.log(est[u] / (est[a] + est[b]))  # > 0: the analytical model says fuse
    x = np.hstack([prior[:, None], d.x[u], d.x[u] - np.maximum(d.x[a], d.x[b])])
    label = (meas[u] < meas[a] + meas[b]).astype(float)
    unit, zoo = d.unit[u], ~d.synth[u]
    params = {"objective": "binary:logistic", "max_depth": 2, "eta": 0.05, "reg_lambda": 20.0,
              "min_child_weight": 5.0, "seed": 0, "nthread": 1}
    says = np.zeros(len(u), dtype=bool)
    for held in sorted(set(unit[zoo])):
        train, test = zoo & (unit != held), unit == held
        dm = xgb.DMatrix(x[train], label=label[train], base_margin=prior[train],
                         weight=_weights(unit[train], False))
        booster = xgb.train(params, dm, num_boost_round=100)
        says[test] = booster.predict(xgb.DMatrix(x[test], base_margin=prior[test]),
                                     output_margin=True) > 0
    return float(np.mean(says[zoo] == label[zoo].astype(bool)))


def _lookup(d: Data, fallback, train, test) -> np.ndarray:
    hashes = np.array([r["workload_hash"] for r in d.rows])
    known: dict[str, list[float]] = {}
    for i in np.flatnonzero(train):
        known.setdefault(hashes[i], []).append(math.exp(d.y[i]))
    pred = fallback(d, train, test)
    for j, i in enumerate(np.flatnonzero(test)):
        if hashes[i] in known:
            pred[j] = float(np.median(known[hashes[i]]))
    return pred


def _shallow_regression(d: Data, train, test) -> np.ndarray:
    booster, _ = _fit(d, train, "regression", False)
    return np.exp(booster.predict(xgb.DMatrix(d.x[test], base_margin=d.margin[test]),
                                  output_margin=True))


def _gated(d: Data, x: np.ndarray, params: dict, rounds: int, radius: float,
           answered: list | None = None):
    """A ``_zoo_lomo`` predictor as ``LearnedModel`` answers: trees trained on inputs ``x``
    where a training row lies within ``radius`` (features and schedule class, max norm), the
    analytical estimate elsewhere; ``answered`` collects (answered, asked) per fold."""
    from scipy.spatial import cKDTree  # an xgboost dependency

    n = learned._point_width()

    def predict(train, test):
        dm = xgb.DMatrix(x[train], label=d.y[train], base_margin=d.margin[train],
                         weight=_weights(d.unit[train], False))
        booster = xgb.train(params, dm, num_boost_round=rounds)
        trees = np.exp(booster.predict(xgb.DMatrix(x[test], base_margin=d.margin[test]),
                                       output_margin=True))
        dist, _ = cKDTree(d.x[train][:, :n]).query(d.x[test][:, :n], p=np.inf)
        near = dist <= radius
        if answered is not None:
            answered.append((near.sum(), len(near)))
        return np.where(near, trees, np.exp(d.margin[test]))

    return predict


def coverage_sweep(d: Data) -> None:
    print(f"\n{'coverage radius (zoo, leave one out)':<40}{'radius':>8}{'answered':>10}"
          f"{'decision accuracy':>19}")
    print(f"{'analytical':<40}{'':>8}{'':>10}"
          f"{_pair_accuracy(d, np.exp(d.margin), ~d.synth):>19.3f}")
    for label, params, rounds in (("shallow (depth 3, lambda 20, 50 rounds)", _SHALLOW,
                                   _SHALLOW_ROUNDS),
                                  ("loose (depth 6, lambda 1, 200 rounds)", _LOOSE, 200),
                                  ("committed (learned._PARAMS)", learned._PARAMS,
                                   learned._ROUNDS)):
        for radius in (0.05, 0.2, 0.5, math.inf):
            answered: list[tuple[int, int]] = []
            acc = _zoo_lomo(d, _gated(d, d.x, params, rounds, radius, answered))
            share = sum(a for a, _ in answered) / sum(b for _, b in answered)
            print(f"{label:<40}{radius:>8}{share:>10.0%}{acc:>19.3f}", flush=True)


def _per_store(d: Data) -> np.ndarray:
    """Per row: max and mean of PerStoreFeature over the kernel's stores, log1p(stores)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_costfuse.records.database import workload_hash

    target = host_target()
    db = GroupDatabase(default_work_dir(target)).ms_database
    extractor = ms.feature_extractor.PerStoreFeature()
    by_hash: dict[str, np.ndarray] = {}
    for record in db.get_all_tuning_records():
        whash = workload_hash(record.workload.mod["main"])
        if whash in by_hash:
            continue
        sch = tvm.s_tir.Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        cand = ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"]))
        per_store = extractor.extract_from(ms.TuneContext(mod=sch.mod, target=target),
                                           [cand])[0].numpy()
        by_hash[whash] = np.concatenate([per_store.max(axis=0), per_store.mean(axis=0),
                                         [math.log1p(len(per_store))]])
    missing = [r["workload_hash"] for r in d.rows if r["workload_hash"] not in by_hash]
    if missing:
        raise SystemExit(f"{len(missing)} rows have no tuning record in the database "
                         "(regenerate it: costfuse tune)")
    return np.array([by_hash[r["workload_hash"]] for r in d.rows])


def per_store_table(d: Data) -> None:
    per_store = _per_store(d)
    analytical = d.x[:, [learned.input_names().index("log_analytical")]]
    inputs = (("our inputs", d.x), ("our inputs + per-store", np.hstack([d.x, per_store])),
              ("per-store + analytical time", np.hstack([per_store, analytical])))
    print(f"\n{'per-store features (zoo, leave one out)':<40}{'radius':>8}"
          + "".join(f"{label:>30}" for label, _ in inputs))
    for label, params, rounds in (("shallow", _SHALLOW, _SHALLOW_ROUNDS),
                                  ("committed", learned._PARAMS, learned._ROUNDS)):
        for radius in (0.05, 0.5, math.inf):
            accs = []
            for _, x in inputs:
                accs.append(_zoo_lomo(d, _gated(d, x, params, rounds, radius)))
            print(f"{label:<40}{radius:>8}" + "".join(f"{a:>30.3f}" for a in accs),
                  flush=True)


def other_variants(d: Data) -> None:
    terms = _term_matrix(d)
    analytical = lambda _d, _train, test: np.exp(d.margin[test])
    print(f"\n{'zoo only, leave one architecture out':<40}{'decision accuracy':>18}")
    for label, acc in (
        ("analytical", _pair_accuracy(d, np.exp(d.margin), ~d.synth)),
        ("regression, loose", _zoo_lomo(d, lambda tr, te: _loose(d, tr, te))),
        ("recalibrated terms", _zoo_lomo(d, lambda tr, te: _recalibrated(d, terms, tr, te))),
        ("pair classifier", _pair_classifier(d)),
        ("database lookup + analytical",
         _zoo_lomo(d, lambda tr, te: _lookup(d, analytical, tr, te))),
        ("database lookup + regression",
         _zoo_lomo(d, lambda tr, te: _lookup(d, _shallow_regression, tr, te))),
    ):
        print(f"{label:<40}{acc:>18.3f}", flush=True)


def main() -> None:
    d = Data()
    if sys.argv[1:] == ["coverage"]:
        coverage_sweep(d)
        return
    if sys.argv[1:] == ["perstore"]:
        per_store_table(d)
        return
    zoo_units = sorted(set(d.unit[~d.synth]))
    syn_units = sorted(set(d.unit[d.synth]), key=models.synthetic.seed_of)
    print(f"{len(d.rows)} rows, {len(d.pairs)} pairs; {len(zoo_units)} zoo architectures, "
          f"{len(syn_units)} synthetic programs")
    print(f"{'variant':<34}{'zoo: analyt':>12}{'xgb':>7}{'synthetic: analyt':>19}{'xgb':>7}"
          f"{'zoo wrong fuse/apart: analyt':>30}{'xgb':>9}")
    for variant in ("regression", "terms", "pairwise"):
        for with_synth, as_one in ((False, False), (True, False), (True, True)):
            label = variant + ("" if not with_synth else
                               " +synth (all as one)" if as_one else " +synth (each one)")
            za, zl, ea, el = _score(d, zoo_units, variant, with_synth, as_one)
            sa, sl, _, _ = _score(d, syn_units, variant, with_synth, as_one)
            print(f"{label:<34}{za:>12.3f}{zl:>7.3f}{sa:>19.3f}{sl:>7.3f}"
                  f"{f'{ea[0]}/{ea[1]}':>30}{f'{el[0]}/{el[1]}':>9}", flush=True)
    other_variants(d)
    coverage_sweep(d)


if __name__ == "__main__":
    main()
