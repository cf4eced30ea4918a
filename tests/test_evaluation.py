"""``cost.evaluation``: decisions reconstructed from measured groups, scored with abstention
and against the trivial baselines; time ratios and rank correlation."""

from __future__ import annotations

import math

import pytest

from tvm_costfuse import models
from tvm_costfuse.cost import evaluation


def _row(members: str, seconds: float) -> dict:
    return {"members": list(members), "run_secs": [seconds] * 3, "model": "m"}


# Two decisions: a+b fuses well (3 < 2 + 2), c+d does not (5 > 2 + 2).
ROWS = [_row("a", 2.0), _row("b", 2.0), _row("ab", 3.0),
        _row("c", 2.0), _row("d", 2.0), _row("cd", 5.0)]


def _model(times: dict[str, float], unsure: str = ""):
    return lambda r: (times["".join(r["members"])], "".join(r["members"]) not in unsure)


def test_pairs_are_the_measured_splits() -> None:
    found = {("".join(p.left["members"]), "".join(p.right["members"]), p.fuse_wins)
             for p in evaluation.pairs(ROWS)}
    assert found == {("a", "b", True), ("c", "d", False)}


def test_decisions_with_baselines_margin_and_abstention() -> None:
    pairs = evaluation.pairs(ROWS)
    right = _model({"a": 2, "b": 2, "ab": 3.9, "c": 1, "d": 1, "cd": 3})
    d = evaluation.decide(pairs, right)
    assert (d.pairs, d.accuracy, d.coverage, d.decided_accuracy) == (2, 1.0, 1.0, 1.0)
    assert d.fuse_share == 0.5 and d.best_trivial == 0.5
    # A 2.5% predicted gain on a+b is below a 5% margin: abstained, answered by its own times.
    d = evaluation.decide(pairs, right, margin=0.05)
    assert (d.accuracy, d.coverage, d.decided_accuracy) == (1.0, 0.5, 1.0)
    # Unsure of "cd": that pair is abstained and answered by the fallback, here wrongly.
    always_fuse = _model({"a": 2, "b": 2, "ab": 1, "c": 2, "d": 2, "cd": 1})
    unsure = _model({"a": 2, "b": 2, "ab": 3.9, "c": 1, "d": 1, "cd": 3}, unsure="cd")
    d = evaluation.decide(pairs, unsure, fallback=always_fuse)
    assert (d.accuracy, d.coverage, d.decided_accuracy) == (0.5, 0.5, 1.0)
    empty = evaluation.decide([], right)
    assert empty.pairs == 0 and math.isnan(empty.accuracy)


def test_clear_pairs_are_those_whose_gain_exceeds_the_runs_spread() -> None:
    """a+b gains 25% with runs 10% apart: clear; c+d loses 2% with runs 8% apart: not."""
    rows = [{"members": ["a"], "run_secs": [1.9, 2.0, 2.1], "model": "m"},
            _row("b", 2.0), _row("ab", 3.0),
            {"members": ["c"], "run_secs": [1.9, 2.0, 2.06], "model": "m"},
            _row("d", 2.0), _row("cd", 4.08)]
    pairs = {"".join(p.left["members"]): p for p in evaluation.pairs(rows)}
    assert pairs["a"].gain == pytest.approx(0.25) and pairs["a"].noise == pytest.approx(0.1)
    assert pairs["a"].clear and not pairs["c"].clear
    # Right on a+b only: half of all pairs, every clear one.
    d = evaluation.decide(list(pairs.values()),
                          _model({"a": 2, "b": 2, "ab": 3, "c": 2, "d": 2, "cd": 3}))
    assert (d.accuracy, d.clear_share, d.clear_accuracy) == (0.5, 0.5, 1.0)


def test_stake_weighted_accuracy_weighs_each_pair_by_the_time_it_decides() -> None:
    # a+b: 2 + 2 - 3 = 1 s at stake; c+d: |2 + 2 - 5| = 1 s; e+f: |1 + 1 - 1.5| = 0.5 s.
    rows = [*ROWS, _row("e", 1.0), _row("f", 1.0), _row("ef", 1.5)]
    pairs = {"".join(p.left["members"]): p for p in evaluation.pairs(rows)}
    assert [pairs[k].stake for k in "ace"] == [1.0, 1.0, 0.5]
    # Right on a+b and c+d, wrong on e+f: 2 of 3 pairs, 2 of the 2.5 s at stake.
    d = evaluation.decide(list(pairs.values()),
                          _model({"a": 2, "b": 2, "ab": 3, "c": 2, "d": 2, "cd": 5,
                                  "e": 1, "f": 1, "ef": 3}))
    assert d.accuracy == pytest.approx(2 / 3) and d.stake_accuracy == pytest.approx(0.8)
    record = {"left": ROWS[0], "right": ROWS[1], "union": ROWS[2], "fused_s": 1.0,
              "split_s": 1.25}
    (in_model,) = evaluation.in_model_pairs([record])
    assert in_model.fuse_wins and in_model.stake == pytest.approx(0.25)


def test_times_rank_and_ratio() -> None:
    doubled = evaluation.times(ROWS, lambda r: (2 * sum(r["run_secs"]) / 3, True))
    assert doubled.tau == pytest.approx(1.0)
    assert doubled.ratio_p10 == doubled.ratio_median == doubled.ratio_p90 == pytest.approx(2.0)


def test_every_zoo_model_has_a_family() -> None:
    families = {models.family(n) for n in models.zoo.names()}
    assert families <= {"cnn", "encoder", "decoder", "decode", "elementwise"}
    assert models.family("bert_layer@small") == "encoder"
    assert models.family("synth-3") == "synthetic"
