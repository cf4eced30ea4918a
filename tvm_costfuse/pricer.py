"""Pricing: the cost model's answers about candidate groups, memoized for the planner.

The planner (``planner.py``), the region comparison with FuseOps (``regions.py``) and the
regret report ask about the same member sets many times; :class:`Pricer` keeps each answer,
and prices a group the plan's rule check found running as another kernel (``rule_check``) as
the kernel that runs.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .cost.analytical import Estimate, estimate
from .cost.extract import group_features
from .cost.features import GroupFeatures
from .graph import OpGraph
from .legality import Verdict, can_fuse

if TYPE_CHECKING:
    from .rule_check import Mismatch

Model = Callable[..., Estimate]
# A GroupFeatures' fields as one tuple, hashed and compared in C (the dataclass's own
# __hash__ and __eq__ build that tuple in Python on every lookup).
_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(GroupFeatures)))


class Pricer:
    """Cost-model queries, memoized per group (the planner asks about the same sets often).

    ``estimate`` is all a candidate's place in the queue needs; the verdict is asked only of
    the candidates the queue yields (about a third of those priced). The analytical model is
    a function of the features alone, so identical features (repeated layers, the same op
    kinds in a synthetic graph: 60% of the groups a 10k-op random DAG prices) are estimated
    once; other models count their queries, and are asked each time.
    """

    def __init__(self, graph: OpGraph, target, config, model: Model | None,
                 mismatched: Mapping[frozenset, Mismatch] | None = None) -> None:
        self.graph, self.target, self.config = graph, target, config
        #: groups whose kernel the rule of their card does not take (``rule_check``): priced
        #: as the card of the rule that does; where none does, illegal and priced at infinity
        #: (a region holding one takes FuseOps' grouping)
        self.mismatched = mismatched or {}
        self.model = model or estimate
        self.features: dict[frozenset, GroupFeatures] = {}
        self.estimates: dict[frozenset, Estimate] = {}
        self.by_features: dict[tuple, Estimate] | None = {} if self.model is estimate else None
        self.verdicts: dict[frozenset, Verdict] = {}

    def estimate(self, members: frozenset) -> Estimate:
        est = self.estimates.get(members)
        if est is None and members in self.mismatched:
            f = self.features[members] = group_features(self.graph, members)
            card = self.mismatched[members].card
            if card is None:
                est = Estimate(math.inf)
            else:
                est = self.model(f.priced_as("cpu", card), self.target,
                                 self.config.register_budget)
            self.estimates[members] = est
        if est is None:
            f = self.features[members] = group_features(self.graph, members)
            memo = self.by_features
            key = _FIELDS(f) if memo is not None else None  # what GroupFeatures' == compares
            est = memo.get(key) if memo is not None else None
            if est is None:
                est = self.model(f, self.target, self.config.register_budget)
                if memo is not None:
                    memo[key] = est
            self.estimates[members] = est
        return est

    def verdict(self, members: frozenset) -> Verdict:
        verdict = self.verdicts.get(members)
        if verdict is None:
            self.estimate(members)
            mismatch = self.mismatched.get(members)
            if mismatch is not None and mismatch.card is None:
                verdict = Verdict(False, mismatch.why)
            else:
                verdict = can_fuse(self.graph, members, self.features[members], self.config,
                                   self.target)
            self.verdicts[members] = verdict
        return verdict

    def __call__(self, members: frozenset) -> tuple[Estimate, Verdict]:
        return self.estimate(members), self.verdict(members)
