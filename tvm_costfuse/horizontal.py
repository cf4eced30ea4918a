"""Whether sibling matmuls become one: CostFuse's horizontal decision, per set, by its cost model.

:mod:`.siblings` finds the sets and rewrites them; this module prices each set apart and
combined and runs the rewrite as a pass in CostFuse's pipelines, before LegalizeOps (the
rewrite needs the high-level matmuls). ``costfuse.horizontal``:

- ``"cost"``: each side is the plan the planner makes of the siblings alone, legalized and
  priced as the pipeline would (launches, the weight stream, parallel grain over the wider
  output, the weights at the tier the whole module's constants put them); the combined side
  keeps each slice as a copy kernel of its own (in a model the plan may fuse it into a
  consumer, which gains more than priced). Combined where it is priced ``MIN_GAIN`` faster;
- ``"never"``, ``"always"``: the trivial baselines the decisions are measured against.

Tools that plan CostFuse and build the plan themselves take the model through
:func:`~tvm_costfuse.pre_fusion.costfuse_model` first, so that what they plan is what the
pipeline builds.
"""

from __future__ import annotations

from dataclasses import replace

import tvm

from .graph import build_graph
from .schedules import backend as schedule_backend
from .siblings import Siblings, combine_siblings, constant_bytes, find_siblings, sibling_program
from .transform import CostFuse, plan_module

__all__ = ["MIN_GAIN", "CombineSiblings", "decide_siblings", "legalized", "price_siblings"]

# Combine only where the model prices it this much faster: the two sides read the same
# weights, and a smaller predicted difference is inside what two builds of one kernel differ
# by (a decode step's Q/K/V projections at one thread are priced 0.01% apart).
MIN_GAIN = 0.005


def price_siblings(s: Siblings, desc, config, compile_target,
                   module_constants: int = 0) -> tuple[float, float]:
    """Seconds the cost model predicts for the set apart and combined, each side the plan
    the planner makes of it on ``compile_target`` (priced with ``desc``), its weights priced
    as in a module holding ``module_constants`` bytes of constants."""
    first = s.branches[0]
    seconds = []
    for combined in (False, True):
        mod = sibling_program(first.shape, first.dtype, s.widths, first.bias is not None,
                              combined)
        with compile_target:
            prepared = legalized(mod, compile_target)
            graph = build_graph(prepared)
            graph = replace(graph, constant_bytes=max(graph.constant_bytes, module_constants))
            plan = plan_module(prepared, desc, config, compile_target=compile_target,
                               graph=graph)
        seconds.append(plan.seconds)
    return seconds[0], seconds[1]


def legalized(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """What every pipeline runs before its fusion slot, folding aside: ``pipelines.prepare``'s
    steps, taken here from the target's backend record as it takes them (the pipelines
    import this module, so it cannot import them)."""
    backend = schedule_backend(target).relax
    passes = list(backend.library_dispatch_passes(target))
    for p in backend.legalize_passes(target):
        if p.info.name in ("FuseOps", "FuseTIR"):
            break
        passes.append(p)
    return tvm.transform.Sequential(passes)(mod)


class _Decision:
    """``costfuse.horizontal`` applied to one set; the cost model's prices kept per shape (a
    model's layers repeat them)."""

    def __init__(self, mode: str, priced: tuple | None):
        self.mode, self.priced = mode, priced
        self.prices: dict[tuple, tuple[float, float]] = {}

    def __call__(self, s: Siblings) -> None:
        if self.mode != "cost":
            s.combine, s.why = self.mode == "always", f"costfuse.horizontal is {self.mode!r}"
            return
        first = s.branches[0]
        key = (first.shape, first.dtype, tuple(s.widths), first.bias is not None)
        if key not in self.prices:
            self.prices[key] = price_siblings(s, *self.priced)
        apart, combined = s.prices = self.prices[key]
        s.combine = combined < apart * (1 - MIN_GAIN)
        s.why = f"predicted {apart * 1e6:.2f} us apart, {combined * 1e6:.2f} us as one"


def decide_siblings(mod: tvm.IRModule, costfuse: CostFuse) -> tuple[tvm.IRModule, list[Siblings]]:
    config = costfuse.config()
    priced = None
    if config.horizontal == "cost":
        compile_target = costfuse.compile_target("sibling")
        priced = (costfuse.describe_target(config), config, compile_target,
                  constant_bytes(mod))
    decide = _Decision(config.horizontal, priced)
    if config.horizontal == "never":  # listed with the decision, nothing rewritten
        found = [s for gv, f in mod.functions.items() if isinstance(f, tvm.relax.Function)
                 for s in find_siblings(f)]
        for s in found:
            decide(s)
        return mod, found
    return combine_siblings(mod, decide)


def CombineSiblings(costfuse: CostFuse) -> tvm.transform.Pass:  # a pass, named as TVM's
    """The rewrite as a module pass for ``costfuse``, its config's ``horizontal`` deciding;
    the sets found, each with its decision and why, are kept in ``costfuse.siblings``
    (``costfuse explain`` prints them)."""

    @tvm.transform.module_pass(opt_level=0, name="CostFuseCombineSiblings")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out, costfuse.siblings = decide_siblings(mod, costfuse)
        return out

    return _pass
