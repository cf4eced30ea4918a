"""End-to-end regret: CostFuse's plan against the best plan measured around it.

A decision is worth what the model runs, not what its kernel does alone. Per model and thread
count, the space searched is every plan that takes, region by region, CostFuse's grouping or
FuseOps' (``regions.differing_regions``: the ops of overlapping kernels form one region), plus
no fusion: 2^R + 1 plans, too many to time at R ~ 20. So the search is local and measured:

1. CostFuse's plan, FuseOps' groups, no fusion, and CostFuse's plan with one region flipped to
   FuseOps' grouping (one build per region) are timed side by side (interleaved rounds), each
   flip right after a sample of CostFuse's plan (:func:`paired_ratio`);
2. the flips measured faster than CostFuse's plan are combined, fastest first, each kept
   where the kernels stay acyclic; the whole plans are timed side by side again with that
   combination and with the best single flip, each plan compiled ``builds`` times and every
   build timed in the same rounds (a plan's time: the median of its builds' medians);
3. CostFuse's plan and the fastest other plan of that round are compiled ``confirm`` times
   afresh and timed side by side once more, and that round gives the regret.

The best measured plan is the fastest correct one of the second round; a plan whose output is
off no fusion's is left out of it (``dropped``). Picking the fastest of several noisy medians
picks the one that was lucky as well as fast (the winner's curse): three compilations of one
decode step's plan run 1.05-1.10x apart in one process (where each library lands in memory;
docs/log/2026-12-06h.md), as much as the regret being measured. So the regret, CostFuse / best,
is read from the third round's fresh builds, which the pick did not see, against the fastest
other plan whichever side won the second round (1.00 where CostFuse's builds are the faster
there), with an interval bootstrapped over those builds (:func:`build_interval`). A
combination of flips that are each slower alone is not tried: this is the regret against the
plans measured, not against the space's optimum.

Each region is also a decision measured inside the model. CostFuse took its own grouping there,
so on those ops its model either priced its grouping cheaper or could not take FuseOps' (an
illegal group, or a cycle with the rest of the plan). Each flip is another compilation, so its
ratio to CostFuse's plan carries the build's draw as well as the region's effect: a region is
*clear* when the interquartile range of its paired ratios (flip / CostFuse,
:func:`paired_ratio`) stays outside ``1 +- band``, the band being the range of CostFuse's own
second-round builds (:func:`rebuild_band`: slowest / fastest - 1; 1% at least, and only that
with one build per plan), and when it stays so, on the same side, measured again on fresh
builds of the flip and of CostFuse's plan (``report.replicate``; ``replicate=False`` skips it).
On the clear regions the share where CostFuse's side was faster is printed next to the share
where the side with fewer kernels (always fuse) and with more (never fuse) was, over the
regions whose sides differ in kernel count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import tvm

from ..measurement.peers import thread_pool, time_builds, with_threads
from ..measurement.quiet import OtherLoad
from ..measurement.timing import (
    SCALED_TOLERANCE,
    interleave,
    run,
    scaled_error,
    vm_sampler,
)
from ..partition import ApplyPartition
from ..pre_fusion import costfuse_model
from ..strategies import strategy_pipeline, tir_pipeline
from ..targets import TargetDesc, host_target
from .paired import paired_ratio, rebuild_band
from .regret_plans import FUSEOPS, Plans, Region, Units, flip, kernel_groups, plans
from .replicate import replicate_clear

__all__ = ["FUSEOPS", "Plans", "Region", "build_interval", "combine_faster", "paired_ratio",
           "plans", "rebuild_band", "regret", "rows"]  # the plan space's from ``regret_plans``


def combine_faster(base_s: float, flipped_s: dict[int, float],
                   acyclic: Callable[[list[int]], bool]) -> tuple[list[int], int]:
    """The flips measured faster than ``base_s``, fastest first, each kept where ``acyclic``
    holds for the set kept so far with it; returns (kept, how many faster ones were left out)."""
    faster = sorted((i for i, s in flipped_s.items() if s < base_s), key=flipped_s.get)
    kept: list[int] = []
    for i in faster:
        if acyclic([*kept, i]):
            kept.append(i)
    return kept, len(faster) - len(kept)


def regret(mod: tvm.IRModule, inputs, threads: int, repeat: int,
           progress: Callable[[str], None] | None = None, desc: TargetDesc | None = None,
           builds: int = 1, confirm: int = 3, replicate: bool = True) -> dict:
    """One model's regret row at ``threads`` threads (see the module's docstring), on the
    model as CostFuse's pipeline hands it on after its sibling step (every plan alike)."""
    target = host_target(threads)
    mod, _sets, _layout = costfuse_model(mod, desc or target)
    p = plans(mod, target, desc)
    say = progress or (lambda _m: None)

    def build(units: Units | None, strategy: str = "costfuse"):
        fusion = None if units is None else ApplyPartition(kernel_groups(units))
        return tvm.compile(mod, target=target,
                           relax_pipeline=strategy_pipeline(strategy, target, fusion=fusion),
                           tir_pipeline=tir_pipeline(strategy))

    say(f"building 3 plans and {len(p.pairs)} flipped regions")
    # what each plan timed in the second round is built from: its units and strategy
    recipes = {"costfuse": (p.ours, "costfuse"), FUSEOPS: (p.theirs, "costfuse"),
               "none": (None, "none")}
    plans_built = {k: build(*r) for k, r in recipes.items()}
    ref = run(plans_built["none"], inputs)[0]
    regions = list(p.regions)
    flips, flip_errors, flip_units = {}, {}, {}
    for i, pair in enumerate(p.pairs):
        units = flip_units[i] = flip(p.graph, p.ours, [pair])
        if units is None:
            regions[i] = replace(regions[i], unbuilt="a cycle")
            continue
        try:  # a flip that fails costs its region, not the row
            ex = build(units)
        except Exception as err:  # noqa: BLE001 -- recorded in the region's row
            regions[i] = replace(regions[i], unbuilt=f"{type(err).__name__}: {err}"[:80])
            continue
        flip_errors[i] = scaled_error(run(ex, inputs)[0], ref)
        if not flip_errors[i] <= SCALED_TOLERANCE:
            regions[i] = replace(regions[i], unbuilt="WRONG")
            continue
        flips[i] = ex
    errors = {k: scaled_error(run(ex, inputs)[0], ref) for k, ex in plans_built.items()}
    if not errors["costfuse"] <= SCALED_TOLERANCE:
        raise ValueError(f"CostFuse's plan is {errors['costfuse']:.1e} of the output's scale "
                         "off no fusion")
    say("timing round 1")
    thread_pool(threads)
    samplers = {k: with_threads(vm_sampler(ex, inputs), threads)
                for k, ex in plans_built.items()}
    for i, ex in flips.items():  # each flip right after a sample of CostFuse's plan: paired
        samplers[f"base{i}"] = samplers["costfuse"]
        samplers[f"flip{i}"] = with_threads(vm_sampler(ex, inputs), threads)
    with OtherLoad() as load:
        first = interleave(samplers, repeat)
    base = float(np.median(first["costfuse"] + [x for i in flips for x in first[f"base{i}"]]))
    round1 = {i: paired_ratio(first[f"flip{i}"], first[f"base{i}"])[0] for i in flips}
    for i, ratio in round1.items():
        regions[i] = replace(regions[i], flipped_ms=ratio * base * 1e3)
    flipped_s = {i: regions[i].flipped_ms / 1e3 for i in flips}
    kept, left_out = combine_faster(
        base, flipped_s, lambda idx: flip(p.graph, p.ours, [p.pairs[j] for j in idx]) is not None)
    second = dict(plans_built)
    if kept:
        second["best flip"] = flips[kept[0]]
        recipes["best flip"] = (flip_units[kept[0]], "costfuse")
        errors["best flip"] = flip_errors[kept[0]]
    timed = list(flips)
    flips.clear()  # the flips not kept are not timed again: their builds are freed
    samplers.clear()
    if len(kept) > 1:
        units = flip(p.graph, p.ours, [p.pairs[j] for j in kept])
        combined = build(units)
        errors["faster flips"] = scaled_error(run(combined, inputs)[0], ref)
        second["faster flips"] = combined
        recipes["faster flips"] = (units, "costfuse")
    if builds > 1:
        say(f"building each of {len(second)} plans {builds - 1} more time(s)")
    every = {k: [first_build, *(build(*recipes[k]) for _ in range(builds - 1))]
             for k, first_build in second.items()}
    plans_built.clear()
    second.clear()
    ex = combined = None  # every build now lives in ``every`` alone
    for k, exs in every.items():  # every build computes what no fusion does
        errors[k] = max([errors[k], *(scaled_error(run(ex, inputs)[0], ref) for ex in exs[1:])])
    dropped = {k: f"{errors[k]:.1e} off" for k in every if not errors[k] <= SCALED_TOLERANCE}
    if "costfuse" in dropped:
        raise ValueError(f"a build of CostFuse's plan is {errors['costfuse']:.1e} of the "
                         "output's scale off no fusion")
    every = {k: v for k, v in every.items() if k not in dropped}  # a wrong plan is no best
    say(f"timing round 2 ({builds} build(s) per plan)")
    apart: list[int] = []  # samples of rounds taken with the CPUs apart, left out (2+ threads)
    build_ms, load2 = time_builds(every, inputs, threads, repeat, apart)
    every.clear()
    ms = {k: float(np.median(v)) for k, v in build_ms.items()}
    pick = min(ms, key=ms.get)
    band = max(0.01, rebuild_band(build_ms["costfuse"]))
    for i in timed:  # clear of what a rebuild alone moves
        regions[i] = replace(regions[i], clear=paired_ratio(
            first[f"flip{i}"], first[f"base{i}"], band)[1])
    load_r = float("nan")  # no replication round: nothing read
    if replicate:
        n = sum(r.clear for r in regions)
        say(f"replicating {n} clear region(s) on fresh builds")
        regions, load_r = replicate_clear(
            regions, round1, lambda i: build(flip_units[i]), lambda: build(p.ours), inputs, ref,
            threads, repeat, band)
    row = {"band": band, "threads": threads, "builds": builds, "ms": ms, "build_ms": build_ms,
           "dropped": dropped, "pick": pick, "regret": ms["costfuse"] / ms[pick], "best": pick,
           "regions": regions, "combined": len(kept), "left_out": left_out,
           "max_err": max(errors.values()), "costfuse_ms_round1": base * 1e3,
           "other_load": (load.cores, load2, load_r), "confirmed": None, "apart": apart}
    others = sorted((k for k in ms if k != "costfuse"), key=ms.get)
    if not confirm or not others:
        say(f"left out {sum(apart)} sample(s) taken with the CPUs apart")
        return row
    # CostFuse's plan against the fastest other: a round-2 win is confirmed as a loss is
    rival = others[0]
    say(f"confirming against {rival}: {confirm} fresh build(s) of each, timed apart")
    fresh = {k: [build(*recipes[k]) for _ in range(confirm)] for k in ("costfuse", rival)}
    wrong = {k: max(scaled_error(run(ex, inputs)[0], ref) for ex in exs)
             for k, exs in fresh.items()}
    row["max_err"] = max(row["max_err"], *wrong.values())
    if not wrong["costfuse"] <= SCALED_TOLERANCE:
        raise ValueError(f"a fresh build of CostFuse's plan is {wrong['costfuse']:.1e} of the "
                         "output's scale off no fusion")
    if not wrong[rival] <= SCALED_TOLERANCE:
        row["dropped"] = {**dropped, rival: f"{wrong[rival]:.1e} off (fresh build)"}
        say(f"left out {sum(apart)} sample(s) taken with the CPUs apart")
        return row  # that plan is no best: round 2's figure stands against the rest
    conf_ms, load3 = time_builds(fresh, inputs, threads, repeat, apart)
    say(f"left out {sum(apart)} sample(s) taken with the CPUs apart")
    ratio = float(np.median(conf_ms["costfuse"]) / np.median(conf_ms[rival]))
    row["confirmed"] = {"rival": rival, "build_ms": conf_ms, "ratio": ratio,
                        "other_load": load3,
                        "interval": build_interval(conf_ms["costfuse"], conf_ms[rival])}
    # the fresh round decides, either way: round 2's winner may have won by its luck
    row["regret"] = max(1.0, ratio)
    row["best"] = rival if ratio > 1.0 else "costfuse"
    return row


def build_interval(ours: Sequence[float], best: Sequence[float], level: float = 0.9,
                   draws: int = 4000) -> tuple[float, float]:
    """The ``level`` interval of median(ours) / median(best), bootstrapped over builds: a
    build's time is a draw (where its code and constants land in memory moves a decode step
    by 5-10%), so the ratio is known to within what other builds would have given. A median
    of three resamples takes only the three values, so with three builds the interval is
    about the ratio of their extremes and its coverage is rough; with one it has no width.
    Seeded: one set of timings gives one interval."""
    rng = np.random.default_rng(0)
    a, b = np.asarray(ours, float), np.asarray(best, float)
    ratios = (np.median(rng.choice(a, (draws, a.size)), axis=1)
              / np.median(rng.choice(b, (draws, b.size)), axis=1))
    lo, hi = np.percentile(ratios, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def _said(row: dict) -> str:
    """A row in one line: the regret, each plan's median and its builds' medians."""
    def plan(ms: float, builds: Sequence[float]) -> str:
        return f"{ms:.3f} ms ({' '.join(f'{b:.3f}' for b in builds)})"

    line = f"regret {row['regret']:.3f} against {row['best']}; " + ", ".join(
        f"{k} {plan(v, row['build_ms'][k])}" for k, v in row["ms"].items())
    if row["confirmed"]:
        c = row["confirmed"]
        lo, hi = c["interval"]
        line += (f"; fresh builds: CostFuse / {c['rival']} {c['ratio']:.3f} (90% {lo:.3f}-"
                 f"{hi:.3f}), " + ", ".join(f"{k} {plan(float(np.median(v)), v)}"
                                            for k, v in c["build_ms"].items()))
    return line


def rows(specs: Sequence[str], threads: Sequence[int], repeat: int,
         load: Callable[[str], tuple], say: Callable[[str], None], builds: int = 1,
         confirm: int = 3, replicate: bool = True) -> list[dict]:
    """:func:`regret` per model and thread count; a model that fails is a row saying so, and
    the rows measured before it are kept."""
    out = []
    for spec in specs:
        mod, inputs = load(spec)
        for t in threads:
            def progress(msg: str, spec=spec, t=t) -> None:
                say(f"{spec} @{t}: {msg}")

            try:
                out.append({"model": spec, **regret(mod, inputs, t, repeat, progress,
                                                     builds=builds, confirm=confirm,
                                                     replicate=replicate)})
                progress(_said(out[-1]))  # as each row ends: a run cut short keeps them
            except Exception as err:  # noqa: BLE001 -- reported in the table
                lines = str(err).splitlines() or [""]
                out.append({"model": spec, "threads": t,
                            "error": f"{type(err).__name__}: {lines[0]}"[:200]})
    return out
