"""Keep the recorded rows whose kernel an edit left unchanged: ``costfuse restamp``.

Every edit of a file the kernel digest covers (``versions.KERNEL_SOURCES``, comments included)
makes every row stale, and the next ``costfuse tune`` measures them all again (20 minutes for
the zoo and 40 synthetic programs on 2 cores), although most edits change few kernels or none:
a card's price, a rule that claims one more shape. This rebuilds each stale row's kernel with
the current code -- formed from its model as ``feedback.measure_model`` forms it, scheduled,
finished and lowered -- and compares it with what the row timed:

- the same ``kernel_hash`` and ``harness`` (``versions``): the time is a label of today's
  kernel, and the row takes the current stamp;
- another hash: the kernel changed (``changed``); the row stays stale and ``costfuse tune``
  measures it again;
- another harness, no hash (recorded before rows had one), a model that no longer builds, or
  an environment's failure (re-measured in any case): stale too, nothing vouches for it
  (``unverifiable``).

Only the group rows (``features.jsonl``) are restamped; the side-by-side and in-model labels
are measured again after any edit. Rows already stamped with the current digest and recorded
without a hash, or hashed by another procedure (another harness: ``versions.py`` is in it,
outside the digest), get one here: the current code formed, scheduled and lowered what they timed
(as far as the digest says: the models themselves, ``models/``, are outside it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import tvm

from ..records.database import GroupDatabase, default_work_dir, headline
from ..targets import resolve
from .feedback import group_kernel_and_outputs, schedule_kernel
from .recorded import RecordedModels
from .versions import harness_version, kernel_hash, kernel_version

__all__ = ["RestampSummary", "restamp"]


@dataclass
class RestampSummary:
    """Row counts by outcome, and why rows could not be checked (key: model or row)."""

    current: int = 0  # already stamped with today's digest
    hashed: int = 0  # of those, given the hash of the kernel they timed
    restamped: int = 0  # stale, kernel and harness unchanged: now current
    changed: int = 0  # stale, another kernel: measured again by `costfuse tune`
    unverifiable: int = 0  # stale, another harness, no hash recorded, or not rebuilt
    missing: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        return (f"{self.restamped} rows restamped (kernel unchanged), {self.changed} changed, "
                f"{self.unverifiable} not verifiable, {self.current} already current "
                f"({self.hashed} given their kernel's hash); `costfuse tune` measures the "
                f"{self.changed + self.unverifiable} stale rows again")


def restamp(work_dir=None, target=None, log: Callable[[str], None] | None = None
            ) -> RestampSummary:
    """Restamp the rows of ``work_dir`` (default: the target's folder) whose kernel and harness
    are unchanged, and hash the current rows that have no hash. Holds the folder's lock."""
    resolved = resolve(target or "host")
    db = GroupDatabase(work_dir or default_work_dir(resolved.tvm))
    log = log or (lambda _msg: None)
    stamp, harness = kernel_version(), harness_version()
    summary = RestampSummary()
    with db.writing(salvage=False):
        rows = db.rows()
        recorded = _by_target(rows)
        last = {r["model"]: i for i, r in enumerate(rows)}  # a model is released after it
        out = []
        for i, row in enumerate(rows):
            out.append(_restamped(row, stamp, harness, recorded, summary, log))
            if last[row["model"]] == i:
                for models in recorded.values():
                    models.release(row["model"])
        db.rewrite_rows(out)
    return summary


def _restamped(row: dict, stamp: str, harness: str, recorded: dict[str, RecordedModels],
               summary: RestampSummary, log: Callable[[str], None]) -> dict:
    """``row`` as :func:`restamp` leaves it, counted in ``summary``."""
    current = row.get("kernels") == stamp
    if current and row.get("kernel_hash") and row.get("harness") == harness:
        summary.current += 1
        return row
    if not current and (not row.get("kernel_hash") or row.get("harness") != harness
                        or row.get("failure") == "environment"):
        summary.unverifiable += 1
        return row
    got = _rebuilt_hash(row, recorded, summary.missing)
    if current:
        summary.current += 1
        summary.hashed += got is not None
        return {**row, "kernel_hash": got, "harness": harness} if got else row
    if got is None:
        summary.unverifiable += 1
        return row
    if got == row["kernel_hash"]:
        summary.restamped += 1
        return {**row, "kernels": stamp}
    summary.changed += 1
    log(f"  {row['model']} {'+'.join(row['members'])[:60]}: kernel changed")
    return row


def _by_target(rows: list[dict]) -> dict[str, RecordedModels]:
    """One set of rebuilt models per recorded target (a row's kernel is scheduled for the
    target it was timed on: its cores decide the parallel loops)."""
    return {t: RecordedModels(tvm.target.Target(json.loads(t)))
            for t in {r["target"] for r in rows if r.get("target")}}


def _rebuilt_hash(row: dict, recorded: dict[str, RecordedModels], missing: dict[str, str]
                  ) -> str | None:
    """The hash of the kernel the current code builds for ``row``'s group; None, with the
    reason in ``missing``, where it cannot be built."""
    models = recorded.get(row.get("target", ""))
    model, members = row["model"], row["members"]
    found = models.for_row(model, members) if models is not None else None
    if found is None:
        key, why = (models.why_not(model, members) if models is not None
                    else (model, "the row names no target"))
        missing[key] = why
        return None
    try:
        func, n_out = group_kernel_and_outputs(found.module, found.graph, members, found.marked)
        return kernel_hash(schedule_kernel(func, models.target)[0], models.target, n_out)
    except Exception as err:  # noqa: BLE001 -- the row stays stale; the caller says why
        missing[f"{model}: {'+'.join(members)[:60]}"] = \
            f"its kernel does not build: {type(err).__name__}: {headline(str(err))}"[:200]
        return None
