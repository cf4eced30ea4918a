"""CostFuse: the module pass that takes FuseOps' place (``pipelines`` puts it there).

It must run where FuseOps runs: after LegalizeOps + AnnotateTIROpPattern (+ FoldConstant), so
every op is a pattern-annotated call_tir, and before FuseTIR, which turns each grouped
function into one PrimFunc. Per Relax function it builds the OpGraph, plans with the cost
model, and applies the plan with ``apply_partition``. Bindings whose cost it cannot model
(symbolic shapes) are left to FuseOps' own grouping, and the plan says so. Each fused kernel
of the plan is then handed to the schedule rules (``rule_check``): a group that runs as
another kernel than its card priced is priced as what runs and the plan searched again.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import tvm

from .config import FusionConfig, register_config_keys
from .cost.learned import load_learned
from .cost.measured import load_measured
from .graph import OpGraph, build_graph
from .partition import apply_per_function, fuseops_groups
from .planner import FusionPlan, plan_exact, plan_greedy
from .pricer import Pricer
from .regions import cheaper_by_region
from .rule_check import Mismatch, mismatched_groups
from .targets import CUDA, Target, TargetDesc, preset, preset_names, resolve


def _unmodelled(graph) -> set[str]:
    """Bindings the cost model cannot price: tensors with symbolic dimensions."""
    return {
        n.name
        for n in graph.nodes
        if n.kind == "call_tir" and any(t.nbytes is None for t in n.outputs)
    }


#: Searches after the first one, each with the groups found so far priced as what runs.
RULE_CHECK_ROUNDS = 3


def plan_module(
    mod: tvm.IRModule, target: TargetDesc, config: FusionConfig, func_name: str = "main",
    compile_target: tvm.target.Target | None = None, graph: OpGraph | None = None,
) -> FusionPlan:
    """Plan fusion for ``mod[func_name]`` (a module after ``pipelines.prepare``).

    Each fused group's kernel must be taken by the rule of the card that priced it
    (``rule_check``, on ``compile_target``: by default the current target, else the one
    ``target`` describes). A group another rule takes is priced as that rule's card (one no
    rule takes is illegal) and the plan searched again; the notes say how many. ``graph``:
    the function's OpGraph where the caller built (and amended) it."""
    graph = build_graph(mod, func_name) if graph is None else graph
    skip = _unmodelled(graph)
    frozen = []
    if skip:
        frozen = [g for g in fuseops_groups(mod, func_name) if skip & set(g)]
    model = None
    if config.cost_model == "xgb":
        model = load_learned(target)
    elif config.cost_model == "measured":
        model = load_measured(target)
    compile_target = compile_target or tvm.target.Target.current() or target.tvm_target()
    mismatched: dict[frozenset, Mismatch] = {}
    checked = {frozenset(g) for g in frozen}  # FuseOps' own groups, kept as they are
    for _ in range(1 + RULE_CHECK_ROUNDS):
        plan = _search(mod, func_name, graph, target, config, model, frozen, mismatched)
        found = mismatched_groups(mod, func_name, graph, plan.groups, compile_target, checked)
        if not found:
            break
        mismatched.update(found)
    else:  # the last search formed groups found only now: FuseOps' grouping where cheaper
        plan = _no_worse_than_fuseops(mod, func_name, graph, plan, target, config, model,
                                      frozen, mismatched, reprice=True)
        mismatched.update(mismatched_groups(mod, func_name, graph, plan.groups,
                                            compile_target, checked))
    kept = [g for g in map(frozenset, plan.groups) if g in mismatched]
    notes = []
    if mismatched:
        notes.append(f"{len(mismatched)} group(s) a search formed run as another kernel than "
                     "their card priced; they are priced as what runs"
                     + (f", and {len(kept)} of them are in the plan" if kept else
                        ", and the search chose without them"))
    if any(mismatched[g].card is None for g in kept):
        notes.append("the plan holds groups no rule schedules (left as loops), after "
                     f"{1 + RULE_CHECK_ROUNDS} searches and FuseOps' grouping")
    if frozen:
        notes.append(f"{len(skip)} bindings with symbolic shapes left to FuseOps "
                     f"({len(frozen)} of its groups kept as they are)")
    if notes:
        plan = dataclasses.replace(
            plan, left_to_fuseops=tuple(map(tuple, frozen)), notes=plan.notes + tuple(notes),
            mismatched=tuple((tuple(sorted(g, key=lambda n: graph[n].index)),
                              m.card.cls if m.card is not None else None, m.why)
                             for g, m in mismatched.items()))
    return plan


def _search(mod, func_name, graph, target, config, model, frozen, mismatched) -> FusionPlan:
    """The planner's search, then FuseOps' grouping where that is predicted cheaper."""
    search = plan_exact if config.search == "exact" else plan_greedy
    plan = search(graph, target, config, model, frozen=frozen, mismatched=mismatched)
    return _no_worse_than_fuseops(mod, func_name, graph, plan, target, config, model, frozen,
                                  mismatched)


def _no_worse_than_fuseops(mod, func_name, graph, plan, target, config, model, frozen,
                           mismatched, reprice: bool = False):
    """``plan`` with each region where FuseOps' grouping is predicted cheaper (and legal,
    and convex with the rest) taken from FuseOps (``regions``); a note says how many.
    ``reprice``: the plan's estimates are taken again from ``mismatched``'s prices even
    where no region changes."""
    price = Pricer(graph, target, config, model, mismatched)
    units, swapped, saved = cheaper_by_region(graph, price, plan.groups,
                                              fuseops_groups(mod, func_name), frozen)
    if not swapped and not reprice:
        return plan
    estimates = {tuple(sorted(u, key=lambda n: graph[n].index)): price(u)[0] for u in units}
    note = (f"{swapped} region(s) take FuseOps' grouping, predicted {saved * 1e6:.2f} us "
            "cheaper than the search's" if math.isfinite(saved) else
            f"{swapped} region(s) take FuseOps' grouping, some in place of groups no rule "
            "schedules")
    if not swapped:
        return dataclasses.replace(plan, estimates=estimates)
    return FusionPlan(tuple(k for k in estimates if len(k) > 1), estimates, plan.decisions,
                      plan.left_to_fuseops, plan.notes + (note,))


@tvm.transform.module_pass(opt_level=0, name="CostFuse")
@dataclass
class CostFuse:
    """Cost-model-driven replacement for ``relax.transform.FuseOps``.

    Arguments left as None are read from the PassContext config (``costfuse.*`` keys), then
    from defaults; explicit arguments win. ``target`` may be a TargetDesc, a preset name, a
    ``tvm.target.Target``, or None for ``Target.current()``. After the pass runs, ``plans``
    maps each function name to the FusionPlan applied (what ``costfuse explain`` prints).
    """

    target: object = None
    max_chain_length: int | None = None
    max_body_ops: int | None = None
    register_budget: int | None = None
    cost_model: str | None = None
    search: str | None = None
    max_args: int | None = None
    target_preset: str | None = None
    horizontal: str | None = None
    layout: str | None = None
    plans: dict = field(default_factory=dict)
    #: sibling matmul sets the pipeline's CombineSiblings step found, each with its decision
    siblings: list = field(default_factory=list)
    #: the pipeline's ChannelsLast step's decision (``layouts.Layout``; None before it runs)
    layout_decision: object = None

    def config(self) -> FusionConfig:
        register_config_keys()
        return FusionConfig.resolve(
            max_chain_length=self.max_chain_length,
            max_body_ops=self.max_body_ops,
            register_budget=self.register_budget,
            cost_model=self.cost_model,
            search=self.search,
            max_args=self.max_args,
            target_preset=self.target_preset,
            horizontal=self.horizontal,
            layout=self.layout,
        )

    def compile_target(self, step: str) -> tvm.target.Target:
        """The TVM target a pre-fusion ``step`` (the layout or sibling step) decides for: the
        current one, else the one ``target`` resolves to; a ValueError naming ``step`` where
        there is neither."""
        current = tvm.target.Target.current()
        if current is None and self.target is not None:
            current = resolve(self.target).tvm
        if current is None:
            raise ValueError(f"the {step} step decides for the compile target: give CostFuse "
                             "a target or run it under `with target`")
        return current

    def describe_target(self, config: FusionConfig) -> TargetDesc:
        """The description plans are priced with: an explicit TargetDesc or preset name, else
        ``costfuse.target_preset``, else the one :func:`targets.resolve` derives from the
        target (``Target.current()`` when None)."""
        t = self.target
        if isinstance(t, (TargetDesc, Target)) or (
                isinstance(t, str) and t.strip().lower() in preset_names()):
            return resolve(t).desc
        if config.target_preset:
            desc = preset(config.target_preset)
            compiled = t if t is not None else tvm.target.Target.current()
            if compiled is not None:
                kind = tvm.target.Target(compiled).kind.name
                if (kind == "cuda") != (desc.kind == CUDA):
                    raise ValueError(
                        f"costfuse.target_preset {config.target_preset!r} describes a "
                        f"{desc.kind} target, but this module compiles for {kind}: the plan "
                        f"would be priced for the wrong machine (choose a preset of that kind, "
                        "or leave target_preset unset)")
            return desc
        if t is None and tvm.target.Target.current() is None:
            raise ValueError(
                "CostFuse needs a target: pass target=..., set costfuse.target_preset, "
                "or run it under `with tvm.target.Target(...)`"
            )
        return resolve(t).desc

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        config = self.config()
        target = self.describe_target(config)

        def groups(m: tvm.IRModule, name: str):
            self.plans[name] = plan_module(m, target, config, name)
            return self.plans[name].groups

        return apply_per_function(mod, groups)
