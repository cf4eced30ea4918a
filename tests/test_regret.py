"""Regret against the best measured plan (``report.regret``, ``costfuse regret``): the plans it
times are the ones the pipelines build and compute the model, its regions are where the two
plans differ, and its decision counts are what the timings say. Timings are not asserted."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from test_costfuse_pass import SymbolicBefore

from tvm_costfuse.cli import main
from tvm_costfuse.measurement.timing import kernel_calls
from tvm_costfuse.partition import ApplyPartition
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.report import regret as regret_mod
from tvm_costfuse.report.regret import (
    FUSEOPS,
    Region,
    build_interval,
    combine_faster,
    paired_ratio,
    plans,
    rebuild_band,
    regret,
)
from tvm_costfuse.report.regret_table import accuracy, summary, table
from tvm_costfuse.strategies import strategy_pipeline
from tvm_costfuse.targets import host, host_target
from tvm_costfuse.testing import channel_chain_program


def _region(ours: int, theirs: int, flipped_ms: float, clear: bool = True) -> Region:
    return Region(ops=4, where="conv2d 1x8x4x4", ours=("a",) * ours, theirs=("b",) * theirs,
                  predicted_us=(1.0, 2.0), flipped_ms=flipped_ms, clear=clear)


def test_accuracy_counts_the_clear_regions_against_always_and_never_fuse() -> None:
    base = 10.0
    regions = [
        (_region(1, 2, 12.0), base),  # ours (fewer kernels) faster: right, and always-fuse right
        (_region(1, 2, 9.0), base),  # FuseOps' split faster: wrong, never-fuse right
        (_region(2, 1, 11.0), base),  # ours has more kernels and is faster: never-fuse right
        (_region(1, 2, 5.0, clear=False), base),  # within the spread: not counted
        (Region(4, "", ("a",), ("b", "c"), (1.0, 2.0), None, True), base),  # not built: not counted
    ]
    acc = accuracy(regions)
    assert acc["clear"] == 3 and acc["sided"] == 3
    assert acc["costfuse"] == pytest.approx(2 / 3)
    assert acc["always fuse"] == pytest.approx(1 / 3)
    assert acc["never fuse"] == pytest.approx(2 / 3)
    tie = accuracy([(_region(1, 1, 12.0), base), (_region(1, 2, 12.0), base)])
    assert tie["clear"] == 2 and tie["sided"] == 1 and tie["always fuse"] == 1.0
    assert accuracy([(_region(1, 2, 5.0, clear=False), base)]) == {"clear": 0}


def test_a_paired_ratio_is_clear_only_when_its_middle_half_is_off_one() -> None:
    base = [1.0, 1.2, 1.0, 1.1, 1.0]  # one base sample slow by chance moves one ratio only
    ratio, clear = paired_ratio([0.9, 1.08, 0.9, 0.99, 0.9], base)
    assert ratio == pytest.approx(0.9) and clear
    ratio, clear = paired_ratio([1.0, 1.19, 1.02, 1.1, 0.99], base)
    assert abs(ratio - 1) < 0.01 and not clear


def test_the_faster_flips_combine_fastest_first_around_a_cycle() -> None:
    flipped = {0: 9.0, 1: 11.0, 2: 8.0, 3: 9.5}  # base 10: flips 2, 0, 3 are faster
    assert combine_faster(10.0, flipped, lambda idx: True) == ([2, 0, 3], 0)
    no_0_with_2 = (lambda idx: not {0, 2} <= set(idx))
    assert combine_faster(10.0, flipped, no_0_with_2) == ([2, 3], 1)
    assert combine_faster(7.0, flipped, lambda idx: True) == ([], 0)


def test_the_plans_rebuilt_are_the_ones_the_pipelines_build() -> None:
    mod, inputs = channel_chain_program(1, 24, 144, 56, 56, stride=2, prepared=False)
    target = host_target(1)
    p = plans(mod, target)
    for units, strategy in ((p.ours, "costfuse"), (p.theirs, "tvm")):
        ours = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(
            "costfuse", target, fusion=ApplyPartition([sorted(u) for u in units if len(u) > 1])))
        theirs = tvm.compile(mod, target=target,
                             relax_pipeline=strategy_pipeline(strategy, target))
        assert kernel_calls(ours, inputs) == kernel_calls(theirs, inputs)


def test_a_symbolic_region_left_to_fuseops_is_one_kernel_on_both_sides() -> None:
    p = plans(SymbolicBefore, host_target(1))
    for units in (p.ours, p.theirs):
        names = [n for u in units for n in u]
        assert len(names) == len(set(names))  # each binding in one unit
    assert not p.regions
    ApplyPartition([sorted(u) for u in p.ours if len(u) > 1])(prepare(SymbolicBefore))


def test_a_chain_region_is_flipped_and_every_timed_plan_computes_the_same() -> None:
    # priced for a host with default figures, so the planner chains the pair on any machine
    mod, inputs = channel_chain_program(1, 24, 144, 56, 56, stride=2, prepared=False)
    said = []
    row = regret(mod, inputs, threads=1, repeat=5, desc=host(1, calibration=False), builds=2,
                 confirm=0, progress=said.append)
    (region,) = row["regions"]
    # the second round's plans each compiled once more, all checked, none dropped
    assert row["builds"] == 2 and not row["dropped"]
    assert all(len(v) == 2 and row["ms"][k] == float(np.median(v))
               for k, v in row["build_ms"].items())
    assert any(m.startswith("building each of") and "1 more time" in m for m in said)
    assert region.ours == ("ChannelChain",) and len(region.theirs) == 2
    assert region.ops == 6 and region.where.startswith("conv2d")
    assert region.flipped_ms is not None and not region.unbuilt
    assert {"costfuse", FUSEOPS, "none"} <= set(row["ms"])
    assert row["max_err"] < 1e-5  # every plan built, the flipped one included
    assert row["best"] == row["pick"] in row["ms"] and row["combined"] + row["left_out"] <= 1
    assert row["confirmed"] is None  # confirm=0: round 2 gives the regret
    (line,) = summary([{"model": "chain", **row}], [1])
    assert line.startswith("- 1 thread(s): regret geomean") and "rebuild band" in line
    assert row["band"] == max(0.01, rebuild_band(row["build_ms"]["costfuse"]))
    busy = table([{"model": "chain", **row, "other_load": (0.5, 0.0)}])
    quiet = table([{"model": "chain", **row, "other_load": (0.0, float("nan"))}])
    unread_first = table([{"model": "chain", **row, "other_load": (float("nan"), 0.5)}])
    assert "| chain (busy) | 1 |" in busy and "| chain | 1 |" in quiet
    assert "| chain (busy) | 1 |" in unread_first  # an unread round hides no busy one


def test_the_regret_command_prints_its_tables(capsys) -> None:
    assert main(["regret", "mlp_gelu", "--small", "--repeat", "5"]) == 0
    out = capsys.readouterr().out
    # (busy) where the other tests run beside it
    assert re.search(r"\| mlp_gelu( \(busy\))? \| 1 \|", out) and "regret geomean" in out


def test_the_build_interval_brackets_the_ratio_of_medians() -> None:
    ours, best = [4.2, 4.0, 4.4], [4.0, 4.1, 3.9]
    lo, hi = build_interval(ours, best)
    point = np.median(ours) / np.median(best)
    assert lo <= point <= hi and lo < hi
    assert (lo, hi) == build_interval(ours, best)  # seeded: one set of timings, one interval
    assert build_interval([4.0] * 3, [4.0] * 3) == (1.0, 1.0)
    # builds that spread more give a wider interval around the same medians
    wide = build_interval([3.6, 4.2, 4.8], [3.5, 4.0, 4.5])
    assert wide[1] - wide[0] > hi - lo


def _fake_rounds(round2: dict[str, float], fresh: dict[str, float]):
    """A stand-in for ``time_builds``: each plan's builds at its factor (1% apart), from
    ``round2`` in the second round and ``fresh`` in the third; plans not named run 1.5."""
    calls = []

    def fake(every, _inputs, _threads, _repeat, _apart=None):
        calls.append({k: len(v) for k, v in every.items()})
        factor = round2 if len(calls) == 1 else fresh
        return ({k: [factor.get(k, 1.5) * (1 + 0.01 * b) for b in range(len(v))]
                 for k, v in every.items()}, 0.0)

    return fake, calls


def test_a_pick_that_was_lucky_is_timed_again_on_fresh_builds(monkeypatch) -> None:
    # round 2 says FuseOps' groups are 10% faster; fresh builds say even
    mod, inputs = channel_chain_program(1, 24, 144, 56, 56, stride=2, prepared=False)
    fake, calls = _fake_rounds({"costfuse": 1.0, FUSEOPS: 0.9}, {"costfuse": 1.0, FUSEOPS: 1.0})
    monkeypatch.setattr(regret_mod, "time_builds", fake)
    said = []
    row = regret(mod, inputs, threads=1, repeat=5, desc=host(1, calibration=False), builds=2,
                 confirm=3, progress=said.append)
    assert row["pick"] == FUSEOPS and len(calls) == 2
    assert calls[1] == {"costfuse": 3, FUSEOPS: 3}  # both plans compiled afresh, 3 times
    conf = row["confirmed"]
    assert conf["rival"] == FUSEOPS and conf["ratio"] == pytest.approx(1.0)
    assert row["regret"] == 1.0 and row["best"] == "costfuse"
    assert conf["interval"][0] <= 1.0 <= conf["interval"][1]
    assert any(m.startswith(f"confirming against {FUSEOPS}") for m in said)
    text = table([{"model": "chain", **row}])
    assert f"| {FUSEOPS} | 1.111 | {FUSEOPS}: 1.000 (" in text and "| 1.000 | costfuse |" in text
    # without a confirmation the pick's own round gives the regret
    fake, calls = _fake_rounds({"costfuse": 1.0, FUSEOPS: 0.9}, {})
    monkeypatch.setattr(regret_mod, "time_builds", fake)
    row = regret(mod, inputs, threads=1, repeat=5, desc=host(1, calibration=False), confirm=0)
    assert len(calls) == 1 and row["confirmed"] is None
    assert row["regret"] == pytest.approx(1 / 0.9) and row["best"] == FUSEOPS


def test_a_win_of_costfuses_plan_is_timed_again_too(monkeypatch) -> None:
    # round 2 says CostFuse's plan is the fastest, FuseOps' groups next; fresh builds say
    # FuseOps' groups are 3% faster: that is the regret, not clipped to round 2's 1.00
    mod, inputs = channel_chain_program(1, 24, 144, 56, 56, stride=2, prepared=False)
    fake, calls = _fake_rounds({"costfuse": 1.0, FUSEOPS: 1.05},
                               {"costfuse": 1.0, FUSEOPS: 0.97})
    monkeypatch.setattr(regret_mod, "time_builds", fake)
    row = regret(mod, inputs, threads=1, repeat=5, desc=host(1, calibration=False), confirm=2)
    assert row["pick"] == "costfuse" and calls[1] == {"costfuse": 2, FUSEOPS: 2}
    assert row["confirmed"]["rival"] == FUSEOPS
    assert row["regret"] == pytest.approx(1 / 0.97) and row["best"] == FUSEOPS
    (line,) = summary([{"model": "chain", **row}], [1])
    assert "regret geomean 1.031" in line


def test_a_region_is_clear_only_outside_what_a_rebuild_moves() -> None:
    assert rebuild_band([4.0]) == 0.0
    assert rebuild_band([4.0, 4.2, 3.9]) == pytest.approx(4.2 / 3.9 - 1)  # two builds' gap
    flip, base = [1.04, 1.05, 1.04, 1.06, 1.05], [1.0] * 5  # 4-6% slower, steadily
    assert paired_ratio(flip, base) == (pytest.approx(1.05), True)
    assert paired_ratio(flip, base, margin=0.05) == (pytest.approx(1.05), False)
    assert paired_ratio([0.9] * 5, base, margin=0.05)[1]


def test_a_clear_region_stays_clear_only_where_fresh_builds_say_so_again(monkeypatch) -> None:
    """Round 1 measures each flip on one build; ``replicate_clear`` measures the clear ones
    again on fresh builds and keeps those outside the band on round 1's side, whichever side
    that is."""
    from tvm_costfuse.report import replicate as rep

    regions = [_region(1, 2, 4.4),  # flip 10% slower: CostFuse right, stays so
               _region(1, 2, 4.4),  # 10% slower in round 1, even on fresh builds: a draw
               _region(1, 2, 3.6),  # 10% faster in round 1, slower on fresh builds
               _region(1, 2, 4.4, clear=False),  # not clear: not rebuilt
               _region(1, 2, 4.4),  # a fresh build computes something else
               _region(1, 2, 3.6)]  # 10% faster, again on fresh builds: CostFuse wrong, clear
    round1 = {0: 1.1, 1: 1.1, 2: 0.9, 3: 1.1, 4: 1.1, 5: 0.9}
    fresh = {0: 1.10, 1: 1.00, 2: 1.10, 4: 1.10, 5: 0.90}
    built = []

    def build_flip(i):
        built.append(i)
        return i

    monkeypatch.setattr(rep, "vm_sampler", lambda ex, _inputs: ex)
    monkeypatch.setattr(rep, "run", lambda ex, _inputs: [ex])
    monkeypatch.setattr(rep, "scaled_error", lambda out, _ref: 1.0 if out == 4 else 0.0)

    def interleave(samplers, repeat):
        return {k: [fresh[int(k[4:])] if k.startswith("flip") else 1.0] * repeat
                for k in samplers}

    monkeypatch.setattr(rep, "interleave", interleave)
    out, load = rep.replicate_clear(regions, round1, build_flip, lambda: "base", {}, None,
                                    threads=1, repeat=5, band=0.03)
    assert built == [0, 1, 2, 4, 5] and load >= 0.0
    assert [r.clear for r in out] == [True, False, False, False, False, True]
    assert [r.replicated for r in out] == [pytest.approx(1.1), pytest.approx(1.0),
                                           pytest.approx(1.1), None, None, pytest.approx(0.9)]
    assert out[4].unbuilt == "WRONG (fresh build)"
    from tvm_costfuse.report.regret_table import _fresh

    assert [_fresh(r) for r in out] == ["1.100", "1.000", "1.100", "-", "WRONG (fresh build)",
                                        "0.900"]
    # nothing clear: nothing built, nothing timed
    built.clear()
    none, load = rep.replicate_clear([regions[3]], {0: 1.1}, build_flip, lambda: "base", {},
                                     None, 1, 5, 0.03)
    assert built == [] and none == [regions[3]] and np.isnan(load)
    # a fresh build of CostFuse's plan that computes something else is an error, not a base
    with pytest.raises(ValueError, match="fresh build of CostFuse's plan"):
        rep.replicate_clear(regions[:1], {0: 1.1}, build_flip, lambda: 4, {}, None, 1, 5, 0.03)


def test_regret_hands_replication_round_1_as_ratios(monkeypatch) -> None:
    """The side a region took in round 1 reaches ``replicate_clear`` as a unitless ratio (it
    once compared a region's milliseconds with the plan's seconds: every side read 'slower')."""
    from tvm_costfuse.report import regret as regret_module

    seen = {}

    def spy(regions, round1, *args, **kwargs):
        seen.update(round1)
        return regions, 0.0

    monkeypatch.setattr(regret_module, "replicate_clear", spy)
    mod, inputs = channel_chain_program(1, 24, 144, 56, 56, stride=2, prepared=False)
    row = regret(mod, inputs, threads=1, repeat=5, desc=host(1, calibration=False), confirm=0)
    (region,) = row["regions"]
    assert set(seen) == {0}
    assert seen[0] == pytest.approx(region.flipped_ms / row["costfuse_ms_round1"])
    assert 0.2 < seen[0] < 5.0  # a ratio of two times of one model, not ms over seconds
