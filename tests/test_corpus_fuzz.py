"""Fuzzing on real graphs: random convex partitions and random planner caps on corpus models.

The zoo's property test (``test_partition_property``) draws partitions of hand-written graphs;
the importers' graphs have other shapes (index math, duplicate names, permute/reshape diamonds,
slices after contractions), so the same draws run here on one model per family, checked against
PyTorch. Caps (``max_chain_length``, ``max_body_ops``, ``register_budget``) are drawn too: every
plan CostFuse makes under them must build and match. A few draws per model (fixed seed in CI):
each build of a small corpus model costs 2-20 s on 2 cores.
"""

from __future__ import annotations

import functools

import pytest
import torch
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from test_partition_property import convex_partitions
from tvm_costfuse.schedules import schedule_pass

from tvm_costfuse import apply_partition
from tvm_costfuse.graph import build_graph
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.models import corpus
from tvm_costfuse.pipelines import build_pipeline, prepare
from tvm_costfuse.strategies import strategy_pipeline
from tvm_costfuse.targets import host_target

SCALED_TOL = 1e-4  # as in test_corpus: relative to the output's scale
# Every family once across the two tests, on models with cheap builds (a random partition makes
# many distinct kernels: 10-20 s per draw on a mid-size model, so few draws per model).
PARTITIONED = ("squeezenet1_1", "vit", "gpt2", "wav2vec2")
CAPPED = ("squeezenet1_1", "distilbert", "bart_decoder", "wav2vec2")
PARTITIONS, CAPS = 2, 2
TARGET = host_target()


@functools.cache
def _model(name: str):
    """(prepared module, inputs, PyTorch output) of a small corpus model."""
    mod, inputs, module = corpus.load(name, small=True)
    with torch.no_grad():
        want = module(*corpus.torch_inputs(inputs)).numpy()
    return prepare(mod, TARGET), inputs, want


def _scaled_error(got, want) -> float:
    assert len(got) == 1 and got[0].shape == want.shape, [g.shape for g in got]
    return float(abs(got[0] - want).max() / max(float(abs(want).max()), 1e-30))


@pytest.mark.parametrize("name", PARTITIONED)
def test_random_convex_partitions_match_pytorch(name: str) -> None:
    mod, inputs, want = _model(name)
    graph = build_graph(mod)

    @settings(max_examples=PARTITIONS)
    @given(st.data())
    def check(data) -> None:
        groups = data.draw(convex_partitions(graph), label="groups")
        fused = apply_partition(mod, groups)
        ex = tvm.compile(fused, target=TARGET,
                         relax_pipeline=build_pipeline(TARGET, None, schedule_pass(TARGET)))
        assert _scaled_error(run(ex, inputs), want) <= SCALED_TOL

    check()


@pytest.mark.parametrize("name", CAPPED)
def test_plans_under_random_caps_match_pytorch(name: str) -> None:
    mod, inputs, want = _model(name)

    @settings(max_examples=CAPS)
    @given(chain=st.integers(1, 40), body=st.integers(1, 80), registers=st.integers(16, 255),
           search=st.sampled_from(["greedy", "exact"]))
    def check(chain: int, body: int, registers: int, search: str) -> None:
        pipeline = strategy_pipeline("costfuse", TARGET, max_chain_length=chain,
                                     max_body_ops=body, register_budget=registers,
                                     search=search)
        ex = tvm.compile(mod, target=TARGET, relax_pipeline=pipeline)
        assert _scaled_error(run(ex, inputs), want) <= SCALED_TOL

    check()
