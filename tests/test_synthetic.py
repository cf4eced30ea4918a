"""Random training programs (``synth-<seed>``): deterministic, loadable like zoo models, and
every fusion plan of them computes what the unfused program computes."""

from __future__ import annotations

import pytest
import tvm

import tvm_costfuse
from tvm_costfuse import models
from tvm_costfuse.measurement.timing import assert_close, run
from tvm_costfuse.strategies import strategy_pipeline

# Programs with small shapes (sequence: synth-30 (1, 16, 64), synth-34 (1, 16, 32); convolution:
# synth-11 (1, 8, 8, 8)), so they build in seconds.
SMALL_SEEDS = (11, 30, 34)


def test_same_seed_same_program_and_weights() -> None:
    a, inputs_a = models.load("synth-30")
    b, inputs_b = models.load("synth-30")
    tvm.ir.assert_structural_equal(a, b, map_free_vars=True)
    assert (inputs_a["x"] == inputs_b["x"]).all()
    c, _ = models.load("synth-34")
    with pytest.raises(ValueError):  # another seed, another program
        tvm.ir.assert_structural_equal(a, c, map_free_vars=True)


def test_seeds_cover_both_families_and_the_op_vocabulary() -> None:
    kinds = set()
    ranks = set()
    for seed in range(40):
        module, shapes = models.synthetic.program(f"synth-{seed}")
        kinds |= {step[0] for step in module.steps}
        ranks.add(len(shapes["x"]))
    assert ranks == {3, 4}
    assert {"linear", "heads", "rmsnorm", "layernorm", "softmax", "softmax_explicit",
            "transpose", "residual", "conv", "depthwise", "affine", "unary"} <= kinds


@pytest.mark.parametrize("name", ["synth-x", "synth-", "mlp", "synth-1.5"])
def test_bad_names_are_clear_errors(name: str) -> None:
    with pytest.raises(ValueError, match="unknown model|not a synthetic"):
        models.load(name)


def test_small_does_not_apply() -> None:
    with pytest.raises(ValueError, match="small=True does not apply"):
        models.load("synth-3", small=True)


@pytest.mark.parametrize("seed", SMALL_SEEDS)
def test_costfuse_plans_of_synthetic_programs_match_unfused(seed: int) -> None:
    mod, inputs = models.load(f"synth-{seed}")
    none = tvm.compile(mod, target="llvm", relax_pipeline=strategy_pipeline("none", "llvm"))
    fused = tvm.compile(mod, target="llvm", relax_pipeline=tvm_costfuse.pipeline("llvm"))
    assert_close(run(fused, inputs), run(none, inputs), rtol=1e-4, atol=1e-4)
