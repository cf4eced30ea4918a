"""The measured cost model: a group timed by the feedback loop is priced by its measurement, the
rest analytically, and the planner follows the measurements."""

from __future__ import annotations

import pytest
from conftest import prepared, reference

from tvm_costfuse.config import FusionConfig
from tvm_costfuse.cost.analytical import estimate
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.cost.measured import MeasuredModel, load_measured
from tvm_costfuse.graph import build_graph
from tvm_costfuse.measurement.timing import assert_close
from tvm_costfuse.planner import plan_greedy
from tvm_costfuse.targets import host
from tvm_costfuse.tuning.feedback import feature_row

TARGET = host(num_cores=2, calibration=False)


def _row(graph, members, seconds: list[float], error: str | None = None) -> dict:
    return {**feature_row("rmsnorm@small", graph, members), "run_secs": seconds,
            "error": error, "workload_hash": "w"}


def _calls(graph) -> list[str]:
    return graph.call_tir_names()


def test_measured_group_is_priced_by_its_median_others_analytically():
    graph = build_graph(prepared("rmsnorm")[0])
    a, b = _calls(graph)[:2]
    model = MeasuredModel.from_rows([
        _row(graph, (a,), [3e-6, 1e-6, 2e-6]),
        _row(graph, (a,), [5e-6]),  # a second run of the same group: median over runs
        _row(graph, (b,), [1e10], error="run: crashed"),  # failed: not a measurement
    ])
    fa, fb = group_features(graph, {a}), group_features(graph, {b})
    got = model(fa, TARGET)
    assert got.seconds == pytest.approx(3.5e-6)
    assert got.breakdown["analytical"] == pytest.approx(estimate(fa, TARGET).seconds)
    assert model(fb, TARGET).seconds == pytest.approx(estimate(fb, TARGET).seconds)
    assert (model.hits, model.queries) == (1, 2)
    assert "1 of 2 queries" in model.report()


def test_planner_follows_the_measurements():
    # rmsnorm's ops fuse into one kernel analytically. Measured: every single op fast, every
    # pair of ops far slower than its parts -> the planner must keep the ops apart.
    graph = build_graph(prepared("rmsnorm")[0])
    calls = _calls(graph)
    assert plan_greedy(graph, TARGET, FusionConfig()).kernels() == 1
    rows = [_row(graph, (n,), [1e-6]) for n in calls]
    rows += [_row(graph, tuple(sorted((x, y), key=lambda n: graph[n].index)), [1.0])
             for i, x in enumerate(calls) for y in calls[i + 1:]]
    plan = plan_greedy(graph, TARGET, FusionConfig(cost_model="measured"),
                       MeasuredModel.from_rows(rows))
    assert plan.kernels() == len(calls)


def test_no_measurements_answers_analytically_and_says_so(tmp_path, caplog):
    model = load_measured(TARGET, tmp_path)
    assert "answer analytically" in caplog.text
    graph = build_graph(prepared("rmsnorm")[0])
    f = group_features(graph, set(_calls(graph)))
    assert model(f, TARGET).seconds == pytest.approx(estimate(f, TARGET).seconds)


def test_measured_cost_model_through_passcontext_builds_right():
    import tvm

    from tvm_costfuse import models, pipeline
    from tvm_costfuse.measurement.timing import run
    from tvm_costfuse.targets import host_target

    mod, inputs = models.load("rmsnorm", small=True)
    target = host_target()
    with tvm.transform.PassContext(config={"costfuse.cost_model": "measured"}):
        ex = tvm.compile(mod, target=target, relax_pipeline=pipeline(target))
    assert_close(run(ex, inputs), reference("rmsnorm"))
