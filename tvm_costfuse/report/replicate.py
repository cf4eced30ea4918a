"""A region's decision counts as clear only where its effect shows again on fresh builds.

``report.regret`` times each region's flip (the model with that region grouped as FuseOps
groups it) as one compilation against one compilation of CostFuse's plan. Two compilations of
one plan run up to 5-20% apart on a decode step (where each library and its constants land in
memory), so a region worth 0.2 us of a 4 ms step can read 5% either way from its builds alone,
and the rebuild band (the range of three builds of CostFuse's plan) is an under-estimate of
that spread from three draws. A real effect does not depend on which builds it was measured
on: so every region clear in round 1 is measured again, its flip compiled afresh against a
fresh compilation of CostFuse's plan, each flip sample right after a base sample
(``paired.paired_ratio``), and it stays clear only where the fresh ratio is outside the band
again, on the same side. An effect of the region itself passes this whichever side it
favours; a draw passes it twice only by chance. One fresh base build serves every region of
a row: its own draw moves all their fresh ratios alike, which the band (the range of three
builds of that plan) is there to absorb.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from ..measurement.peers import thread_pool, with_threads
from ..measurement.quiet import OtherLoad
from ..measurement.timing import SCALED_TOLERANCE, interleave, run, scaled_error, vm_sampler
from .paired import paired_ratio

__all__ = ["replicate_clear"]


def replicate_clear(regions: list, round1: dict[int, float],
                    build_flip: Callable[[int], object], build_base: Callable[[], object],
                    inputs, ref, threads: int, repeat: int, band: float) -> tuple[list, float]:
    """``regions`` (``report.regret.Region``) with each clear one measured again on fresh
    builds (``build_flip(i)`` against ``build_base()``, each checked against ``ref``):
    ``replicated`` set to the fresh flip / CostFuse ratio, and ``clear`` kept only where that
    ratio is outside ``1 +- band`` on the side of ``round1[i]`` (round 1's flip / CostFuse
    ratio). Returns the regions and the cores other processes used meanwhile (NaN when
    nothing was timed)."""
    regions = list(regions)
    clear = [i for i, r in enumerate(regions) if r.clear and i in round1]
    if not clear:
        return regions, math.nan
    base = build_base()
    if not scaled_error(run(base, inputs)[0], ref) <= SCALED_TOLERANCE:
        raise ValueError("a fresh build of CostFuse's plan computes something else than no "
                         "fusion")
    thread_pool(threads)
    base_sampler = with_threads(vm_sampler(base, inputs), threads)
    samplers = {}
    for i in clear:
        ex = build_flip(i)
        if not scaled_error(run(ex, inputs)[0], ref) <= SCALED_TOLERANCE:
            regions[i] = replace(regions[i], clear=False, unbuilt="WRONG (fresh build)")
            continue
        samplers[f"base{i}"] = base_sampler
        samplers[f"flip{i}"] = with_threads(vm_sampler(ex, inputs), threads)
    if not samplers:
        return regions, math.nan
    with OtherLoad() as load:
        got = interleave(samplers, repeat)
    for i in clear:
        if f"flip{i}" not in got:
            continue
        ratio, outside = paired_ratio(got[f"flip{i}"], got[f"base{i}"], band)
        same_side = (ratio > 1.0) == (round1[i] > 1.0)
        regions[i] = replace(regions[i], replicated=ratio, clear=outside and same_side)
    return regions, load.cores
