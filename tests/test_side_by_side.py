"""Side-by-side labels: each candidate decision's three kernels timed together into
``pairs.jsonl``, and scored by ``cost.evaluation`` like the reconstructed pairs."""

from __future__ import annotations

import pytest
from conftest import prepared

from tvm_costfuse.cost import evaluation
from tvm_costfuse.cost.learned import measured_seconds
from tvm_costfuse.graph import build_graph
from tvm_costfuse.targets import for_target, host_target
from tvm_costfuse.tuning import side_by_side
from tvm_costfuse.tuning.feedback import MeasureConfig
from tvm_costfuse.tuning.versions import kernel_version

FAST = MeasureConfig(repeat=3, min_repeat_ms=2, timeout_s=120)


def _label(tmp_path, **kw):
    mod, _ = prepared("mlp_gelu")
    return side_by_side.label_pairs("mlp_gelu", mod, host_target(), tmp_path, FAST,
                                    prepared=True, **kw)


def test_decisions_are_timed_together_and_scored(tmp_path):
    mod, _ = prepared("mlp_gelu")
    graph = build_graph(mod)
    decisions = side_by_side.candidate_pairs(graph, for_target(host_target()))
    assert decisions and len(set(decisions)) == len(decisions)
    s = _label(tmp_path, max_pairs=2)
    assert s.timed >= 1 and s.failed == 0, s.errors
    records = side_by_side.read_pairs(tmp_path)
    assert len(records) == s.timed
    for rec in records:
        assert rec["kernels"] == kernel_version() and rec["repeat"] == FAST.repeat
        parts = [rec[k] for k in ("left", "right", "union")]
        assert sorted(parts[0]["members"] + parts[1]["members"]) == sorted(parts[2]["members"])
        # One sample per round for each of the three kernels, all of them real times.
        assert all(len(p["run_secs"]) == FAST.repeat and 0 < min(p["run_secs"]) < 1
                   for p in parts)
        assert (tuple(parts[0]["members"]), tuple(parts[1]["members"])) in decisions
    pairs = evaluation.side_by_side_pairs(records)
    d = evaluation.decide(pairs, lambda r: (measured_seconds(r), True))
    assert d.pairs == len(records) and d.accuracy == 1.0 and d.stake_accuracy == 1.0
    # Run again: the decisions recorded under these kernels are not timed twice; the next
    # ones are.
    again = _label(tmp_path, max_pairs=2)
    assert again.repeated >= s.timed
    unions = [r["union"]["workload_hash"] for r in side_by_side.read_pairs(tmp_path)]
    assert len(unions) == s.timed + again.timed == len(set(unions))


def test_a_failed_decision_is_counted_and_not_recorded(tmp_path, monkeypatch):
    def broken(*_args, **_kw):
        raise RuntimeError("build: forced failure")

    monkeypatch.setattr(side_by_side, "build_and_time_together", broken)
    mod, _ = prepared("mlp_gelu")
    s = side_by_side.label_pairs("mlp_gelu", mod, host_target(), tmp_path,
                                 MeasureConfig(repeat=2, min_repeat_ms=1, isolate=False),
                                 prepared=True, max_pairs=1)
    assert (s.timed, s.failed) == (0, 1)
    assert "forced failure" in s.errors[0]
    assert side_by_side.read_pairs(tmp_path) == []


def test_only_cpu_targets_are_timed_here(tmp_path):
    mod, _ = prepared("mlp_gelu")
    with pytest.raises(ValueError, match="CPU kernels"):
        side_by_side.label_pairs("mlp_gelu", mod, "h100", tmp_path, FAST, prepared=True)


def test_several_processes_pool_their_samples_and_supersede_one(tmp_path):
    one = _label(tmp_path, max_pairs=1)
    assert one.timed == 1, one.errors
    three = _label(tmp_path, max_pairs=1, processes=3)
    # The decision timed in one process is timed again in three: fewer processes do not count.
    assert three.timed == 1 and three.repeated == 0, three.errors
    records = side_by_side.read_pairs(tmp_path)
    assert [r.get("processes", 1) for r in records] == [1, 3]
    rec = records[1]
    for k in ("left", "right", "union"):
        runs = rec[k]["run_secs_by_process"]
        assert len(runs) == 3 and all(len(r) == FAST.repeat for r in runs)
        assert rec[k]["run_secs"] == [s for r in runs for s in r]
    # The record from three processes supersedes the earlier one of the same decision.
    assert side_by_side.latest_pairs(records) == [rec]
    assert side_by_side.latest_pairs(records, kernels="other") == []
    # And it is not timed a third time.
    assert _label(tmp_path, max_pairs=1, processes=3).repeated >= 1


def test_processes_need_isolated_workers(tmp_path):
    mod, _ = prepared("mlp_gelu")
    with pytest.raises(ValueError, match="isolated"):
        side_by_side.label_pairs("mlp_gelu", mod, host_target(), tmp_path,
                                 MeasureConfig(repeat=2, isolate=False), prepared=True,
                                 processes=2)
    with pytest.raises(ValueError, match="at least 1"):
        side_by_side.label_pairs("mlp_gelu", mod, host_target(), tmp_path, FAST,
                                 prepared=True, processes=0)


def test_side_by_side_rows_replace_the_separately_timed_ones():
    def row(model, members, secs):
        return {"model": model, "members": members, "run_secs": secs}

    rows = [row("m", ["a"], [3.0]), row("m", ["b"], [4.0]), row("n", ["a"], [5.0])]
    rec = {"model": "m", "processes": 3, "date": "2026-12-02T08:00:00",
           "left": row("m", ["a"], [1.0]), "right": row("m", ["c"], [2.0]),
           "union": row("m", ["a", "c"], [2.5])}
    older = {**rec, "processes": 1, "left": row("m", ["a"], [9.0])}
    out = side_by_side.with_side_by_side(rows, [rec, older])
    by = {(r["model"], tuple(r["members"])): r["run_secs"] for r in out}
    # m's "a" from the record of three processes; n's "a" (another model) and m's "b" kept.
    assert by == {("m", ("a",)): [1.0], ("m", ("b",)): [4.0], ("n", ("a",)): [5.0],
                  ("m", ("c",)): [2.0], ("m", ("a", "c")): [2.5]}


def test_a_kernel_timed_in_several_processes_costs_the_mean_of_their_medians():
    # Two processes ran it at one speed, one at 2.8x (a placement): the label is what a build
    # pays on average, not the speed that came up more often; failed runs are left out.
    row = {"run_secs": [1.0, 1.1, 1.0, 1.1, 2.8, 2.9],
           "run_secs_by_process": [[1.0, 1.1, 1.0], [1.1, 1e10], [2.8, 2.9, 2.8]]}
    assert measured_seconds(row) == pytest.approx((1.0 + 1.1 + 2.8) / 3)
    assert measured_seconds({"run_secs": [3.0, 1.0, 2.0]}) == 2.0
