"""The measured cost model: a group the feedback loop timed is priced by its measurement.

Why: an XGBoost correction answering every query does not carry to an architecture it was not
trained on, but the measurements themselves do, where a workload recurs (bert_layer and
gpt2_block share their projections, mlp_gelu and layernorm_mlp their matmuls). Leave one
architecture out, answering each held-out group from other architectures' measurements of
the same group and every other group analytically decided 0.918 of the measured pairs right, the analytical model
alone 0.886 (``costfuse evaluate``, docs/log/2026-11-29b.md). The learned model
(``cost.learned``) now builds on the same finding -- its trees answer only near a measured
group -- and this model stays as its exact-match form, with no trees and no training.

"The same group" is the same :class:`GroupFeatures` (every field, the per-op work and the
boundary tensor sizes included): what the planner computes for a candidate is what the
feedback loop stored beside its timing, so the lookup needs no kernel to be built at planning
time. Selected with ``costfuse.cost_model="measured"``; reads the rows of
``tuning_logs/<target>/groups`` (``costfuse tune`` fills it).

Limits of the key: the features name no op, no reduction axis and not whether a weight is a
bound constant (packed, ``schedules/prepack.py``) or a function input (not packed), so two such
groups share one entry (their median); and the folder is per CPU model, not per core count.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..records.database import GroupDatabase, default_work_dir
from .analytical import Estimate
from .analytical import estimate as analytical_estimate
from .features import GroupFeatures
from .learned import features_of, measured_seconds, usable_row

__all__ = ["MeasuredModel", "key", "load_measured"]

_log = logging.getLogger(__name__)
MEASURED_CONFIDENCE = 0.9


def key(features: GroupFeatures) -> str:
    """What identifies a group across models: all of its features, numbers as floats (a
    stored row and the planner may hold one count as an int and the other as a float)."""

    def plain(value):
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if value is None:  # a contraction geometry's absent path
            return None
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        return float(value)

    return json.dumps([plain(features.vector()),
                       {k: plain(v) for k, v in sorted(features.context().items())}])


class MeasuredModel:
    """Measured median seconds per group key, analytical for the rest; callable like
    ``analytical.estimate``. ``hits`` / ``queries`` count how often a measurement answered."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds
        self.hits = self.queries = 0

    @classmethod
    def from_rows(cls, rows: Iterable[dict]) -> MeasuredModel:
        """From features rows (``GroupDatabase.rows()``): the median over a group's successful
        rows; failed builds and lone reshapes (views in a model) are left out."""
        samples: dict[str, list[float]] = {}
        for row in filter(usable_row, rows):
            samples.setdefault(key(features_of(row)), []).append(measured_seconds(row))
        return cls({k: float(np.median(v)) for k, v in samples.items()})

    def __call__(self, features: GroupFeatures, target,
                 register_budget: int | None = None) -> Estimate:
        self.queries += 1
        est = analytical_estimate(features, target, register_budget)
        measured = None if features.is_view else self.seconds.get(key(features))
        if measured is None:
            return est
        self.hits += 1
        return Estimate(measured, {"measured": measured, "analytical": est.seconds},
                        est.registers, est.spill_bytes, MEASURED_CONFIDENCE)

    def report(self) -> str:
        return (f"{self.hits} of {self.queries} queries answered by a measurement "
                f"({len(self.seconds)} measured groups), the rest analytically")


def load_measured(target, work_dir: str | Path | None = None) -> MeasuredModel:
    """The measured model for ``target`` (a TargetDesc) from ``work_dir`` (default
    ``tuning_logs/<kind>-<arch>/groups``). With no measurements there, every query is
    answered analytically, and a warning says so."""
    work_dir = Path(work_dir) if work_dir is not None else default_work_dir(target)
    if not (work_dir / "features.jsonl").exists():
        _log.warning("no measured groups in %s: the measured cost model will answer "
                     "analytically", work_dir)
        return MeasuredModel({})
    return MeasuredModel.from_rows(GroupDatabase(work_dir).rows())
