"""Regret against the best measured plan (``report.regret``, ``costfuse regret``): the plans it
times are correct programs, its regions are where the two plans differ, and its decision
counts are what the timings say."""

from __future__ import annotations

import pytest

from tvm_costfuse.cli import main
from tvm_costfuse.report.regret import Region, accuracy, regret, summary
from tvm_costfuse.testing import channel_chain_program


def _region(ours: int, theirs: int, flipped_ms: float, clear: bool = True) -> Region:
    return Region(ops=4, ours=("a",) * ours, theirs=("b",) * theirs, predicted_us=(1.0, 2.0),
                  flipped_ms=flipped_ms, clear=clear)


def test_accuracy_counts_the_clear_regions_against_always_and_never_fuse() -> None:
    base = 10.0
    regions = [
        (_region(1, 2, 12.0), base),  # ours (fewer kernels) faster: right, and always-fuse right
        (_region(1, 2, 9.0), base),  # FuseOps' split faster: wrong, never-fuse right
        (_region(2, 1, 11.0), base),  # ours has more kernels and is faster: never-fuse right
        (_region(1, 2, 5.0, clear=False), base),  # within the spread: not counted
        (Region(4, ("a",), ("b", "c"), (1.0, 2.0), None, True), base),  # not built: not counted
    ]
    acc = accuracy(regions)
    assert acc["clear"] == 3
    assert acc["costfuse"] == pytest.approx(2 / 3)
    assert acc["always fuse"] == pytest.approx(1 / 3)
    assert acc["never fuse"] == pytest.approx(2 / 3)
    assert accuracy([(_region(1, 2, 5.0, clear=False), base)]) == {"clear": 0}


def test_a_chain_region_is_flipped_and_every_timed_plan_computes_the_same() -> None:
    mod, inputs = channel_chain_program(1, 8, 24, 12, 12, prepared=False)
    row = regret(mod, inputs, threads=1, repeat=3)
    (region,) = row["regions"]
    assert region.ours == ("ChannelChain",) and len(region.theirs) == 2
    assert region.ops == 6 and region.flipped_ms is not None and row["unbuilt"] == 0
    assert {"costfuse", "tvm", "none"} <= set(row["ms"])
    assert row["max_err"] < 1e-5  # every plan built, the flipped one included
    assert row["regret"] >= 1.0 and row["best"] in row["ms"]
    assert row["regret"] == row["ms"]["costfuse"] / min(row["ms"].values())
    (line,) = summary([{"model": "chain", **row}], [1])
    assert line.startswith("- 1 thread(s): regret geomean")


def test_the_regret_command_prints_its_tables(capsys) -> None:
    assert main(["regret", "mlp_gelu", "--small", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "| mlp_gelu | 1 |" in out and "regret geomean" in out
