"""End-to-end regret: CostFuse's plan against the best plan measured around it.

A decision is worth what the model runs, not what its kernel does alone. Per model and thread
count, the space searched is every plan that takes, region by region, CostFuse's grouping or
FuseOps' (``regions.differing_regions``: the ops of overlapping kernels form one region), plus
no fusion: 2^R + 1 plans, too many to time at R ~ 20. So the search is local and measured:

1. CostFuse's plan, FuseOps' plan, no fusion, and CostFuse's plan with one region flipped to
   FuseOps' grouping (one build per region) are timed side by side (interleaved rounds);
2. the plan that takes every flip measured faster than CostFuse's is built, and the whole
   plans are timed side by side again with it and with the best single flip.

The best measured plan is the fastest of the second round, and regret = CostFuse / best (1.00:
nothing measured beats CostFuse's plan). A combination of flips that are each slower alone is
not tried, so this is the regret against the plans measured, not against the space's optimum.

Each region is also a decision measured inside the model: CostFuse took its own grouping there
(where FuseOps' was predicted cheaper, the planner took FuseOps', and the plans agree). A
region is *clear* when the time its flip changes exceeds the spread of the runs; on the clear
ones, the share where CostFuse's side is faster is printed next to the share where the side with
fewer kernels is (always fuse) and the side with more (never fuse).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tvm

from ..config import FusionConfig
from ..cost.analytical import one_footing
from ..graph import build_graph
from ..measurement.peers import thread_pool, with_threads
from ..measurement.quiet import OtherLoad
from ..measurement.timing import geomean, interleave, run, scaled_error, vm_sampler
from ..partition import ApplyPartition, fuseops_groups
from ..pipelines import prepare
from ..planner import Pricer, initial_units
from ..quotient import Quotient
from ..regions import differing_regions
from ..strategies import strategy_pipeline
from ..targets import for_target, host_target
from ..transform import plan_module

__all__ = ["Region", "accuracy", "plans", "regret", "summary", "table"]

Units = list[frozenset]


@dataclass
class Region:
    """One place where CostFuse's and FuseOps' plans differ, decided inside the model."""

    ops: int
    ours: tuple[str, ...]  # the rule of each of CostFuse's kernels there
    theirs: tuple[str, ...]  # and of FuseOps'
    predicted_us: tuple[float, float]  # (ours, theirs), on one footing
    flipped_ms: float | None = None  # the model with this region as FuseOps groups it
    clear: bool = False


def _spread(samples: Sequence[float]) -> float:
    """The interquartile range of one variant's samples over their median: one slow sample
    of a shared host does not make every decision unclear, as the full range would."""
    q1, q2, q3 = np.percentile(samples, [25, 50, 75])
    return float((q3 - q1) / q2)


def _groups(units: Units) -> list[list[str]]:
    return [sorted(u) for u in units if len(u) > 1]


def _describe(graph, price: Pricer, kind: str, units: Units) -> tuple[str, ...]:
    names = []
    for u in sorted(units, key=lambda u: min(graph[n].index for n in u)):
        price.estimate(u)
        names.append(price.features[u].card_on(kind).rule)
    return tuple(names)


def plans(mod: tvm.IRModule, target: tvm.target.Target):
    """(our units, FuseOps' units, the differing regions as (ours, theirs), region records)
    of ``main`` for ``target``, as CostFuse plans it in ``tvm.compile``."""
    prepared = prepare(mod, target)
    graph = build_graph(prepared)
    desc = for_target(target)
    config = FusionConfig()
    plan = plan_module(prepared, desc, config)
    frozen = [frozenset(g) for g in plan.left_to_fuseops]
    fusable = {n for u in initial_units(graph) for n in u}
    ours = initial_units(graph, [*frozen, *(frozenset(g) for g in plan.groups)])
    theirs = initial_units(graph, [*frozen, *(frozenset(g) for g in fuseops_groups(prepared)
                                             if len(g) > 1 and set(g) <= fusable)])
    price = Pricer(graph, desc, config, None)
    pairs, records = [], []
    for mine, other in differing_regions(ours, theirs):
        if {n for u in mine for n in u} != {n for u in other for n in u}:
            continue
        seconds = one_footing([price.estimate(u) for u in (*mine, *other)])
        pairs.append((mine, other))
        records.append(Region(
            ops=sum(graph[n].kind == "call_tir" for u in mine for n in u),
            ours=_describe(graph, price, desc.kind, mine),
            theirs=_describe(graph, price, desc.kind, other),
            predicted_us=(sum(seconds[:len(mine)]) * 1e6, sum(seconds[len(mine):]) * 1e6)))
    return graph, ours, theirs, pairs, records


def _flip(graph, units: Units, regions) -> Units | None:
    """``units`` with each region's CostFuse side swapped for FuseOps'; None when the result
    has a cycle between kernels."""
    parts = set(units)
    for mine, other in regions:
        parts = (parts - set(mine)) | set(other)
    return list(parts) if Quotient(graph, list(parts)).is_acyclic() else None


def regret(mod: tvm.IRModule, inputs, threads: int, repeat: int,
           progress: Callable[[str], None] | None = None) -> dict:
    """One model's regret row at ``threads`` threads (see the module's docstring)."""
    target = host_target(threads)
    graph, ours, theirs, pairs, regions = plans(mod, target)
    say = progress or (lambda _m: None)

    def build(units: Units | None, strategy: str = "costfuse"):
        fusion = None if units is None else ApplyPartition(_groups(units))
        return tvm.compile(mod, target=target,
                           relax_pipeline=strategy_pipeline(strategy, target, fusion=fusion))

    say(f"building 3 plans and {len(pairs)} flipped regions")
    builds = {"costfuse": build(ours), "tvm": build(theirs), "none": build(None, "none")}
    ref = run(builds["none"], inputs)[0]
    flips: dict[int, object] = {}
    for i, pair in enumerate(pairs):
        units = _flip(graph, ours, [pair])
        if units is not None:
            flips[i] = build(units)
    errors = {k: scaled_error(run(ex, inputs)[0], ref) for k, ex in
              [*builds.items(), *((f"flip{i}", ex) for i, ex in flips.items())]}
    say("timing round 1")
    thread_pool(threads)
    with OtherLoad() as load:
        first = interleave({k: with_threads(vm_sampler(ex, inputs), threads) for k, ex in
                            [*builds.items(), *((f"flip{i}", ex) for i, ex in flips.items())]},
                           repeat)
    base = float(np.median(first["costfuse"]))
    for i, r in enumerate(regions):
        if i not in flips:
            continue
        s = first[f"flip{i}"]
        r.flipped_ms = float(np.median(s)) * 1e3
        gap = abs(r.flipped_ms / 1e3 - base) / base
        r.clear = gap > max(_spread(s), _spread(first["costfuse"]))
    faster = [pairs[i] for i in flips if regions[i].flipped_ms / 1e3 < base]
    second = dict(builds)
    if faster:
        best_single = min(flips, key=lambda i: regions[i].flipped_ms)
        second["best flip"] = flips[best_single]
        units = _flip(graph, ours, faster)
        if units is not None and len(faster) > 1:
            second["all faster flips"] = build(units)
            errors["all faster flips"] = scaled_error(
                run(second["all faster flips"], inputs)[0], ref)
    say("timing round 2")
    with OtherLoad() as load2:
        final = interleave({k: with_threads(vm_sampler(ex, inputs), threads)
                            for k, ex in second.items()}, repeat)
    ms = {k: float(np.median(v)) * 1e3 for k, v in final.items()}
    return {"threads": threads, "ms": ms, "regret": ms["costfuse"] / min(ms.values()),
            "best": min(ms, key=ms.get), "regions": regions, "unbuilt": len(pairs) - len(flips),
            "max_err": max(errors.values()), "costfuse_ms_round1": base * 1e3,
            "other_load": (load.cores, load2.cores)}


def accuracy(regions: Sequence[tuple[Region, float]]) -> dict[str, float]:
    """On the clear regions of (region, CostFuse's ms in its round) pairs: how many, and the
    share where CostFuse's side, the side with fewer kernels (always fuse) and the side with
    more (never fuse) was measured faster."""
    clear = [(r, base) for r, base in regions if r.clear and r.flipped_ms is not None]
    if not clear:
        return {"clear": 0}
    ours_faster = np.array([r.flipped_ms > base for r, base in clear])
    # +1 where CostFuse's side has fewer kernels, -1 more, 0 as many (neither baseline's pick)
    side = np.sign(np.array([len(r.theirs) - len(r.ours) for r, _ in clear]))
    faster = np.where(ours_faster, side, -side)  # +1: the side with fewer kernels was faster
    return {"clear": len(clear), "costfuse": float(np.mean(ours_faster)),
            "always fuse": float(np.mean(faster > 0)), "never fuse": float(np.mean(faster < 0))}


def summary(rows: Sequence[dict], threads: Sequence[int]) -> list[str]:
    """One line per thread count: regret geomean and worst, and the clear regions' accuracy."""
    lines = []
    for t in threads:
        at = [r for r in rows if "error" not in r and r["threads"] == t]
        if not at:
            continue
        worst = max(at, key=lambda r: r["regret"])
        acc = accuracy([(reg, r["costfuse_ms_round1"]) for r in at for reg in r["regions"]])
        shares = ", ".join(f"{k} {v:.2f}" for k, v in acc.items() if k != "clear")
        lines.append(f"- {t} thread(s): regret geomean {geomean([r['regret'] for r in at]):.3f},"
                     f" worst {worst['regret']:.3f} ({worst['model']}); "
                     f"{acc['clear']} clear regions" + (f": right {shares}" if shares else ""))
    return lines


def table(rows: Sequence[dict]) -> str:
    """Markdown: per model and thread count the whole plans' times and the regret; then per
    region its kernels, predicted and measured effect."""
    head = ("| model | threads | none ms | FuseOps ms | CostFuse ms | best flip ms | "
            "all faster flips ms | regret | best | regions (clear) | max err | other load (rounds) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | | | | | | | | | | FAILED: {row['error']} | |")
            continue
        ms = row["ms"]

        def cell(k: str, ms=ms) -> str:
            return f"{ms[k]:.3f}" if k in ms else "-"

        n_clear = sum(r.clear for r in row["regions"])
        lines.append(f"| {row['model']} | {row['threads']} | {cell('none')} | {cell('tvm')} | "
                     f"{cell('costfuse')} | {cell('best flip')} | {cell('all faster flips')} | "
                     f"{row['regret']:.3f} | {row['best']} | {len(row['regions'])} ({n_clear}) | "
                     f"{row['max_err']:.1e} | {row['other_load'][0]:.2f} / {row['other_load'][1]:.2f} |")
    lines += ["", ("| model | threads | ops | CostFuse's kernels | FuseOps' kernels | "
                   "predicted us (ours / theirs) | flipped / CostFuse (round 1) | clear |"),
              "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for r in row.get("regions", ()):
            ratio = (f"{r.flipped_ms / row['costfuse_ms_round1']:.3f}"
                     if r.flipped_ms is not None else "cycle: not built")
            lines.append(f"| {row['model']} | {row['threads']} | {r.ops} | {' + '.join(r.ours)} "
                         f"| {' + '.join(r.theirs)} | {r.predicted_us[0]:.1f} / "
                         f"{r.predicted_us[1]:.1f} | {ratio} | {'yes' if r.clear else 'no'} |")
    return "\n".join(lines)
