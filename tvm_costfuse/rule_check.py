"""Rule check: each fused kernel is scheduled by the rule of the card that priced it.

The planner prices a group with the first card that claims its features, read off the Relax
graph (``cost/extract.py``); the schedule pass takes the kernel with the first rule whose
structural preconditions hold on its TIR (``schedules/cpu.py``). The two are written apart,
so they can disagree, and where they do the plan priced a kernel that never runs (a group
priced as fused attention and run as the fallback's loops is 10-100x over its price).

So the plan's fused groups are built as the build builds them (``apply_partition`` then
``FuseTIR``), and each distinct kernel is handed to the rules (``schedules.first_rule``). A
group that the card's rule does not take is returned with the card of the rule that does
(None where no rule does), and the planner searches again with the group priced as that card
(``transform.plan_module``). LLVM targets only: there both the cards and the rules are ours;
on CUDA the rules are dlight's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import tvm
import tvm_ffi
from tvm import relax

from .cost.extract import group_features
from .graph import OpGraph
from .partition import partition_named
from .schedules import first_rule
from .schedules.prepack import mark_constant_weights


class Mismatch(NamedTuple):
    """A group whose card's rule declines its kernel: the card of the rule that takes it (None:
    no rule does) and what happened, in words."""

    card: object
    why: str


def runs_as(rule, features):
    """The card of ``rule`` a group with ``features`` is priced as: the first of the rule's
    cards that claims it, else its last (most general) one."""
    return next((c for c in rule.cards if c.claims(features, "cpu")), rule.cards[-1])


def mismatched_groups(mod: tvm.IRModule, func_name: str, graph: OpGraph,
                      groups: Iterable[Sequence[str]], target: tvm.target.Target,
                      checked: set[frozenset] | None = None) -> dict[frozenset, Mismatch]:
    """The groups of ``groups`` (binding names of ``mod[func_name]``, a module after
    ``pipelines.prepare``) whose kernel the rule of their card declines on ``target``
    (``{}`` on targets other than LLVM). Groups in ``checked`` are skipped, and the groups
    checked now are added to it (a search again asks about the groups it formed anew)."""
    if target.kind.name != "llvm":
        return {}
    checked = set() if checked is None else checked
    cards, features = {}, {}
    for members in groups:
        key = frozenset(members)
        if key in checked or sum(graph[m].kind == "call_tir" for m in members) < 2:
            continue  # a single op: the same kernel under every strategy
        checked.add(key)
        features[key] = group_features(graph, members)
        if not features[key].is_view:
            cards[key] = features[key].card_on("cpu")
    if not cards:
        return {}
    grouped, function_of = partition_named(mod, [sorted(g) for g in cards], func_name)
    kernels = mark_constant_weights(relax.transform.FuseTIR()(grouped))
    taken_by: dict[int, object] = {}  # a repeated layer's kernel is asked once
    found = {}
    for members, card in cards.items():
        name = next((function_of[m] for m in sorted(members) if m in function_of), None)
        if name is None:
            continue  # dead code: no kernel runs
        kernel = kernels[name]
        key = tvm_ffi.structural_hash(kernel)
        if key not in taken_by:
            with target:
                taken_by[key] = first_rule(kernel, target)[0]
        rule = taken_by[key]
        if rule is None or type(rule).__name__ != card.rule or card not in rule.cards:
            found[members] = Mismatch(
                runs_as(rule, features[members]) if rule is not None else None,
                f"priced as {card.cls} ({card.rule}), but its kernel is scheduled by "
                f"{type(rule).__name__ if rule else 'no rule'}")
    return found
