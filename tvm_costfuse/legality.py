"""can_fuse: may these bindings share one kernel under the user's limits?

Legality is separate from profitability (as in Inductor's can_fuse / score_fusion): the
planner asks the cost model only about groups that pass here, and every "no" carries the
reason ``costfuse explain`` prints. Convexity is the planner's check (it needs the grouping
around the group); everything local to the group is checked here. Nothing here touches IR.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .cost.analytical import kind_model
from .cost.features import GroupFeatures
from .graph import OpGraph


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


OK = Verdict(True)


def within_caps(n_ops: int, chain_length: int, config, n_args: int = 0) -> Verdict:
    """The config's size caps: ``max_body_ops``, ``max_chain_length``, ``max_args``. The
    pattern rules (``rules.py``) check their groups here too, without a target."""
    if n_ops > config.max_body_ops:
        return Verdict(False, f"{n_ops} ops > max_body_ops {config.max_body_ops}")
    if chain_length > config.max_chain_length:
        return Verdict(
            False, f"chain of {chain_length} ops > max_chain_length {config.max_chain_length}"
        )
    if n_args > config.max_args:
        return Verdict(False, f"{n_args} kernel arguments > max_args {config.max_args}")
    return OK


def can_fuse(graph: OpGraph, members: Iterable[str], f: GroupFeatures, config, target) -> Verdict:
    """Check the group against fusability, dataflow blocks and the config's caps.

    ``config`` provides ``max_chain_length``, ``max_body_ops``, ``max_args`` and
    ``register_budget`` (a ``FusionConfig``).
    """
    members = list(members)
    unfusable = [graph[n] for n in members if not graph[n].fusable]
    if unfusable:  # the first in binding order, whatever order a set of names came in
        node = min(unfusable, key=lambda n: n.index)
        return Verdict(False, f"{node.name!r} cannot be fused: {node.why_not_fusable}")
    if len({graph[n].block for n in members}) > 1:
        return Verdict(False, "the bindings sit in different dataflow blocks")
    caps = within_caps(f.n_ops, f.chain_length, config, f.n_args)
    if not caps:
        return caps
    model = kind_model(target)
    regs, _ = model.registers(f, target)
    if model.caps_registers and regs > config.register_budget:
        return Verdict(
            False, f"~{regs} registers per thread > register_budget {config.register_budget}"
        )
    return OK
