"""In-model labels: each final fusion decision of a plan, timed inside the whole model.

A kernel timed alone (``feedback``) can disagree with what the same decision does in the model:
the kernels around it see other cache contents, and a fused kernel's schedule can differ from
the parts'. For every decision a plan ends with -- a group it formed from two parts, or two
adjacent units it kept apart -- the model is built twice with the rest of the plan fixed, the
decision fused and split, and both are timed interleaved in one process. Each record goes to
``<work_dir>/in_model.jsonl`` beside the isolated timings (``features.jsonl``), with the
features of both parts and their union, so ``cost.evaluation`` can score a model's decision
against the in-model label without rebuilding anything.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tvm

from ..graph import OpGraph, build_graph
from ..measurement.timing import build, interleaved_medians
from ..partition import ApplyPartition, PartitionError, resolve_groups
from ..planner import FusionPlan
from .feedback import feature_row

IN_MODEL_FILE = "in_model.jsonl"


@dataclass(frozen=True)
class FinalDecision:
    """A decision as the plan ended with it: ``left`` and ``right`` fused (``accepted``) or
    kept apart, every other group of the plan as it is."""

    left: tuple[str, ...]
    right: tuple[str, ...]
    accepted: bool


def final_decisions(plan: FusionPlan, graph: OpGraph) -> list[FinalDecision]:
    """The planner's decisions whose outcome the final plan still shows: an accepted merge whose
    union is a final group, a rejected one whose two sides are final units (a group, or an op
    left alone). Earlier merges, later absorbed into larger groups, are not in the plan."""
    groups = {frozenset(g) for g in plan.groups}
    grouped = {n for g in plan.groups for n in g}

    def unit(side: tuple[str, ...]) -> bool:
        return frozenset(side) in groups or (len(side) == 1 and side[0] not in grouped)

    out, seen = [], set()
    for d in plan.decisions:
        key = frozenset((frozenset(d.left), frozenset(d.right)))
        if key in seen:
            continue
        union = frozenset(d.left) | frozenset(d.right)
        if (d.accepted and union in groups) or (not d.accepted and unit(d.left)
                                                 and unit(d.right)):
            seen.add(key)
            out.append(FinalDecision(tuple(d.left), tuple(d.right), d.accepted))
    return sorted(out, key=lambda d: min(graph[n].index for n in d.left + d.right))


def _variants(plan: FusionPlan, d: FinalDecision) -> dict[str, list[list[str]]]:
    both = set(d.left) | set(d.right)
    rest = [list(g) for g in plan.groups if not set(g) & both]
    parts = [list(p) for p in (d.left, d.right) if len(p) > 1]
    return {"fused": [*rest, [*d.left, *d.right]], "split": [*rest, *parts]}


def label_decisions(model: str, mod: tvm.IRModule, prepared: tvm.IRModule, plan: FusionPlan,
                    inputs: dict, target: tvm.target.Target, work_dir: str | Path,
                    schedule: tvm.transform.Pass, repeat: int = 5,
                    max_decisions: int | None = None,
                    log: Callable[[str], None] = print) -> list[dict]:
    """Time each final decision of ``plan`` (on ``prepared``, the module fusion sees) fused
    and split inside ``mod``, and append the records to ``work_dir/in_model.jsonl``; a
    decision whose fused form no legal plan has is logged and skipped."""
    graph = build_graph(prepared)
    decisions = final_decisions(plan, graph)[:max_decisions]
    path = Path(work_dir) / IN_MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    records = []
    for d in decisions:
        variants = _variants(plan, d)
        try:  # a rejected merge can be one no legal plan forms (a cycle with the rest)
            resolve_groups(graph, variants["fused"])
        except PartitionError as err:
            log(f"  {'+'.join(d.left)} | {'+'.join(d.right)}: not formable ({err})")
            continue
        built = {k: build(mod, target, ApplyPartition(v), schedule) for k, v in variants.items()}
        seconds = interleaved_medians(built, inputs, repeat=repeat)
        union = (*d.left, *d.right)
        record = {
            "model": model, "target": str(target), "accepted": d.accepted,
            "fused_s": seconds["fused"], "split_s": seconds["split"], "repeat": repeat,
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "left": feature_row(model, graph, d.left),
            "right": feature_row(model, graph, d.right),
            "union": feature_row(model, graph, union),
        }
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        records.append(record)
        log(f"  {'+'.join(d.left)} | {'+'.join(d.right)}: fused {seconds['fused'] * 1e3:.3f} ms,"
            f" split {seconds['split'] * 1e3:.3f} ms (planner: "
            f"{'fused' if d.accepted else 'split'})")
    return records


def read_labels(work_dir: str | Path) -> list[dict]:
    """The in-model records of ``work_dir`` (none when it has no file)."""
    path = Path(work_dir) / IN_MODEL_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
