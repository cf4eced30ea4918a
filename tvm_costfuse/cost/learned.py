"""The learned cost model: XGBoost predicting log(kernel seconds) from group features.

Inputs are the ``FEATURE_NAMES`` vector (log1p-scaled), the schedule class as a one-hot, and the
analytical model's estimate and breakdown terms (log seconds), so the trees learn a correction
of the analytical model rather than the machine from scratch. Training data are the measured
groups in ``tuning_logs/<target>/groups/features.jsonl`` (see ``database`` and ``feedback``).

A trained model answers with the same signature as ``analytical.estimate``. Where it cannot be
trusted -- fewer than ``MIN_RECORDS`` training records, a query whose features lie far outside
the range seen in training, or a query with no measured group near it -- it answers with the
analytical estimate instead, marks it (``confidence`` = ``FALLBACK_CONFIDENCE``,
``breakdown["fallback"] = 1``), counts it in ``LearnedModel.fallbacks`` and logs the first one
per reason: never silently.

Why "near a measured group": leave one architecture out, the trees beat the analytical model on
the held-out groups that another architecture measured (workloads recur: bert_layer and
gpt2_block share projections) and lose to it on the others, at every depth and regularization
tried (``lab/learned_variants.py``, "coverage radius"). So the trees answer only within
``NEAR`` of a training row -- where they have data -- and grow deep enough to reproduce what was
measured there; everywhere else the analytical model answers, and the report says how often.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..records.database import SHIPPED_LOGS, GroupDatabase, default_work_dir
from ..records.rows import is_synthetic_row, row_architecture
from ..schedules.classes import FINAL
from ..targets import host
from .analytical import Estimate
from .analytical import estimate as analytical_estimate
from .features import FEATURE_NAMES, GroupFeatures
from .learned_files import (
    META_FILE,
    ModelFileError,
    other_host_model,
    read_meta,
    unreadable,
    write_atomically,
)

__all__ = ["NEAR", "LearnedModel", "ModelFileError", "load_learned",
           "rows_to_dataset", "train", "train_rows"]

_log = logging.getLogger(__name__)

# Below this many measured groups the trees memorize rather than generalize: fall back.
MIN_RECORDS = 30
# A feature more than this many e-folds (in log1p units) beyond the training range is an
# extrapolation trees cannot make (they predict the edge value): fall back.
RANGE_MARGIN = 1.0
LEARNED_CONFIDENCE = 0.8
FALLBACK_CONFIDENCE = 0.1
MODEL_FILE = "xgb_model.json"
FAILED = 1e9  # run_secs at or above this are failed records (meta-schedule writes 1e10)
_SCHEDULES = FINAL
_TERMS = ("launch", "memory", "compute", "spill")
# A query answers from the trees only if some training row lies within this distance on every
# feature (log1p units: about 5% per feature) and has its schedule class (the one-hot columns:
# another class is at distance 1). Leave one architecture out, widening it to 0.2, 0.5
# and unbounded let the trees answer 27%, 43% and 100% of held-out groups instead of 23%, and
# lowered decision accuracy from 0.914 to 0.901, 0.888 and 0.867 (the analytical model: 0.886;
# learned_variants.py coverage).
NEAR = 0.05
# Deep, lightly regularized trees: inside the coverage radius the model should reproduce what
# was measured, not smooth it away. Leave one architecture out, with the radius above: shallow
# and regularized (depth 3, lambda 20, 50 rounds) 0.898, depth 6 / lambda 1 / 200 rounds 0.908,
# this point 0.914 (learned_variants.py, "coverage radius"). Without a radius every setting is
# below the analytical model (this point 0.867, the shallow one 0.825): what the trees learn of
# one architecture's kernels does not carry to another's new workloads.
_PARAMS = {"objective": "reg:squarederror", "max_depth": 8, "eta": 0.2, "subsample": 0.9,
           "colsample_bytree": 0.9, "min_child_weight": 0.5, "reg_lambda": 0.5, "seed": 0,
           "nthread": 1}
_ROUNDS = 300
POINTS_FILE = "xgb_model.points.npz"


# Ratios trees cannot form from the raw features (each split sees one feature): work per
# output element separates a depthwise conv (9 MACs per output) from a dense one (9 x C) and
# a matmul (K); arithmetic intensity and the share of bytes kept inside the group say how
# memory-bound the kernel is and how much fusion can save.
_RATIOS = (("flops", "out_elems"), ("contraction_flops", "out_elems"),
           ("flops", "bytes_io"), ("bytes_internal", "bytes_io"))


def input_names() -> list[str]:
    return ([f"log1p_{n}" for n in FEATURE_NAMES] + [f"is_{s}" for s in _SCHEDULES]
            + ["log_analytical"] + [f"log_{t}" for t in _TERMS]
            + [f"log1p_{a}_per_{b}" for a, b in _RATIOS])


def _point_width() -> int:
    """Leading input columns the coverage radius measures: the log1p features and the
    schedule-class one-hot (``input_names`` order)."""
    return len(FEATURE_NAMES) + len(_SCHEDULES)


def _margin(x: np.ndarray) -> np.ndarray:
    """The analytical log-time column: the trees start from it (XGBoost's base margin) and
    learn the correction, so a group unlike the training data keeps the analytical answer
    instead of the nearest leaf's absolute time (kernel times span 10 ns to seconds)."""
    return x[:, input_names().index("log_analytical")]


def _ratio(f: GroupFeatures, a: str, b: str) -> float:
    def value(name: str) -> float:
        return float(f.bytes_in + f.bytes_out if name == "bytes_io" else getattr(f, name))

    return math.log1p(max(0.0, value(a)) / max(1.0, value(b)))


def _inputs(f: GroupFeatures, target) -> tuple[np.ndarray, Estimate]:
    est = analytical_estimate(f, target)
    row = [math.log1p(max(0.0, v)) for v in f.vector()]
    row += [1.0 if f.schedule_on(target.kind) == s else 0.0 for s in _SCHEDULES]
    row += [math.log(max(est.seconds, 1e-12))]
    row += [math.log(max(est.breakdown.get(t, 0.0), 1e-12)) for t in _TERMS]
    row += [_ratio(f, a, b) for a, b in _RATIOS]
    return np.asarray(row, dtype=np.float64), est


def features_of(row: dict) -> GroupFeatures:
    return GroupFeatures.from_row(row)


def usable_row(row: dict) -> bool:
    """A row that measured successfully (the training data). A lone reshape is not: a model
    runs it as a view (no kernel; predicted 0 s), its row timed a copy kernel."""
    return (not row.get("error") and any(s < FAILED for s in row["run_secs"])
            and not features_of(row).is_view)


def measured_seconds(row: dict) -> float:
    """Median run time of a usable row, failed runs left out; of a row timed in several
    worker processes (``run_secs_by_process``), the mean of their medians: a kernel can run
    at two speeds by the process it lands in (placement; seen 2.8x), and a build pays either."""
    by_process = [kept for runs in row.get("run_secs_by_process", ())
                  if (kept := [s for s in runs if s < FAILED])]
    if len(by_process) > 1:
        return float(np.mean([np.median(runs) for runs in by_process]))
    return float(np.median([s for s in row["run_secs"] if s < FAILED]))


def rows_to_dataset(rows: Iterable[dict], target) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, log median seconds) of the rows that measured successfully."""
    xs, ys = [], []
    for row in filter(usable_row, rows):
        xs.append(_inputs(features_of(row), target)[0])
        ys.append(math.log(measured_seconds(row)))
    width = len(input_names())
    return np.asarray(xs, dtype=np.float64).reshape(-1, width), np.asarray(ys)


class LearnedModel:
    """A trained booster (or none) with the feature range it saw; callable like
    ``analytical.estimate``."""

    def __init__(self, booster=None, n_records: int = 0, lo: Sequence[float] | None = None,
                 hi: Sequence[float] | None = None, models: Sequence[str] = (),
                 min_records: int = MIN_RECORDS, points: np.ndarray | None = None,
                 near: float = NEAR) -> None:
        self.booster, self.n_records = booster, n_records
        self.lo = np.asarray(lo if lo is not None else [], dtype=np.float64)
        self.hi = np.asarray(hi if hi is not None else [], dtype=np.float64)
        self.models, self.min_records, self.near = tuple(models), min_records, near
        # The measured groups' features and schedule classes (deduplicated): where the trees
        # have data.
        n = _point_width()
        self.points = np.unique(np.asarray(points if points is not None else np.zeros((0, n)),
                                           dtype=np.float64).reshape(-1, n), axis=0)
        self._tree = None
        self.fallbacks: Counter[str] = Counter()
        self.queries = 0

    def _nearest(self, x: np.ndarray) -> float:
        """Largest per-feature distance (log1p units) to the closest measured group of the
        same schedule class (another class is at distance 1)."""
        if not len(self.points):
            return math.inf
        if self._tree is None:
            # scipy (an xgboost dependency) for a k-d tree under the max norm: a planner
            # queries thousands of candidates against thousands of measured groups.
            from scipy.spatial import cKDTree

            self._tree = cKDTree(self.points)
        return float(self._tree.query(x[:_point_width()], p=np.inf)[0])

    @property
    def usable(self) -> bool:
        return self.booster is not None and self.n_records >= self.min_records

    def _why_not(self, x: np.ndarray) -> str | None:
        if not self.usable:
            return f"too little data ({self.n_records} records < {self.min_records})"
        n = len(FEATURE_NAMES)
        out = (x[:n] < self.lo[:n] - RANGE_MARGIN) | (x[:n] > self.hi[:n] + RANGE_MARGIN)
        if out.any():
            return "features outside the training range: " + ", ".join(
                FEATURE_NAMES[i] for i in np.flatnonzero(out))
        distance = self._nearest(x)
        if distance > self.near:
            return (f"no measured group near it (nearest {distance:.2f} > {self.near} in "
                    "log1p feature units)")
        return None

    def __call__(self, features: GroupFeatures, target,
                 register_budget: int | None = None) -> Estimate:
        """Predicted kernel time, or the analytical estimate marked as a fallback."""
        self.queries += 1
        if features.is_view:  # no kernel at run time: nothing to learn or correct
            return analytical_estimate(features, target)
        x, est = _inputs(features, target)
        if register_budget is not None:
            est = analytical_estimate(features, target, register_budget)
        why = self._why_not(x)
        if why is not None:
            kind = why.split(":")[0].split(" (")[0]
            if not self.fallbacks[kind]:
                _log.warning("learned cost model falls back to analytical: %s", why)
            self.fallbacks[kind] += 1
            return Estimate(est.seconds, {**est.breakdown, "fallback": 1.0}, est.registers,
                            est.spill_bytes, FALLBACK_CONFIDENCE)
        import xgboost as xgb

        xs = x[None, :]
        seconds = math.exp(float(self.booster.predict(
            xgb.DMatrix(xs, base_margin=_margin(xs)))[0]))
        return Estimate(seconds, {"learned": seconds, "analytical": est.seconds},
                        est.registers, est.spill_bytes, LEARNED_CONFIDENCE)

    def fallback_report(self) -> str:
        total = sum(self.fallbacks.values())
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(self.fallbacks.items()))
        return f"{total} of {self.queries} queries fell back to analytical" + (
            f" ({parts})" if parts else "")

    # ------------------------------------------------------------------ persistence
    def save(self, work_dir: str | Path) -> Path:
        """Write ``xgb_model.json`` (the booster) and its meta file into ``work_dir``."""
        work_dir = Path(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        if self.booster is not None:
            write_atomically(work_dir / MODEL_FILE, lambda p: self.booster.save_model(str(p)))
        write_atomically(work_dir / POINTS_FILE,
                          lambda p: np.savez_compressed(str(p), points=self.points))
        meta = {"n_records": self.n_records, "lo": self.lo.tolist(), "hi": self.hi.tolist(),
                "models": list(self.models), "inputs": input_names(),
                "has_booster": self.booster is not None, "near": self.near}
        write_atomically(work_dir / META_FILE, lambda p: p.write_text(json.dumps(meta, indent=1)))
        return work_dir / MODEL_FILE

    @classmethod
    def load(cls, work_dir: str | Path) -> LearnedModel:
        """The saved model; an unusable one (answering analytically) if it is stale, with a
        warning (``load_learned`` retrains a stale model in memory instead). The coverage radius
        is the one the model was saved with. Raises :class:`ModelFileError`, naming the file
        and the fix, when a file is unreadable."""
        import xgboost as xgb

        work_dir = Path(work_dir)
        why = _stale(work_dir)
        if why is not None:
            _log.warning("learned model in %s %s; retrain it", work_dir, why)
            return cls(None, 0)
        meta = read_meta(work_dir)
        booster = None
        if meta.get("has_booster"):
            booster = xgb.Booster()
            try:
                booster.load_model(str(work_dir / MODEL_FILE))
            except (OSError, xgb.core.XGBoostError) as err:
                raise unreadable(work_dir / MODEL_FILE, str(err).splitlines()[0]) from None
        try:
            with np.load(work_dir / POINTS_FILE) as saved:
                points = saved["points"]
        except (OSError, ValueError, KeyError) as err:
            raise unreadable(work_dir / POINTS_FILE, f"{type(err).__name__}: {err}") from None
        return cls(booster, meta["n_records"], meta["lo"], meta["hi"], meta["models"],
                   points=points, near=meta["near"])


def _stale(work_dir: Path) -> str | None:
    """Why the model saved in ``work_dir`` cannot be used as it is, or None."""
    meta = read_meta(work_dir)
    if meta.get("inputs") != input_names():
        return "was trained on other inputs"
    if "near" not in meta or not (work_dir / POINTS_FILE).exists():
        return "predates the coverage radius"
    return None


def _architecture_weights(rows: Sequence[dict]) -> np.ndarray:
    """One unit of weight per architecture (``name@small`` and ``name`` are one), spread over
    its usable rows: a convnet with 50 blocks would otherwise outvote every other model, and
    what the trees learn must carry to the next architecture (leave one model out:
    0.84 -> 0.86 decision accuracy, docs/log/2026-11-29b.md)."""
    arch = [row_architecture(r) for r in filter(usable_row, rows)]
    counts = Counter(arch)
    w = np.asarray([1.0 / counts[a] for a in arch])
    return w * len(w) / w.sum()


def train_rows(rows: Sequence[dict], target, min_records: int = MIN_RECORDS,
               seed: int = 0) -> LearnedModel:
    """Train on features rows (``GroupDatabase.rows()``); ``target`` is the TargetDesc that
    prices the analytical inputs; ``seed`` draws the trees' row and column subsamples."""
    import xgboost as xgb

    x, y = rows_to_dataset(rows, target)
    models = sorted({r["model"] for r in rows})
    if len(y) == 0:
        return LearnedModel(None, 0, models=models, min_records=min_records)
    booster = xgb.train(_PARAMS | {"seed": seed}, xgb.DMatrix(x, label=y, base_margin=_margin(x),
                                             weight=_architecture_weights(rows)),
                        num_boost_round=_ROUNDS)
    return LearnedModel(booster, len(y), x.min(axis=0), x.max(axis=0), models, min_records,
                        points=x[:, :_point_width()])


def _target_work_dir(target) -> Path:
    """tuning_logs/<kind>-<arch>/groups for a TargetDesc: the database's default folder."""
    return default_work_dir(target)


def train(work_dir: str | Path, target=None, save: bool = True,
          synthetic: bool = False) -> LearnedModel:
    """Train on the measured groups in ``work_dir`` and (by default) save the model there.

    ``target``: TargetDesc for the analytical inputs; default this host. Rows of synthetic
    programs (``synth-<seed>``) are left out unless ``synthetic``: they are the evaluation's
    unseen programs, and training on them lowered the learned model's accuracy on held-out
    synthetic programs (0.74-0.81 against 0.81 without) and left it below the analytical
    model on the zoo (shallow trees answering everywhere; docs/log/2026-11-29b.md).
    """
    target = target or host()
    rows = [r for r in GroupDatabase(work_dir).rows()
            if synthetic or not is_synthetic_row(r)]
    model = train_rows(rows, target)
    if save:
        model.save(work_dir)
    return model


def load_learned(target, work_dir: str | Path | None = None) -> LearnedModel:
    """The learned model for ``target`` (a TargetDesc), as a callable like
    ``analytical.estimate``.

    Loads ``xgb_model.json`` from ``work_dir`` (default ``tuning_logs/<kind>-<arch>/groups``);
    when only measurements are there, or the saved model is stale (other inputs, no coverage
    points) or unreadable, trains in memory and says so (``train`` saves). With nothing for
    this host in the default folder, the model shipped for it serves, else another host's of
    the same kind (saying so), else every query falls back to the analytical model (saying
    so). An unreadable model with no measurements to retrain from raises ModelFileError.
    """
    default = work_dir is None
    work_dir = Path(work_dir) if work_dir is not None else _target_work_dir(target)
    measured = (work_dir / "features.jsonl").exists()
    if default and not measured and not (work_dir / META_FILE).exists():
        shipped = SHIPPED_LOGS / work_dir.parent.name / work_dir.name
        if shipped != work_dir and (shipped / META_FILE).exists():  # this host's, shipped
            return LearnedModel.load(shipped)
        other = other_host_model(work_dir, roots=(SHIPPED_LOGS,))
        if other is not None:
            _log.warning("no learned model for this host (%s): serving the one trained on %s; "
                         "its trees correct the analytical model, which prices with this "
                         "host's description (`costfuse tune` trains one here)",
                         work_dir.parent.name, other.parent.name)
            return LearnedModel.load(other)
    if (work_dir / META_FILE).exists():
        try:
            why = _stale(work_dir)
            if why is None or not measured:
                return LearnedModel.load(work_dir)
        except ModelFileError as err:
            if not measured:
                raise
            why = f"is unreadable ({err})"
        _log.warning("learned model in %s %s: training one in memory from its measurements "
                     "(`costfuse tune` or `costfuse tune --retrain-only` saves one)", work_dir, why)
    if measured:
        return train(work_dir, target, save=False)
    _log.warning("no measured groups in %s: the learned model will answer analytically",
                 work_dir)
    return LearnedModel(None, 0)
