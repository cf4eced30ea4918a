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
   build timed in the same rounds (a plan's time: the median of its builds' medians).

The best measured plan is the fastest correct one of the second round, and regret = CostFuse /
best (1.00: nothing measured beats CostFuse's plan); a plan whose output is off no fusion's
is left out of it (``dropped``). Several builds matter on short models: three compilations of
one decode step's plan ran 1.05-1.10x apart in one process (where each library lands differs;
docs/log/2026-12-06h.md), as much as the regret being measured; each build's median is kept
(``build_ms``). A combination of flips that are each slower alone is not tried, and a minimum
over noisy medians leans low: this is the regret against the plans measured, up to timing
noise, not against the space's optimum.

Each region is also a decision measured inside the model. CostFuse took its own grouping there,
so on those ops its model either priced its grouping cheaper or could not take FuseOps' (an
illegal group, or a cycle with the rest of the plan). A region is *clear* when the interquartile
range of its paired ratios (flip / CostFuse, :func:`paired_ratio`) stays more than 1% from 1; on
the clear regions the share where CostFuse's side was faster is printed next to the share where
the side with fewer kernels (always fuse) and with more (never fuse) was, over the regions whose
sides differ in kernel count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import tvm

from ..config import FusionConfig
from ..cost.analytical import one_footing
from ..graph import OpGraph, build_graph
from ..measurement.peers import thread_pool, with_threads
from ..measurement.quiet import OtherLoad
from ..measurement.timing import (
    SCALED_TOLERANCE,
    geomean,
    interleave,
    run,
    scaled_error,
    vm_sampler,
)
from ..partition import ApplyPartition, fuseops_groups
from ..pipelines import prepare
from ..planner import initial_units
from ..pricer import Pricer
from ..quotient import Quotient
from ..regions import differing_regions
from ..strategies import strategy_pipeline, tir_pipeline
from ..targets import TargetDesc, for_target, host_target
from ..transform import plan_module
from .bench import DISTURBED_CORES

__all__ = ["FUSEOPS", "Plans", "Region", "accuracy", "combine_faster", "paired_ratio", "plans",
           "regret", "rows", "summary", "table"]

Units = list[frozenset]

#: the variant built from FuseOps' groups (through ``ApplyPartition``, beside CostFuse's
#: frozen groups: the space's other end, not ``relax.transform.FuseOps`` itself)
FUSEOPS = "FuseOps' groups"


@dataclass(frozen=True)
class Region:
    """One place where CostFuse's and FuseOps' plans differ, decided inside the model."""

    ops: int
    where: str  # the region's costliest op: its PrimFunc and output shape
    ours: tuple[str, ...]  # the rule of each of CostFuse's kernels there
    theirs: tuple[str, ...]  # and of FuseOps'
    predicted_us: tuple[float, float]  # (ours, theirs), on one footing
    flipped_ms: float | None = None  # the model with this region as FuseOps groups it
    clear: bool = False
    unbuilt: str = ""  # why the flipped plan was not timed (a cycle, a build error, wrong)


class Plans(NamedTuple):
    graph: OpGraph
    ours: Units
    theirs: Units
    pairs: list[tuple[Units, Units]]  # per region: (CostFuse's units, FuseOps' units)
    regions: list[Region]


def paired_ratio(flip: Sequence[float], base: Sequence[float]) -> tuple[float, bool]:
    """(median over rounds of flip / the base sample taken just before it, whether that ratio
    is clear of 1): clear when its interquartile range, and a margin of 1%, exclude 1. Paired
    samples cancel the drift of a shared host between rounds, and a base sample that was slow
    by chance moves one ratio, not every region's verdict (as one median base would)."""
    r = np.asarray(flip) / np.asarray(base)
    q1, q2, q3 = np.percentile(r, [25, 50, 75])
    return float(q2), bool(q1 > 1.01 or q3 < 0.99)


def _groups(units: Units) -> list[list[str]]:
    return [sorted(u) for u in units if len(u) > 1]


def _calls(graph: OpGraph, units: Units) -> set[frozenset]:
    """The kernels of ``units`` as sets of call_tir bindings (where a TupleGetItem rides
    does not make another kernel)."""
    kernels = {frozenset(n for n in u if graph[n].kind == "call_tir") for u in units}
    return {k for k in kernels if k}


def _rules(graph: OpGraph, price: Pricer, kind: str, units: Units) -> tuple[str, ...]:
    names = []
    for u in sorted(units, key=lambda u: min(graph[n].index for n in u)):
        price.estimate(u)
        names.append(price.features[u].card_on(kind).rule)
    return tuple(names)


def plans(mod: tvm.IRModule, target: tvm.target.Target, desc: TargetDesc | None = None) -> Plans:
    """CostFuse's and FuseOps' units of ``main`` for ``target`` (CostFuse priced for ``desc``,
    by default the target's description, as ``tvm.compile`` plans it) and their regions."""
    prepared = prepare(mod, target)
    graph = build_graph(prepared)
    desc = desc or for_target(target)
    config = FusionConfig()
    plan = plan_module(prepared, desc, config)
    # plan.groups holds the groups left to FuseOps too: each unit once
    frozen = list(dict.fromkeys(frozenset(g) for g in plan.left_to_fuseops))
    fusable = {n for u in initial_units(graph) for n in u}
    ours = initial_units(graph, list(dict.fromkeys([*frozen, *map(frozenset, plan.groups)])))
    theirs_groups = [frozenset(g) for g in fuseops_groups(prepared)
                     if len(g) > 1 and set(g) <= fusable and frozenset(g) not in frozen]
    theirs = initial_units(graph, [*frozen, *theirs_groups])
    price = Pricer(graph, desc, config, None)
    pairs, regions = [], []
    for mine, other in differing_regions(ours, theirs):
        if {n for u in mine for n in u} != {n for u in other for n in u}:
            continue  # an op one side leaves unfused: not a choice between the two groupings
        if _calls(graph, mine) == _calls(graph, other):
            continue  # the same kernels; only a TupleGetItem sits elsewhere
        seconds = one_footing([price.estimate(u) for u in (*mine, *other)])
        pairs.append((mine, other))
        calls = [graph[n] for u in mine for n in u if graph[n].kind == "call_tir"]
        top = max(calls, key=lambda n: (n.flops, -n.index))
        regions.append(Region(
            ops=len(calls), where=f"{top.prim_func} {'x'.join(map(str, top.outputs[0].shape))}",
            ours=_rules(graph, price, desc.kind, mine),
            theirs=_rules(graph, price, desc.kind, other),
            predicted_us=(sum(seconds[:len(mine)]) * 1e6, sum(seconds[len(mine):]) * 1e6)))
    return Plans(graph, ours, theirs, pairs, regions)


def _flip(graph: OpGraph, units: Units, pairs) -> Units | None:
    """``units`` with each pair's CostFuse side swapped for FuseOps'; None when the kernels
    would form a cycle."""
    parts = set(units)
    for mine, other in pairs:
        parts = (parts - set(mine)) | set(other)
    return list(parts) if Quotient(graph, list(parts)).is_acyclic() else None


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
           builds: int = 1) -> dict:
    """One model's regret row at ``threads`` threads (see the module's docstring)."""
    target = host_target(threads)
    p = plans(mod, target, desc)
    say = progress or (lambda _m: None)

    def build(units: Units | None, strategy: str = "costfuse"):
        fusion = None if units is None else ApplyPartition(_groups(units))
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
        units = flip_units[i] = _flip(p.graph, p.ours, [pair])
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
    for i in flips:
        ratio, clear = paired_ratio(first[f"flip{i}"], first[f"base{i}"])
        regions[i] = replace(regions[i], flipped_ms=ratio * base * 1e3, clear=clear)
    flipped_s = {i: regions[i].flipped_ms / 1e3 for i in flips}
    kept, left_out = combine_faster(
        base, flipped_s, lambda idx: _flip(p.graph, p.ours, [p.pairs[j] for j in idx]) is not None)
    second = dict(plans_built)
    if kept:
        second["best flip"] = flips[kept[0]]
        recipes["best flip"] = (flip_units[kept[0]], "costfuse")
        errors["best flip"] = flip_errors[kept[0]]
    flips.clear()  # the flips not kept are not timed again: their builds are freed
    samplers.clear()
    if len(kept) > 1:
        units = _flip(p.graph, p.ours, [p.pairs[j] for j in kept])
        combined = build(units)
        errors["faster flips"] = scaled_error(run(combined, inputs)[0], ref)
        second["faster flips"] = combined
        recipes["faster flips"] = (units, "costfuse")
    if builds > 1:
        say(f"building each of {len(second)} plans {builds - 1} more time(s)")
    every = {k: [ex, *(build(*recipes[k]) for _ in range(builds - 1))]
             for k, ex in second.items()}
    for k, exs in every.items():  # every build computes what no fusion does
        errors[k] = max([errors[k], *(scaled_error(run(ex, inputs)[0], ref) for ex in exs[1:])])
    dropped = {k: f"{errors[k]:.1e} off" for k in every if not errors[k] <= SCALED_TOLERANCE}
    if "costfuse" in dropped:
        raise ValueError(f"a build of CostFuse's plan is {errors['costfuse']:.1e} of the "
                         "output's scale off no fusion")
    every = {k: v for k, v in every.items() if k not in dropped}  # a wrong plan is no best
    say(f"timing round 2 ({builds} build(s) per plan)")
    thread_pool(threads)
    with OtherLoad() as load2:
        final = interleave({f"{k}#{b}": with_threads(vm_sampler(ex, inputs), threads)
                            for k, exs in every.items() for b, ex in enumerate(exs)}, repeat)
    build_ms = {k: [float(np.median(final[f"{k}#{b}"])) * 1e3 for b in range(len(exs))]
                for k, exs in every.items()}
    ms = {k: float(np.median(v)) for k, v in build_ms.items()}
    best = min(ms, key=ms.get)
    return {"threads": threads, "builds": builds, "ms": ms, "build_ms": build_ms,
            "dropped": dropped,
            "regret": ms["costfuse"] / ms[best], "best": best,
            "regions": regions, "combined": len(kept), "left_out": left_out,
            "max_err": max(errors.values()), "costfuse_ms_round1": base * 1e3,
            "other_load": (load.cores, load2.cores)}


def rows(specs: Sequence[str], threads: Sequence[int], repeat: int,
         load: Callable[[str], tuple], say: Callable[[str], None], builds: int = 1
         ) -> list[dict]:
    """:func:`regret` per model and thread count; a model that fails is a row saying so, and
    the rows measured before it are kept."""
    out = []
    for spec in specs:
        mod, inputs = load(spec)
        for t in threads:
            def progress(msg: str, spec=spec, t=t) -> None:
                say(f"{spec} @{t}: {msg}")

            try:
                out.append({"model": spec,
                            **regret(mod, inputs, t, repeat, progress, builds=builds)})
                ms = out[-1]["ms"]  # said as each row ends: a run cut short keeps them
                progress(f"regret {out[-1]['regret']:.3f} against {out[-1]['best']}; " + ", ".join(
                    f"{k} {v:.3f} ms ({' '.join(f'{b:.3f}' for b in out[-1]['build_ms'][k])})"
                    for k, v in ms.items()))
            except Exception as err:  # noqa: BLE001 -- reported in the table
                lines = str(err).splitlines() or [""]
                out.append({"model": spec, "threads": t,
                            "error": f"{type(err).__name__}: {lines[0]}"[:200]})
    return out


def accuracy(regions: Sequence[tuple[Region, float]]) -> dict[str, float]:
    """On the clear regions of (region, CostFuse's ms in its round) pairs: how many, the share
    where CostFuse's side was measured faster, and over those whose sides differ in kernel
    count ("sided"), the share where the side with fewer kernels (always fuse) and with more
    (never fuse) was."""
    clear = [(r, base) for r, base in regions if r.clear and r.flipped_ms is not None]
    if not clear:
        return {"clear": 0}
    ours_faster = np.array([r.flipped_ms > base for r, base in clear])
    # +1 where CostFuse's side has fewer kernels, -1 more, 0 as many (neither baseline's pick)
    side = np.sign(np.array([len(r.theirs) - len(r.ours) for r, _ in clear]))
    fewer_faster = np.where(ours_faster, side, -side)[side != 0] > 0
    out = {"clear": len(clear), "costfuse": float(np.mean(ours_faster)),
           "sided": int(fewer_faster.size)}
    if fewer_faster.size:
        out["always fuse"] = float(np.mean(fewer_faster))
        out["never fuse"] = 1.0 - out["always fuse"]
    return out


def summary(rows: Sequence[dict], threads: Sequence[int]) -> list[str]:
    """One line per thread count: regret geomean and worst, and the clear regions' accuracy."""
    lines = []
    for t in threads:
        at = [r for r in rows if "error" not in r and r["threads"] == t]
        if not at:
            continue
        worst = max(at, key=lambda r: r["regret"])
        acc = accuracy([(reg, r["costfuse_ms_round1"]) for r in at for reg in r["regions"]])
        shares = ", ".join(f"{k} {acc[k]:.2f}" for k in ("costfuse", "always fuse", "never fuse")
                           if k in acc)
        lines.append(f"- {t} thread(s): regret geomean {geomean([r['regret'] for r in at]):.3f},"
                     f" worst {worst['regret']:.3f} ({worst['model']}); {acc['clear']} clear "
                     "regions" + (f" ({acc['sided']} with sides of unequal kernel counts): "
                                  f"right {shares}" if shares else ""))
    return lines


def table(rows: Sequence[dict]) -> str:
    """Markdown: per model and thread count the whole plans' times and the regret; then per
    region its kernels, predicted and measured effect."""
    head = ("| model | threads | none ms | FuseOps' groups ms | CostFuse ms | best flip ms | "
            "faster flips ms (combined, left out) | regret | best | regions (clear) | max err "
            "| other load (rounds) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row.get('threads', '')} | | | | | | | | | | "
                         f"FAILED: {row['error']} |")
            continue

        def cell(k: str, ms=row["ms"]) -> str:
            return f"{ms[k]:.3f}" if k in ms else "-"

        n_clear = sum(r.clear for r in row["regions"])
        load = row["other_load"]
        busy = " (busy)" if max(load) > DISTURBED_CORES else ""  # NaN (unread) compares False
        lines.append(
            f"| {row['model']}{busy} | {row['threads']} | {cell('none')} | {cell(FUSEOPS)} | "
            f"{cell('costfuse')} | {cell('best flip')} | {cell('faster flips')} "
            f"({row['combined']}, {row['left_out']}) | {row['regret']:.3f} | {row['best']} | "
            f"{len(row['regions'])} ({n_clear}) | {row['max_err']:.1e} | "
            f"{load[0]:.2f} / {load[1]:.2f} |")
    lines += ["", ("| model | threads | where | ops | CostFuse's kernels | FuseOps' kernels | "
                   "predicted us (ours / theirs) | flipped / CostFuse (round 1) | clear |"),
              "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for r in row.get("regions", ()):
            ratio = (f"{r.flipped_ms / row['costfuse_ms_round1']:.3f}"
                     if r.flipped_ms is not None else f"not timed: {r.unbuilt}")
            lines.append(f"| {row['model']} | {row['threads']} | {r.where} | {r.ops} | "
                         f"{' + '.join(r.ours)} | {' + '.join(r.theirs)} | "
                         f"{r.predicted_us[0]:.1f} / {r.predicted_us[1]:.1f} | {ratio} | "
                         f"{'yes' if r.clear else 'no'} |")
    return "\n".join(lines)
