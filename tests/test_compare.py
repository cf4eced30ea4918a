"""costfuse compare: three small transformer models x strategies x {llvm measured, cuda offline}.

One run (module fixture) feeds every assertion; a bogus strategy and a model that cannot load
must come back as failed cells carrying their error, not as a crashed run.
"""

from __future__ import annotations

import csv

import pytest

from tvm_costfuse.cli import main
from tvm_costfuse.report.compare import compare

MODELS = ("attention", "bert_layer", "gpt2_block")
STRATEGIES = ("none", "tvm", "costfuse", "bogus")


# one worker builds the module fixture once (pyproject: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("compare")

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    cells = compare([*MODELS, "no_such_model"], STRATEGIES, ("llvm", "cuda"), out, small=True,
                    repeat=2, measure_cuda=False, progress=False)
    return out, {(c.model, c.strategy, c.target): c for c in cells}


def test_writes_csv_markdown_and_plots(run):
    out, cells = run
    rows = list(csv.DictReader((out / "compare.csv").read_text().splitlines()))
    assert len(rows) == len(cells) == (len(MODELS) + 1) * len(STRATEGIES) * 2
    table = (out / "compare.md").read_text()
    assert table.startswith("| model | target | strategy | kernels |")
    assert all(f"| {m} | cuda | costfuse |" in table for m in MODELS)
    for png in ("speedup_llvm.png", "speedup_cuda.png", "registers_cuda.png"):
        assert (out / png).stat().st_size > 1000
    assert len((out / "kernels.csv").read_text().splitlines()) > 10


def test_llvm_cells_are_measured_and_numerically_ok(run):
    _, cells = run
    for m in MODELS:
        for s in ("none", "tvm", "costfuse"):
            c = cells[(m, s, "llvm")]
            assert c.ok, c.error
            assert c.numerics == "ok" and c.max_mismatch <= 1.0
            assert c.measured_s > 0 and 0 < c.roofline_fraction
            assert c.spill_bytes is not None  # LLVM spill count ran
            assert c.launched_kernels == c.kernels  # the reported plan is the built one


def test_cuda_cells_are_offline_with_registers(run):
    _, cells = run
    for m in MODELS:
        c = cells[(m, "costfuse", "cuda")]
        assert c.ok, c.error
        assert c.measured_s is None and c.numerics == ""
        assert c.max_registers > 0 and c.built_kernels >= c.kernels
        assert cells[(m, "none", "cuda")].kernels > cells[(m, "tvm", "cuda")].kernels


def test_failures_are_cells_with_their_error(run):
    _, cells = run
    for t in ("llvm", "cuda"):
        assert "unknown strategy 'bogus'" in cells[("bert_layer", "bogus", t)].error
        assert "unknown model 'no_such_model'" in cells[("no_such_model", "tvm", t)].error
    table = (run[0] / "compare.md").read_text()
    assert "FAILED: plan: ValueError: unknown strategy 'bogus'" in table


@pytest.mark.parametrize("model", MODELS)
def test_costfuse_writes_fewer_intermediates_than_tvm_on_cuda(run, model):
    # dlight's Matmul rule takes the attention transposes as prologues and epilogues; FuseOps
    # never fuses into a matmul's operands, so those tensors stay in memory under TVM.
    _, cells = run
    cf, tvm = cells[(model, "costfuse", "cuda")], cells[(model, "tvm", "cuda")]
    assert cf.ok and tvm.ok, (cf.error, tvm.error)
    assert cf.intermediate_bytes < tvm.intermediate_bytes
    assert cf.spilling_kernels == 0


def test_cli_compare_model_that_fails_to_load_is_a_failed_cell(tmp_path, capsys):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a protobuf")
    assert main(["compare", "--models", str(bad), "--strategies", "tvm",
                 "--targets", "llvm", "--out", str(tmp_path), "--no-progress"]) == 1
    assert "FAILED: load: DecodeError" in capsys.readouterr().out
    assert (tmp_path / "compare.csv").exists()
