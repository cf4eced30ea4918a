"""Measured fusion groups on disk: a meta-schedule ``JSONDatabase`` plus their group features.

Each measured group is one meta-schedule workload (its PrimFunc, unscheduled, as
``IRModule({"main": func})``) and one ``TuningRecord`` whose trace is the schedule our CPU rules
(or, on CUDA, dlight's GPU rules) applied (replayable by ``MetaScheduleApplyDatabase``) and whose ``run_secs`` are the measured
times (``[1e10]`` for a failed build or run, as meta-schedule records failures). Beside the
database, ``features.jsonl`` holds one line per (model, group): the workload's structural hash,
the group's ``GroupFeatures`` vector, the run times and any error. That file is what the learned
model trains on and what makes a session resumable: a workload hash found there is never measured
again.

Both files are append-only and written line by line (flushed and fsynced per record), so a session
killed mid-way loses at most the record being measured. If a kill falls between the database
commit and the features line, the group is measured again next time and the database keeps a
second record of the same workload (harmless: meta-schedule keeps the best).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

__all__ = ["FAILED_RUN_SECS", "GroupDatabase", "default_work_dir", "workload_hash"]

# meta-schedule's run time for a candidate that failed to build or run.
FAILED_RUN_SECS = 1e10
FEATURES_FILE = "features.jsonl"
_REPO_ROOT = Path(__file__).resolve().parents[2]  # tvm_costfuse/tuning/ -> the repository


def target_dir(target: tvm.target.Target | str) -> Path:
    """``tuning_logs/<kind>-<chip>`` at the repository root: the CPU model for llvm
    (``llvm-znver4``), the architecture for cuda (``cuda-sm_90``; GPUs of one architecture,
    such as H100 and H200, share a folder). Meta-schedule tunes whole-model kernels into it."""
    target = tvm.target.Target(target)
    attrs = target.attrs if target.attrs is not None else {}
    chip = attrs.get("arch", "") if target.kind.name == "cuda" else attrs.get("mcpu", "")
    name = f"{target.kind.name}-{chip}" if chip else target.kind.name
    return _REPO_ROOT / "tuning_logs" / name


def default_work_dir(target: tvm.target.Target | str) -> Path:
    """``<target_dir>/groups``: candidate groups timed under our rules, a different question
    from meta-schedule's best schedule of a kernel, so a folder of its own."""
    return target_dir(target) / "groups"


def workload_hash(func: tvm.tirx.PrimFunc) -> str:
    """Structural hash of a group's unscheduled PrimFunc as a workload module (hex string)."""
    return f"{tvm_ffi.structural_hash(tvm.IRModule({'main': func})):016x}"


class GroupDatabase:
    """Append-only store of measured groups in ``work_dir``.

    Parameters
    ----------
    work_dir : str or Path
        Folder holding ``database_workload.json``, ``database_tuning_record.json`` (TVM's
        ``JSONDatabase`` reads them as they are) and ``features.jsonl``. Created if missing.
    """

    def __init__(self, work_dir: str | Path) -> None:
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._ms: ms.database.JSONDatabase | None = None
        self.features_path = self.work_dir / FEATURES_FILE
        self._rows = list(self._read_rows())
        self._hashes = {r["workload_hash"] for r in self._rows}
        self._keys = {(r["model"], tuple(r["members"])) for r in self._rows}

    # ------------------------------------------------------------------ reading
    def _read_rows(self) -> Iterator[dict]:
        if not self.features_path.exists():
            return
        with open(self.features_path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a kill: skip it
                    continue

    def rows(self) -> list[dict]:
        """Every features line, in the order written."""
        return list(self._rows)

    def has_workload(self, whash: str) -> bool:
        return whash in self._hashes

    def has_group(self, model: str, members: tuple[str, ...]) -> bool:
        return (model, tuple(members)) in self._keys

    def row_for_hash(self, whash: str, timed: bool = False) -> dict | None:
        """The first measured line of a workload (its run times); with ``timed``, the first
        that has run times (a CUDA kernel compiled without a GPU has none)."""
        return next((r for r in self._rows if r["workload_hash"] == whash and r["measured"]
                     and (r["run_secs"] or not timed)), None)

    def is_untimed(self, model: str, members: tuple[str, ...]) -> bool:
        """Whether every line of (model, group) was recorded without run times."""
        lines = [r for r in self._rows if r["model"] == model
                 and tuple(r["members"]) == tuple(members)]
        return bool(lines) and all(r.get("not_timed") for r in lines)

    @property
    def ms_database(self) -> ms.database.JSONDatabase:
        """TVM's view of the same folder (opened on first use)."""
        if self._ms is None:
            self._ms = ms.database.JSONDatabase(work_dir=str(self.work_dir))
        return self._ms

    # ------------------------------------------------------------------ writing
    def commit(
        self,
        func: tvm.tirx.PrimFunc,
        trace,
        run_secs: list[float],
        target: tvm.target.Target,
        row: dict,
    ) -> dict:
        """Commit one measured group: workload + TuningRecord, then its features line.

        ``row`` carries model, members, features, feature_names and error; the workload hash,
        target and run times are filled in here.
        """
        mod = tvm.IRModule({"main": func})
        db = self.ms_database
        workload = db.commit_workload(mod)
        args_info = ms.arg_info.ArgInfo.from_prim_func(func)
        # No run times (CUDA compiled without a GPU): a record without run_secs, as
        # meta-schedule keeps for candidates it never ran.
        db.commit_tuning_record(
            ms.database.TuningRecord(trace, workload,
                                     [float(s) for s in run_secs] if run_secs else None,
                                     target, args_info)
        )
        return self.append_row({**row, "run_secs": [float(s) for s in run_secs],
                                "target": str(target), "workload_hash": workload_hash(func),
                                "measured": True})

    def rewrite_rows(self, rows: list[dict]) -> None:
        """Replace the features log with ``rows`` (same order), atomically: a kill leaves the
        old file or the new one, never half of each. For re-deriving features after the
        schema grew; timings and the TVM database files are untouched."""
        tmp = self.features_path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as f:
            f.writelines(json.dumps(row, sort_keys=True) + "\n" for row in rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.features_path)
        self._rows = list(rows)

    def append_row(self, row: dict) -> dict:
        """Append one features line and push it to disk before returning."""
        with open(self.features_path, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._rows.append(row)
        self._hashes.add(row["workload_hash"])
        self._keys.add((row["model"], tuple(row["members"])))
        return row
