"""The labels the cost models learn from and are judged on, measured per model variant: what
``costfuse tune`` runs.

Three kinds, each written to its file in the tuning folder:

- ``groups``: every candidate group the planner weighs, timed alone (``feedback``,
  ``features.jsonl``): the learned model's training rows, and the decisions ``costfuse
  evaluate`` reconstructs from them (a group, another, and their union all measured);
- ``pairs``: each candidate decision's three kernels (left, right, union) timed together in
  rounds (``side_by_side``, ``pairs.jsonl``): the three times of one decision are of one
  moment, where the reconstructed ones may be hours apart;
- ``in-model``: each final decision of CostFuse's plan timed fused and split inside the whole
  model, the rest of the plan fixed (``in_model``, ``in_model.jsonl``): what end-to-end time
  sees of a decision, caches and neighbours included.

After ``groups`` the learned model is retrained on every recorded group (:func:`retrain`).
Each labeller reports how busy the machine was meanwhile: the kernels run in worker
processes, so the machine's whole load is what tells a disturbed model (other work on the other
vCPU of a small host slows them too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from .. import models
from ..config import FusionConfig
from ..cost.learned import MODEL_FILE, train
from ..graph import build_graph
from ..measurement.quiet import OtherLoad
from ..pipelines import prepare
from ..planner import plan_greedy
from ..schedules import schedule_pass
from ..targets import Target
from ..transform import plan_module
from . import in_model, side_by_side
from .feedback import measure_model
from .runners import MeasureConfig

__all__ = ["LABELS", "LabelOptions", "Labelled", "label_groups", "label_in_model", "label_pairs",
           "retrain", "variants"]

LABELS = ("groups", "pairs", "in-model")
# Per kind: timed samples per group, rounds per worker process, interleaved runs of the model.
DEFAULT_REPEAT = {"groups": 3, "pairs": 7, "in-model": 5}
# Per kind and model variant: candidate groups, decisions (None: every one).
DEFAULT_BUDGET = {"groups": 32, "pairs": None, "in-model": None}

Log = Callable[[str], None]


@dataclass(frozen=True)
class LabelOptions:
    """How to measure one kind of label (``costfuse tune``'s options)."""

    kind: str = "groups"  # one of LABELS
    budget: int | None = 32  # groups or decisions per model variant; None: every one
    repeat: int = 3
    min_repeat_ms: int = 30  # groups, pairs: the least duration of one timed sample
    timeout_s: float = 120.0  # groups, pairs: build and run of one kernel
    processes: int = 1  # pairs: worker processes each decision is timed in
    rpc_tracker: str | None = None  # groups: run the kernels on this tracker's server
    wait: bool = False  # groups: wait for another session writing the folder

    @classmethod
    def of(cls, kind: str, **given) -> LabelOptions:
        """Options for ``kind`` with that kind's budget and repeat where ``given`` has none
        (the field defaults are the groups kind's)."""
        given.setdefault("budget", DEFAULT_BUDGET[kind])
        given.setdefault("repeat", DEFAULT_REPEAT[kind])
        return cls(kind=kind, **given)

    def measure_config(self) -> MeasureConfig:
        return MeasureConfig(repeat=self.repeat, min_repeat_ms=self.min_repeat_ms,
                             timeout_s=self.timeout_s, rpc_tracker=self.rpc_tracker)


@dataclass
class Labelled:
    """One model variant labelled: the summary line, the module fusion saw (for the re-plan)
    and what opening the database repaired."""

    line: str
    prepared: tvm.IRModule
    repairs: list[str] = field(default_factory=list)


def variants(specs: Sequence[str], sizes: Sequence[str], synthetic: int = 0
             ) -> list[tuple[str, bool]]:
    """(model, small) to label: each of ``specs`` (``all``: the zoo, ``corpus``: the corpus)
    at each of ``sizes``, then the random programs ``synth-0`` .. ``synth-<synthetic - 1>``
    (one size: their shapes are drawn with the program)."""
    names = [n for s in specs
             for n in (models.zoo.names() if s == "all" else models.corpus_names()
                       if s == "corpus" else [s])]
    return ([(n, size == "small") for size in sizes for n in names]
            + [(f"{models.synthetic.PREFIX}{i}", False) for i in range(synthetic)])


def _busy(load: OtherLoad) -> str:
    return ("" if math.isnan(load.all_cores)
            else f"; the machine was busy {load.all_cores:.2f} cores meanwhile")


def label_groups(model: str, mod: tvm.IRModule, inputs: dict, target: Target,
                 work_dir: Path, opts: LabelOptions, log: Log) -> Labelled:
    """Time the candidate groups of one model variant into ``work_dir`` (resumable)."""
    del inputs  # each kernel is timed on random inputs of its own
    prepared = prepare(mod, target.tvm)
    with OtherLoad() as load:
        s = measure_model(model, prepared, target, work_dir, opts.measure_config(),
                          max_groups=opts.budget, prepared=True, log=log, wait=opts.wait)
    line = (f"{model}: measured {s.measured}, failed {s.failed}, reused {s.reused}, "
            f"already recorded {s.skipped}, unformable {s.unformable}, views {s.views}"
            + (f", {s.stale} recorded before for other kernels (taken up again)"
               if s.stale else "")
            + (f", compiled and ptxas-profiled but not timed (no GPU) {s.untimed}"
               if s.untimed else "")
            + (f", {s.environment} of the failures environmental (measured again next time)"
               if s.environment else "")
            + f" into {work_dir} in {s.seconds:.0f} s" + _busy(load))
    return Labelled(line, prepared, s.repairs)


def label_pairs(model: str, mod: tvm.IRModule, inputs: dict, target: Target,
                work_dir: Path, opts: LabelOptions, log: Log) -> Labelled:
    """Time each candidate decision's three kernels side by side (CPU targets)."""
    del inputs
    prepared = prepare(mod, target.tvm)
    with OtherLoad() as load:
        s = side_by_side.label_pairs(model, prepared, target, work_dir, opts.measure_config(),
                                     max_pairs=opts.budget, prepared=True,
                                     processes=opts.processes, log=log)
    line = (f"{model}: {s.timed} decisions timed side by side, {s.failed} failed, "
            f"{s.unformable} unformable, {s.views} with a view part, {s.repeated} repeated "
            f"layers in {s.seconds:.0f} s" + _busy(load))
    return Labelled(line, prepared)


def label_in_model(model: str, mod: tvm.IRModule, inputs: dict, target: Target,
                   work_dir: Path, opts: LabelOptions, log: Log) -> Labelled:
    """Time each final decision of CostFuse's plan fused and split inside the model."""
    prepared = prepare(mod, target.tvm)
    plan = plan_module(prepared, target.desc, FusionConfig.resolve())
    with OtherLoad() as load:
        records = in_model.label_decisions(model, mod, prepared, plan, inputs, target.tvm,
                                           work_dir, schedule_pass(target.tvm), opts.repeat,
                                           opts.budget, log=log)
    agree = sum((r["fused_s"] < r["split_s"]) == r["accepted"] for r in records)
    line = (f"{model}: {len(records)} decisions timed in the model, the planner's verdict "
            f"right on {agree}" + _busy(load))
    return Labelled(line, prepared)


LABELLERS: dict[str, Callable[..., Labelled]] = {
    "groups": label_groups, "pairs": label_pairs, "in-model": label_in_model}


def retrain(work_dir: Path, target: Target, prepared: dict[str, tvm.IRModule]) -> list[str]:
    """Train the learned model on every group recorded in ``work_dir`` and save it there;
    then each of ``prepared`` (variant name -> module) planned analytically and with the new
    model. Returns the lines to print."""
    learned = train(work_dir, target.desc)
    lines = [(f"trained the learned model on {learned.n_records} records of "
              f"{len(learned.models)} models -> {work_dir / MODEL_FILE}")]
    for name, mod in prepared.items():
        before = plan_module(mod, target.desc, FusionConfig(cost_model="analytical"))
        fell_back = sum(learned.fallbacks.values())
        after = plan_greedy(build_graph(mod), target.desc, FusionConfig(cost_model="xgb"),
                            learned)
        lines.append(f"{name}: plan: {before.kernels()} kernels (analytical) -> "
                     f"{after.kernels()} kernels (xgb, {learned.n_records} records; "
                     f"{sum(learned.fallbacks.values()) - fell_back} queries fell back to "
                     "analytical)")
        lines += [f"  new group: {' + '.join(g)}"
                  for g in sorted(set(after.groups) - set(before.groups))]
    return lines
