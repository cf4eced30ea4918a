"""``cost.evaluation``: decisions reconstructed from measured groups, scored with abstention
and against the trivial baselines; time ratios and rank correlation; and ``costfuse evaluate``,
which prints them leaving one family out, on a tiny database."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tvm_costfuse import models
from tvm_costfuse.cli import main
from tvm_costfuse.cost import evaluation
from tvm_costfuse.cost.features import FEATURE_NAMES, GroupFeatures


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


def _db_row(model: str, members: str, seconds: float, rng) -> dict:
    """A measured group as ``costfuse tune`` records it (features of a made-up elementwise
    group, its size drawn by ``rng``)."""
    n, elems = len(members), int(rng.integers(1 << 10, 1 << 16))
    f = GroupFeatures(n_ops=n, n_contractions=0, n_reductions=0, flops=float(elems * n),
                      contraction_flops=0.0, recompute_flops=0.0, bytes_in=4 * elems,
                      bytes_out=4 * elems, bytes_internal=4 * elems * (n - 1), chain_length=n,
                      out_elems=elems, n_args=2, live_values=1, accumulators=0, dtype_bytes=4)
    return {"model": model, "members": list(members), "features": f.vector(),
            "feature_names": list(FEATURE_NAMES), "context": f.context(),
            "workload_hash": f"{model}/{members}", "run_secs": [seconds * s for s in
                                                                (0.99, 1.0, 1.01)],
            "error": None}


# Per model (family): how many of its two decisions (a+b, c+d) fusing wins.
_FUSE_WINS = {"conv_bn_relu@small": 2, "rmsnorm@small": 1, "mlp_gelu@small": 0,
              "synth-0": 1}


@pytest.fixture
def tuning_folder(tmp_path):
    """Two decisions per model: a+b and c+d, each part 2 us and the union 3 us (fusing wins)
    or 5 us (it loses); one side-by-side record and one in-model label beside them."""
    rng = np.random.default_rng(0)
    rows = []
    for model, wins in _FUSE_WINS.items():
        for i, (x, y) in enumerate(("ab", "cd")):
            union = 3e-6 if i < wins else 5e-6
            rows += [_db_row(model, x, 2e-6, rng), _db_row(model, y, 2e-6, rng),
                     _db_row(model, x + y, union, rng)]
    (tmp_path / "features.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    left, right, union = rows[:3]  # conv_bn_relu's a, b and a+b
    (tmp_path / "pairs.jsonl").write_text(json.dumps(
        {"model": left["model"], "kernels": "test", "processes": 1, "left": left,
         "right": right, "union": union}) + "\n")
    (tmp_path / "in_model.jsonl").write_text(json.dumps(
        {"model": left["model"], "accepted": True, "fused_s": 1e-5, "split_s": 2e-5,
         "left": left, "right": right, "union": union}) + "\n")
    return tmp_path


def _table(out: str, title: str) -> dict[str, list[str]]:
    """The rows of the table under the line starting with ``title``, by their first cell."""
    block = out.split(title, 1)[1].split("\n\n", 1)[0]
    rows = [ln for ln in block.splitlines()[2:] if ln and not ln.startswith(("-", "("))]
    return {ln[:20].strip(): ln[20:].split() for ln in rows}


def _percent(cell: str) -> float:
    value = float(cell.split("+-")[0])
    assert 0.0 <= value <= 100.0, cell
    return value


def test_evaluate_command_prints_each_family_held_out_against_the_baselines(
        tuning_folder, capsys) -> None:
    assert main(["evaluate", "--work-dir", str(tuning_folder), "--seeds", "2",
                 "--min-records", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("18 measured groups of 3 model variants (3 family units), 6 of 1 "
                          "synthetic programs")
    table = _table(out, "Leave one family out")
    assert set(table) == {"cnn", "decoder", "encoder", "all (pooled)"}
    for unit, wins in (("cnn", 2), ("decoder", 1), ("encoder", 0), ("all (pooled)", 3)):
        groups, pairs, always_fuse, best_trivial, analytical = table[unit][:5]
        n = 6 if unit == "all (pooled)" else 2
        assert (int(groups), int(pairs)) == (3 * n, n)
        # always fuse is right where fusing won; never fuse elsewhere; the better of the two
        assert _percent(always_fuse) == pytest.approx(100 * wins / n, abs=0.05)
        assert _percent(best_trivial) == pytest.approx(100 * max(wins, n - wins) / n, abs=0.05)
        _percent(analytical)
        _percent(table[unit][7])  # the learned model, mean over the seeds
    assert "(xgb: 2 training seeds" in out
    assert "Side-by-side labels (1 decisions" in out
    assert _percent(_table(out, "Side-by-side labels")["cnn"][2]) == 100.0  # always fuse
    in_model = _table(out, "In-model labels (1 final decisions")
    assert in_model["cnn"][:3] == ["1", "100.0", "100.0"] and in_model["cnn"][-1] == "1/1"
    synthetic = _table(out, "Unseen synthetic programs")
    assert _percent(synthetic["synth-0"][2]) == 50.0


def test_evaluate_without_measurements_is_one_line(tmp_path, capsys) -> None:
    assert main(["evaluate", "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = (f"costfuse evaluate: error: no measured groups in {tmp_path}: `costfuse tune` "
            "measures them")
    assert err == [said]
