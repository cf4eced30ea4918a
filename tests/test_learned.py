"""The learned cost model: trains on measured-style rows, answers like analytical.estimate, and
falls back to the analytical estimate -- visibly -- where it has too little data."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
from conftest import prepared

from tvm_costfuse.config import FusionConfig
from tvm_costfuse.cost import learned
from tvm_costfuse.cost.analytical import Estimate, estimate
from tvm_costfuse.cost.features import FEATURE_NAMES, GroupFeatures
from tvm_costfuse.graph import build_graph
from tvm_costfuse.planner import plan_greedy
from tvm_costfuse.targets import host

TARGET = host(num_cores=2, calibration=False)


def _features(rng) -> GroupFeatures:
    elems = int(rng.integers(256, 1 << 20))
    n_ops = int(rng.integers(1, 6))
    contractions = int(rng.integers(0, 2))
    flops = float(elems * rng.integers(1, 64))
    return GroupFeatures(
        n_ops=n_ops, n_contractions=contractions, n_reductions=0, flops=flops,
        contraction_flops=flops if contractions else 0.0, recompute_flops=0.0,
        bytes_in=4 * elems * int(rng.integers(1, 3)), bytes_out=4 * elems,
        bytes_internal=4 * elems * (n_ops - 1), chain_length=n_ops, out_elems=elems,
        n_args=3, live_values=2, accumulators=0, dtype_bytes=4)


def _rows(n: int, seed: int = 0) -> list[dict]:
    """Synthetic measurements: the analytical time, off by a smooth factor and a little noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        f = _features(rng)
        secs = estimate(f, TARGET).seconds * 3.0 * (1 + 0.5 * f.n_ops) * rng.uniform(0.9, 1.1)
        rows.append({"model": f"m{i % 3}", "members": [str(i)], "features": f.vector(),
                     "feature_names": list(FEATURE_NAMES), "run_secs": [secs], "error": None})
    return rows


def _row_features(row: dict) -> GroupFeatures:
    return GroupFeatures(**dict(zip(FEATURE_NAMES, row["features"], strict=True)))


def test_trained_model_predicts_near_its_data_and_round_trips(tmp_path):
    rows = _rows(120)
    model = learned.train_rows(rows, TARGET)
    assert model.usable and model.n_records == 120
    measured = [_row_features(r) for r in rows[:5]]
    # Within the coverage radius of a measured group, not on it: 2% more flops.
    near = [GroupFeatures(**{**f.__dict__, "flops": f.flops * 1.02}) for f in measured]
    queries = measured + near
    ests = [model(f, TARGET, None) for f in queries]
    assert all(isinstance(e, Estimate) and e.seconds > 0 for e in ests)
    assert all(e.confidence == learned.LEARNED_CONFIDENCE for e in ests)
    assert not model.fallbacks
    # Close to what was measured: within 1.25x of the synthetic time (the analytical estimate
    # is 3-6x off by construction).
    for f, e in zip(queries, ests, strict=True):
        want = estimate(f, TARGET).seconds * 3.0 * (1 + 0.5 * f.n_ops)
        assert abs(math.log(e.seconds / want)) < math.log(1.25)
    model.save(tmp_path)
    again = learned.load_learned(TARGET, tmp_path)
    assert [again(f, TARGET).seconds for f in queries] == [e.seconds for e in ests]
    assert again.near == learned.NEAR and len(again.points) == len(model.points) == 120


def _assert_fell_back(e: Estimate, f: GroupFeatures) -> None:
    """The analytical estimate, marked as a fallback."""
    assert e.seconds == estimate(f, TARGET).seconds
    assert e.confidence == learned.FALLBACK_CONFIDENCE and e.breakdown["fallback"] == 1.0


def test_no_measured_group_near_falls_back_and_says_so(caplog):
    rows = _rows(120)
    model = learned.train_rows(rows, TARGET)
    f = _row_features(rows[0])
    # Inside the training range, but 30% more bytes than any measured group with these sizes.
    far = GroupFeatures(**{**f.__dict__, "bytes_in": int(f.bytes_in * 1.3)})
    assert model._nearest(learned._inputs(far, TARGET)[0]) > learned.NEAR
    with caplog.at_level(logging.WARNING):
        _assert_fell_back(model(far, TARGET), far)
    assert model.fallbacks["no measured group near it"] == 1
    assert "no measured group near it (nearest 0.2" in caplog.text


def test_model_saved_without_coverage_points_is_not_used(tmp_path, caplog):
    rows = _rows(60)
    model = learned.train_rows(rows, TARGET)
    model.save(tmp_path)
    (tmp_path / learned.POINTS_FILE).unlink()
    with caplog.at_level(logging.WARNING):
        again = learned.load_learned(TARGET, tmp_path)
    assert not again.usable and "predates the coverage radius; retrain it" in caplog.text
    # With its measurements beside it, the stale model is replaced by one trained in memory.
    (tmp_path / "features.jsonl").write_text("".join(
        json.dumps({**r, "workload_hash": str(i)}) + "\n" for i, r in enumerate(rows)))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        fresh = learned.load_learned(TARGET, tmp_path)
    assert fresh.usable and fresh.n_records == 60 and "training one in memory" in caplog.text
    assert not (tmp_path / learned.POINTS_FILE).exists()  # nothing written
    f = _row_features(rows[0])
    assert fresh(f, TARGET).seconds == model(f, TARGET).seconds


def test_too_little_data_falls_back_to_analytical_and_says_so(caplog):
    model = learned.train_rows(_rows(10), TARGET)
    f = _features(np.random.default_rng(1))
    with caplog.at_level(logging.WARNING):
        _assert_fell_back(model(f, TARGET), f)
    assert model.fallbacks["too little data"] == 1
    assert "too little data (10 records < 30)" in caplog.text
    assert "1 of 1 queries fell back" in model.fallback_report()


def test_features_far_outside_training_range_fall_back():
    model = learned.train_rows(_rows(60), TARGET)
    f = _features(np.random.default_rng(2))
    huge = GroupFeatures(**{**f.__dict__, "out_elems": 10**12, "bytes_out": 4 * 10**12})
    e = model(huge, TARGET)
    assert e.confidence == learned.FALLBACK_CONFIDENCE
    assert model.fallbacks["features outside the training range"] == 1


def test_no_data_at_all_plans_analytically(tmp_path):
    model = learned.load_learned(TARGET, tmp_path / "empty")
    graph = build_graph(prepared("mlp_gelu")[0])
    plan = plan_greedy(graph, TARGET, FusionConfig(), model)
    want = plan_greedy(graph, TARGET, FusionConfig())
    assert plan.groups == want.groups
    assert model.fallbacks["too little data"] == model.queries > 0


def test_failed_records_are_not_training_data():
    rows = _rows(40)
    rows[0]["run_secs"], rows[0]["error"] = [1e10], "build: boom"
    x, y = learned.rows_to_dataset(rows, TARGET)
    assert len(y) == 39 and x.shape[1] == len(learned.input_names())


def test_a_host_without_a_model_is_served_another_hosts_or_analytical(tmp_path, monkeypatch,
                                                                       caplog):
    """A fresh host: another llvm host's trained model serves it, saying so; with none, the
    planner plans analytically. Neither is an error."""
    here = tmp_path / "tuning_logs" / "llvm-thishost" / "groups"
    monkeypatch.setattr(learned, "_target_work_dir", lambda _target: here)
    monkeypatch.setattr(learned, "SHIPPED_LOGS", tmp_path / "shipped")  # none shipped
    with caplog.at_level("WARNING"):
        alone = learned.load_learned(TARGET)
    assert not alone.usable and "answer analytically" in caplog.text
    other = tmp_path / "tuning_logs" / "llvm-otherhost" / "groups"
    trained = learned.train_rows(_rows(120), TARGET)
    trained.save(other)
    learned.train_rows(_rows(40, seed=1), TARGET).save(tmp_path / "tuning_logs" / "llvm-small" /
                                                       "groups")
    (tmp_path / "tuning_logs" / "cuda-sm_90" / "groups").mkdir(parents=True)
    caplog.clear()
    with caplog.at_level("WARNING"):
        served = learned.load_learned(TARGET)
    assert "serving the one trained on llvm-otherhost" in caplog.text  # the most records
    assert served.usable and served.n_records == 120
    f = _row_features(_rows(120)[0])
    assert served(f, TARGET).seconds == trained(f, TARGET).seconds
    graph = build_graph(prepared("mlp_gelu")[0])
    assert plan_greedy(graph, TARGET, FusionConfig(), served).groups


def test_an_installed_package_serves_its_shipped_model_for_this_host(tmp_path, monkeypatch,
                                                                     caplog):
    """Installed, tuning writes go to the user's folder (empty at first); the model shipped
    for this host serves from the package's folder, ahead of other hosts' models."""
    user = tmp_path / "user" / "llvm-thishost" / "groups"
    shipped = tmp_path / "site" / "tuning_logs"
    learned.train_rows(_rows(60), TARGET).save(shipped / "llvm-thishost" / "groups")
    learned.train_rows(_rows(120, seed=1), TARGET).save(shipped / "llvm-otherhost" / "groups")
    monkeypatch.setattr(learned, "_target_work_dir", lambda _target: user)
    monkeypatch.setattr(learned, "SHIPPED_LOGS", shipped)
    with caplog.at_level("WARNING"):
        served = learned.load_learned(TARGET)
    assert served.usable and served.n_records == 60 and "serving the one" not in caplog.text
    (shipped / "llvm-thishost").rename(shipped / "llvm-gone")  # another host's only
    monkeypatch.setattr(learned, "SHIPPED_LOGS", shipped)
    with caplog.at_level("WARNING"):
        other = learned.load_learned(TARGET)
    assert other.n_records == 120 and "serving the one trained on llvm-otherhost" in caplog.text
