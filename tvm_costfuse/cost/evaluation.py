"""Judging a cost model on measured groups: the fusion decisions it gets right, next to the
trivial baselines, with abstention, rank correlation and the ratio of its times to measured.

A *pair* is one fusion decision reconstructed from one model's measured groups: two groups
``left`` and ``right`` whose union was measured too. Fusing is right when the union measured
faster than the two apart. A model decides a pair when it is confident in all three times and
its predicted gain is at least ``margin`` of the unfused time; otherwise it abstains, which is
counted in its coverage rather than as a guess. Accuracy over all pairs answers an abstention
as the planner would: a learned or measured model that is not confident in all three times
falls back to the analytical model for all three (``analytical.one_footing``), the analytical
model itself keeps its own times; so accuracy and coverage are both honest.

Accuracy alone flatters a model on a set where most pairs go one way: "always fuse" and
"never fuse" are printed beside it, and a model is only useful where it beats the better one.

A label is only as sure as its timings: a pair is *clear* when its measured gain (or loss) is
larger than the spread of the repeated runs behind it (``Pair.noise``); on the others the
repeats disagree by more than the decision is worth, and either answer may be the right one.
Accuracy on the clear pairs is reported beside accuracy on all of them, never instead.

Every pair counts once in the accuracy, whatever it is worth; a plan's time is the sum of what
its decisions are worth. The *stake* of a pair is the measured time it puts at stake
(|left + right - union|, or the in-model split and fused times' difference), and the
stake-weighted accuracy is the share of all stakes a model decides right: what end-to-end
time sees. On the corpus most pairs are cheap and most stakes sit in a few contractions and
attention groups, which is where the learned model seldom answers (docs/log/2026-12-02.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import kendalltau

from .learned import measured_seconds

# predict(row) -> (seconds, confident): a model's time for a measured group's features.
Predictor = Callable[[dict], tuple[float, bool]]


@dataclass(frozen=True)
class Pair:
    """Feature rows of the two parts and their union; the label is the kernels' isolated
    times, or ``in_model`` (fused faster inside the whole model) where that was measured."""

    left: dict
    right: dict
    union: dict
    in_model: bool | None = None
    in_model_stake: float | None = None  # |split - fused| seconds inside the model

    @property
    def gain(self) -> float:
        """Measured (left + right - union) / (left + right) of the isolated timings."""
        parts = measured_seconds(self.left) + measured_seconds(self.right)
        return (parts - measured_seconds(self.union)) / parts

    @property
    def stake(self) -> float:
        """Seconds the decision is worth: |left + right - union| of the isolated timings, or
        the in-model difference where that label was measured."""
        if self.in_model_stake is not None:
            return self.in_model_stake
        return abs(measured_seconds(self.left) + measured_seconds(self.right)
                   - measured_seconds(self.union))

    @property
    def noise(self) -> float:
        """The largest relative spread, (max - min) / median, of the three groups' runs."""
        def spread(row: dict) -> float:
            runs = np.asarray(row["run_secs"], dtype=float)
            return float((runs.max() - runs.min()) / np.median(runs))
        return max(spread(self.left), spread(self.right), spread(self.union))

    @property
    def clear(self) -> bool:
        """The isolated label exceeds its runs' spread (in-model labels: always counted)."""
        return self.in_model is not None or abs(self.gain) > self.noise

    @property
    def fuse_wins(self) -> bool:
        if self.in_model is not None:
            return self.in_model
        return measured_seconds(self.union) < (measured_seconds(self.left)
                                               + measured_seconds(self.right))


def in_model_pairs(records: Sequence[dict]) -> list[Pair]:
    """``tuning.in_model`` records as pairs labelled by the in-model times."""
    return [Pair(r["left"], r["right"], r["union"], r["fused_s"] < r["split_s"],
                 abs(r["split_s"] - r["fused_s"])) for r in records]


def side_by_side_pairs(records: Sequence[dict]) -> list[Pair]:
    """``tuning.side_by_side`` records as pairs: their three rows carry the run times of the
    three kernels timed together, so every label compares times of one moment."""
    return [Pair(r["left"], r["right"], r["union"]) for r in records]


def pairs(rows: Sequence[dict]) -> list[Pair]:
    """Every split of a measured group into two measured groups, among one model's rows."""
    by_key = {frozenset(r["members"]): r for r in rows}
    out = []
    for union, u_row in by_key.items():
        if len(union) < 2:
            continue
        for left, l_row in by_key.items():
            right = union - left
            if left < union and right in by_key and min(left) < min(right):
                out.append(Pair(l_row, by_key[right], u_row))
    return out


@dataclass(frozen=True)
class Decisions:
    """How one model decided a set of pairs."""

    pairs: int
    fuse_share: float  # of pairs where fusing measured faster: "always fuse"'s accuracy
    accuracy: float  # every pair, an abstention answered by the fallback
    coverage: float  # share of pairs decided without abstaining
    decided_accuracy: float  # accuracy on the decided pairs (NaN when none)
    clear_share: float = float("nan")  # of pairs whose label exceeds its runs' spread
    clear_accuracy: float = float("nan")  # accuracy on those (NaN when none)
    stake_accuracy: float = float("nan")  # share of the pairs' stakes decided right

    @property
    def best_trivial(self) -> float:
        return max(self.fuse_share, 1.0 - self.fuse_share)


def decide(pair_list: Sequence[Pair], predict: Predictor, fallback: Predictor | None = None,
           margin: float = 0.0) -> Decisions:
    """``predict``'s decisions on ``pair_list`` (see the module docstring); ``fallback``
    answers the abstentions with all three times (default: ``predict``'s own, ignoring
    confidence: right for the analytical model; pass the analytical model for a learned or
    measured one, as the planner's ``one_footing`` does)."""
    fallback = fallback or predict
    right = decided = decided_right = clear = clear_right = 0
    stake = stake_right = 0.0
    for p in pair_list:
        (u, cu), (a, ca), (b, cb) = (predict(r) for r in (p.union, p.left, p.right))
        sure = cu and ca and cb and abs(a + b - u) >= margin * (a + b)
        if sure:
            ok = (u < a + b) == p.fuse_wins
            decided += 1
            decided_right += ok
        else:
            fu, fa, fb = (fallback(r)[0] for r in (p.union, p.left, p.right))
            ok = (fu < fa + fb) == p.fuse_wins
        right += ok
        stake += p.stake
        stake_right += ok * p.stake
        if p.clear:
            clear += 1
            clear_right += ok
    n = len(pair_list)
    fuse = sum(p.fuse_wins for p in pair_list)
    nan = float("nan")
    return Decisions(n, fuse / n if n else nan, right / n if n else nan,
                     decided / n if n else nan, decided_right / decided if decided else nan,
                     clear / n if n else nan, clear_right / clear if clear else nan,
                     stake_right / stake if stake else nan)


@dataclass(frozen=True)
class Times:
    """A model's kernel times against the measured ones, over a set of groups."""

    tau: float  # Kendall rank correlation
    ratio_p10: float  # predicted / measured: 10th percentile, median, 90th
    ratio_median: float
    ratio_p90: float


def times(rows: Sequence[dict], predict: Predictor) -> Times:
    measured = np.asarray([measured_seconds(r) for r in rows])
    predicted = np.asarray([predict(r)[0] for r in rows])
    if len(rows) < 2:
        return Times(float("nan"), float("nan"), float("nan"), float("nan"))
    p10, p50, p90 = np.percentile(predicted / measured, [10, 50, 90])
    return Times(float(kendalltau(measured, predicted).statistic), float(p10), float(p50),
                 float(p90))
