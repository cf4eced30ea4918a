"""Side-by-side labels: a fusion decision's three kernels timed together, in one worker.

``feedback`` times each candidate group alone, one after another, and reuses a workload's time
wherever it recurs, so a decision's left part, right part and union may have been timed
minutes apart or in another model's run. On a shared machine a kernel that streams megabytes
moves by more between such timings (a median 4.7%, up to 39% over 1 ms, docs/log/2026-12-02.md)
than fusing a small epilogue into it is worth. Here the three kernels of each decision are
built as ``feedback`` builds them (the same rules, finished the same way, called through the
Relax VM) and timed in rounds, one sample of each per round (``runners.build_and_time_together``),
so the machine's drift hits all three alike.

Within one worker process a kernel can also run steadily slower than in another (seen: 2.4x,
every round alike, in 2 of 4 fresh processes; most likely where its code and buffers were
placed, which address randomization changes per process), and no number of rounds averages
that away. With ``processes=N`` each decision is timed in N worker processes, one call in
each; a part's ``run_secs`` pools their samples and ``run_secs_by_process`` keeps each
process's, from which ``cost.learned.measured_seconds`` takes the mean of the processes'
medians: what a build, landing in one placement or another, pays on average.

Each record goes to ``<work_dir>/pairs.jsonl``: the model, the target, the kernel version
(``versions``) and the three groups as feature rows with their run times, so
``cost.evaluation.side_by_side_pairs`` scores a model against them without rebuilding anything.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from ..config import FusionConfig
from ..cost.extract import group_features
from ..cost.learned import measured_seconds
from ..graph import build_graph
from ..pipelines import prepare
from ..planner import plan_greedy
from ..records.database import default_work_dir, workload_hash
from ..schedules.prepack import mark_constant_weights
from ..targets import resolve
from .feedback import feature_row, group_kernel_and_outputs, schedule_kernel
from .runners import MeasureConfig, _Runner, build_and_time_together
from .versions import kernel_version

__all__ = ["PAIRS_FILE", "PairSummary", "candidate_pairs", "label_pairs", "latest_pairs",
           "read_pairs", "with_side_by_side"]

PAIRS_FILE = "pairs.jsonl"
_PARTS = ("left", "right", "union")


@dataclass
class PairSummary:
    """What one ``label_pairs`` call did."""

    model: str
    timed: int = 0
    failed: int = 0
    repeated: int = 0  # a union workload already timed (a repeated layer, or an earlier run)
    views: int = 0  # a part is a lone reshape: a view in the model, no kernel to time
    unformable: int = 0  # the planner weighed it but apply_partition rejects it (not convex)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def candidate_pairs(graph, target_desc, config: FusionConfig | None = None
                    ) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(left, right) of every merge the greedy planner weighs, deduplicated, in the order
    weighed; members sorted by binding order (``feedback.candidate_groups``' decisions)."""
    plan = plan_greedy(graph, target_desc, config or FusionConfig())
    seen, out = set(), []
    for d in plan.decisions:
        key = frozenset((frozenset(d.left), frozenset(d.right)))
        if key not in seen:
            seen.add(key)
            out.append(tuple(tuple(sorted(g, key=lambda n: graph[n].index))
                             for g in (d.left, d.right)))
    return out


def _headline(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[-1] if lines else type(err).__name__


def label_pairs(model: str, mod: tvm.IRModule, target, work_dir=None,
                config: MeasureConfig | None = None, *, max_pairs: int | None = None,
                prepared: bool = False, fusion_config: FusionConfig | None = None,
                processes: int = 1, log: Callable[[str], None] | None = None
                ) -> PairSummary:
    """Time the candidate decisions of one model side by side and append them to
    ``work_dir/pairs.jsonl``.

    ``target``: anything ``targets.resolve`` takes (CPU targets: the kernels run here).
    ``config.repeat`` is the number of rounds in each of ``processes`` worker processes;
    ``max_pairs`` stops after that many decisions whose union is a new workload (a repeated
    layer's decision is timed once, and a decision already in ``pairs.jsonl`` for this model
    and these kernels, from at least as many processes, is not timed again). A decision
    whose kernels cannot be formed (``unformable``: not convex), built or run (``failed``) is
    logged with its error and skipped: no record is written for it; nor for a decision with a
    view as a part (``views``).
    """
    resolved = resolve(target)
    target, target_desc = resolved.tvm, resolved.desc
    if target.kind.name != "llvm":
        raise ValueError(f"side-by-side labels time CPU kernels here, not {target.kind.name}")
    config = config or MeasureConfig(repeat=7)
    if processes < 1:
        raise ValueError(f"processes must be at least 1, not {processes}")
    if processes > 1 and not config.isolate:
        raise ValueError("several processes need isolated workers (config.isolate)")
    log = log or (lambda _msg: None)
    path = Path(work_dir or default_work_dir(target)) / PAIRS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    prep = mod if prepared else prepare(mod, target)
    graph = build_graph(prep)
    marked = mark_constant_weights(prep)
    # Decisions timed before under these kernels (a resumed run, a larger ``max_pairs``) are
    # not timed again: their union workloads count as done.
    unions = {r["union"]["workload_hash"] for r in read_pairs(path.parent)
              if r["model"] == model and r.get("kernels") == kernel_version()
              and r.get("processes", 1) >= processes}
    # Three kernels to build and time per call: three kernels' time.
    workers = [_Runner(dataclasses.replace(config, timeout_s=3 * config.timeout_s),
                       build_and_time_together) for _ in range(processes)]
    summary = PairSummary(model)
    try:
        _label_all(model, graph, prep, marked, target, target_desc, config, fusion_config,
                   max_pairs, path, summary, unions, workers, log)
    finally:
        for w in workers:
            w.close()
    summary.seconds = time.perf_counter() - start
    return summary


def _label_all(model, graph, prep, marked, target, target_desc, config, fusion_config,
               max_pairs, path, summary, unions, workers, log) -> None:
    """The timing loop of :func:`label_pairs`."""
    for left, right in candidate_pairs(graph, target_desc, fusion_config):
        if max_pairs is not None and summary.timed + summary.failed >= max_pairs:
            break
        groups = {"left": left, "right": right,
                  "union": tuple(sorted(left + right, key=lambda n: graph[n].index))}
        shown = f"{'+'.join(left)} | {'+'.join(right)}"
        if any(group_features(graph, g).is_view for g in groups.values()):
            summary.views += 1  # timing a view as a copy kernel would be a wrong label
            continue
        try:
            kernels = {k: group_kernel_and_outputs(prep, graph, g, marked)
                       for k, g in groups.items()}
        except Exception as err:  # noqa: BLE001 -- a merge that forms no kernel (not convex)
            summary.unformable += 1
            summary.errors.append(f"{shown}: fuse: {_headline(err)}")
            log(f"  {model} {shown}: could not form the kernels: {_headline(err)}")
            continue
        union_hash = workload_hash(kernels["union"][0])
        if union_hash in unions:
            summary.repeated += 1
            continue
        unions.add(union_hash)
        try:
            funcs = [tvm.ir.save_json(schedule_kernel(kernels[k][0], target)[0])
                     for k in _PARTS]
            by_process = [w.call(funcs, target.export(), config.number, config.repeat,
                                 config.min_repeat_ms, [kernels[k][1] for k in _PARTS])
                          for w in workers]
        except Exception as err:  # noqa: BLE001 -- a schedule, build, run or worker failure
            summary.failed += 1
            summary.errors.append(f"{shown}: {_headline(err)}")
            log(f"  {model} {shown}: {_headline(err)}")
            continue
        record = {"model": model, "target": str(target), "kernels": kernel_version(),
                  "repeat": config.repeat, "processes": len(workers),
                  "date": datetime.datetime.now().isoformat(timespec="seconds")}
        for i, k in enumerate(_PARTS):
            runs = [p[i] for p in by_process]
            record[k] = {**feature_row(model, graph, groups[k]),
                         "run_secs": [s for r in runs for s in r],
                         "run_secs_by_process": runs,
                         "workload_hash": workload_hash(kernels[k][0])}
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        summary.timed += 1
        med = {k: measured_seconds(record[k]) * 1e6 for k in _PARTS}
        each = "" if len(by_process) == 1 else " (per process: " + ", ".join(
            "/".join(f"{_median(t) * 1e6:.0f}" for t in p) for p in by_process) + " us)"
        log(f"  {model} {shown}: union {med['union']:.1f} us, left {med['left']:.1f} + right "
            f"{med['right']:.1f} us{each}")


def _median(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2]


def read_pairs(work_dir: str | Path) -> list[dict]:
    """The records of ``work_dir/pairs.jsonl`` (none when it does not exist); a torn last line
    (a killed run) is skipped."""
    path = Path(work_dir) / PAIRS_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def latest_pairs(records: list[dict], kernels: str | None = None) -> list[dict]:
    """One record per (model, union workload): the one timed in the most processes, the
    latest among those; only records of ``kernels`` when given. A decision re-timed with
    more processes (``label_pairs(processes=N)``) supersedes its earlier record."""
    best: dict[tuple[str, str], dict] = {}
    for rec in sorted(records, key=_rank):
        if kernels is None or rec.get("kernels") == kernels:
            best[(rec["model"], rec["union"]["workload_hash"])] = rec
    return list(best.values())


def _rank(rec: dict) -> tuple[int, str]:
    """Which of two records of one decision wins: more processes, then the later one."""
    return rec.get("processes", 1), rec.get("date", "")


def with_side_by_side(rows: list[dict], records: list[dict]) -> list[dict]:
    """``rows`` (feature rows with run times) with each group that a side-by-side record timed
    in its model replaced by that record's row (from the record of most processes when
    several timed it); groups only the records hold are added."""
    together: dict[tuple, dict] = {}
    for rec in sorted(records, key=_rank):
        for k in _PARTS:
            together[(rec["model"], frozenset(rec[k]["members"]))] = rec[k]
    return ([r for r in rows if (r["model"], frozenset(r["members"])) not in together]
            + list(together.values()))
