"""Measured fusion groups on disk: a meta-schedule ``JSONDatabase`` plus their group features.

Each measured group is one meta-schedule workload (its PrimFunc, unscheduled, as
``IRModule({"main": func})``) and one ``TuningRecord`` whose trace is the schedule our CPU rules
(or, on CUDA, dlight's GPU rules) applied (replayable by ``MetaScheduleApplyDatabase``) and whose ``run_secs`` are the measured
times (``[1e10]`` for a failed build or run, as meta-schedule records failures). Beside the
database, ``features.jsonl`` holds one line per (model, group): the workload's structural hash,
the group's ``GroupFeatures`` vector, the run times and any error. That file is what the learned
model trains on and what makes a session resumable: a workload hash found there is never measured
again.

Both files are append-only and written line by line (one ``write`` per record, fsynced), so a
session killed mid-way loses at most the record being measured. If a kill falls between the
database commit and the features line, the group is measured again next time and the database
keeps a second record of the same workload (harmless: meta-schedule keeps the best).

One session writes at a time (:meth:`GroupDatabase.writing`, an advisory lock; ``integrity``),
and the writer repairs what a kill left (a torn features line, meta-schedule files TVM cannot
load) before it appends. Reading takes no lock and writes nothing (a read-only checkout or an
installed package still serves the cost models); only a reader that finds damage, in a folder
it may write and no one else is writing, repairs it in passing. A line that is valid JSON but
not a record (``[]``, ``42``, a hand edit) is skipped with one warning naming its file and
line, and the next writer drops it (kept in a backup). The log holds one row per (model,
group): a later row of a group supersedes the earlier one (a group re-measured after an
environmental failure, or timed on a GPU after it was compiled without one), and the writer
compacts superseded rows away.

A failed measurement is the kernel's (``build:`` / ``run:`` errors: recorded, not retried) or
the environment's (a timeout, a lost worker, an RPC failure: logged with its full error text,
kept out of TVM's database and measured again next session); :func:`failure_kind` tells them
apart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from .integrity import DatabaseLocked, exclusive, repair_lines, salvage_ms_database, try_exclusive

__all__ = ["FAILED_RUN_SECS", "FEATURES_FILE", "SHIPPED_LOGS", "DatabaseLocked",
           "GroupDatabase", "default_work_dir", "failure_kind", "headline", "is_record", "symbolic_dims",
           "target_dir", "target_key", "tuning_root", "workload_hash"]

_log = logging.getLogger(__name__)

# meta-schedule's run time for a candidate that failed to build or run.
FAILED_RUN_SECS = 1e10
FEATURES_FILE = "features.jsonl"
# The folder holding the package: the source checkout, or site-packages once installed.
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]
_INSTALLED_LOGS = Path(__file__).resolve().parents[1] / "tuning_logs"
#: The committed measurements and learned models: the checkout's tuning_logs/, or the models
#: a wheel installs inside the package (tvm_costfuse/tuning_logs/; no measurements).
SHIPPED_LOGS = _INSTALLED_LOGS if _INSTALLED_LOGS.is_dir() else _PACKAGE_PARENT / "tuning_logs"


def tuning_root() -> Path:
    """Where tuning folders are written and read first: ``TVM_COSTFUSE_TUNING_DIR`` when set;
    the checkout's ``tuning_logs/`` when the package runs from a source checkout (a
    ``pyproject.toml`` beside it); otherwise ``~/.cache/tvm_costfuse/tuning_logs``: an
    installed package's folder is not the user's to write (it may be read-only, and an
    upgrade replaces it). The shipped models still serve from :data:`SHIPPED_LOGS`."""
    env = os.environ.get("TVM_COSTFUSE_TUNING_DIR")
    if env:
        return Path(env).expanduser()
    if (_PACKAGE_PARENT / "pyproject.toml").is_file():
        return SHIPPED_LOGS
    return Path("~/.cache/tvm_costfuse/tuning_logs").expanduser()


def target_key(target) -> str:
    """``<kind>-<chip>``: the CPU model for llvm (``llvm-znver4``), the architecture for cuda
    (``cuda-sm_90``; GPUs of one architecture, such as H100 and H200, share it). ``target``: a
    ``tvm.target.Target`` (or its dict / string form), or anything with a ``key`` (a
    ``TargetDesc`` names itself)."""
    if hasattr(target, "key"):
        return target.key
    target = tvm.target.Target(target)
    attrs = target.attrs if target.attrs is not None else {}
    chip = attrs.get("arch", "") if target.kind.name == "cuda" else attrs.get("mcpu", "")
    return f"{target.kind.name}-{chip}" if chip else target.kind.name


def target_dir(target) -> Path:
    """``<tuning_root>/<target_key>``: meta-schedule tunes whole-model kernels into it."""
    return tuning_root() / target_key(target)


def default_work_dir(target) -> Path:
    """``<target_dir>/groups``: candidate groups timed under our rules, a different question
    from meta-schedule's best schedule of a kernel, so a folder of its own."""
    return target_dir(target) / "groups"


def headline(error: str) -> str:
    """The line of an error text that says what happened: its last non-empty line (a worker's
    error is a whole traceback, whose first line says nothing)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# The runners prefix what the kernel itself caused: its build or its run failed.
_KERNEL_FAILURE = re.compile(r"^(?:[\w.]+: )?(?:build|run): ")


def failure_kind(error: str | None) -> str | None:
    """None (no error), ``"kernel"`` (the kernel failed to build or run: a measured outcome)
    or ``"environment"`` (anything else -- a timeout, a worker that died, an RPC server that
    went away: not the kernel's fault, so measured again)."""
    if not error:
        return None
    return "kernel" if _KERNEL_FAILURE.match(headline(error)) else "environment"


def _environmental(row: dict) -> bool:
    kind = row.get("failure", failure_kind(row.get("error")))
    return kind == "environment"


def _key(row: dict) -> tuple[str, tuple[str, ...]]:
    return row["model"], tuple(row["members"])


# What every row carries and every reader indexes by: a line without them is not a record.
_RECORD_FIELDS = {"model": str, "members": list, "workload_hash": str, "run_secs": list}


def is_record(value: object) -> bool:
    """Whether a parsed features line is a row the readers can use: valid JSON alone (``[]``,
    ``{"x": 1}``, ``42``) would crash them on the first key they look up."""
    return (isinstance(value, dict)
            and all(isinstance(value.get(k), t) for k, t in _RECORD_FIELDS.items())
            and all(isinstance(m, str) for m in value["members"]))


def symbolic_dims(func: tvm.tirx.PrimFunc) -> list[str]:
    """The shape variables a kernel's parameters depend on (``n`` of a ``(n * 5, 16)``
    buffer, or passed as a scalar), by name: meta-schedule records a kernel's arguments with
    static shapes only (``ArgInfo``), and a random input for a symbolic shape has no size."""
    dims: list[str] = []
    for param in func.params:
        shape = getattr(param.ty, "shape", None)  # a buffer parameter's BufferType
        if shape is None:  # a scalar: a shape variable passed in
            dims.append(param.name)
            continue
        for d in shape:
            if not isinstance(d, tvm.tirx.IntImm):
                dims += [v.name for v in tvm.tirx.analysis.undefined_vars(d, [])]
    return list(dict.fromkeys(dims))


def workload_hash(func: tvm.tirx.PrimFunc) -> str:
    """Structural hash of a group's unscheduled PrimFunc as a workload module (hex string)."""
    return f"{tvm_ffi.structural_hash(tvm.IRModule({'main': func})):016x}"


class GroupDatabase:
    """Append-only store of measured groups in ``work_dir``.

    Parameters
    ----------
    work_dir : str or Path
        Folder holding ``database_workload.json``, ``database_tuning_record.json`` (TVM's
        ``JSONDatabase`` reads them as they are) and ``features.jsonl``. Created on the first
        write: opening reads only.
    """

    def __init__(self, work_dir: str | Path) -> None:
        self.work_dir = Path(work_dir)
        self._ms: ms.database.JSONDatabase | None = None
        self.features_path = self.work_dir / FEATURES_FILE
        self.repairs: list[str] = []  # what opening repaired, one line each
        self._writing = False
        self._skipped: list[tuple[int, bytes]] = []  # (line number, line): JSON, not a record
        # The lock only when there is something to repair (a clean read creates no file), and
        # only if it is free (nobody appending: a torn last line is a kill's, not a write's)
        # and the folder writable (else read as it is).
        if self._load_rows():
            with try_exclusive(self.work_dir) as free:
                if free:
                    self._writing = True
                    try:
                        self._repair_features()
                    finally:
                        self._writing = False
        if self._skipped:
            _log.warning("%s: skipped %d line(s) of valid JSON that are not records (%s); "
                         "the next `costfuse tune` here drops them", self.features_path,
                         len(self._skipped), ", ".join(f"line {n}: {line[:40]!r}"
                                                       for n, line in self._skipped))

    # ------------------------------------------------------------------ reading
    def _read_rows(self) -> tuple[list[dict], bool]:
        """(the records, whether a line needs repair: torn, not a record, no newline)."""
        self._skipped = []
        if not self.features_path.exists():
            return [], False
        rows, damaged = [], False
        with open(self.features_path, "rb") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                damaged |= not line.endswith(b"\n")
                try:
                    value = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    # A kill's torn line, or one another session is writing right now.
                    damaged = True
                    continue
                if is_record(value):
                    rows.append(value)
                else:
                    self._skipped.append((number, line.rstrip(b"\n")))
        return rows, damaged or bool(self._skipped)

    def _load_rows(self) -> bool:
        """Read the log; returns whether something in it wants repair (a damaged line, or
        rows a later one supersedes)."""
        rows, damaged = self._read_rows()
        self._index(rows)
        return damaged or len(self._lines) != len(self._current)

    def _index(self, lines: list[dict]) -> None:
        self._lines = lines
        self._current: dict[tuple, dict] = {}
        for row in lines:  # a later row of a group supersedes, in the first one's place
            self._current[_key(row)] = row
        self._hashes = {r["workload_hash"] for r in self._current.values()
                        if not _environmental(r)}

    def _note(self, notes: list[str]) -> None:
        for note in notes:
            _log.warning("tuning database repaired: %s", note)
        self.repairs += notes

    def _repair_features(self) -> None:
        """Torn lines and lines that are not records, then superseded rows (holding the
        lock)."""
        self._note(repair_lines(self.features_path, is_record))
        self._load_rows()
        if len(self._lines) == len(self._current):
            return
        dropped = [r for r in self._lines if self._current[_key(r)] is not r]
        # A superseded measurement (two unlocked sessions measured one group) is kept in a
        # backup; superseded environmental failures and untimed rows are not worth one.
        keep_copy = any(r.get("measured") and r.get("run_secs") for r in dropped)
        if keep_copy:
            backup = self.features_path.with_name(f"{FEATURES_FILE}.superseded.bak")
            with open(backup, "a") as f:
                f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in dropped)
        self.rewrite_rows(list(self._current.values()))
        self._note([f"{self.features_path}: {len(dropped)} superseded rows compacted"
                    + (f" (kept in {FEATURES_FILE}.superseded.bak)" if keep_copy else "")])

    def rows(self) -> list[dict]:
        """One row per (model, group), the latest, in the order groups were first written."""
        return list(self._current.values())

    def has_workload(self, whash: str) -> bool:
        return whash in self._hashes

    def has_group(self, model: str, members: tuple[str, ...], kernels: str | None = None
                  ) -> bool:
        """Whether the group has a record: a measurement, or a failure of the kernel (a
        failure of the environment does not count: it is measured again); with ``kernels``,
        one stamped with that kernel version (``versions.kernel_version``)."""
        row = self._current.get((model, tuple(members)))
        return (row is not None and not _environmental(row)
                and (kernels is None or row.get("kernels") == kernels))

    def row_for_hash(self, whash: str, timed: bool = False, kernels: str | None = None
                     ) -> dict | None:
        """The first measured row of a workload (its run times); with ``timed``, the first
        that has run times (a CUDA kernel compiled without a GPU has none); with ``kernels``,
        the first stamped with that kernel version."""
        return next((r for r in self._current.values() if r["workload_hash"] == whash
                     and r.get("measured") and (r["run_secs"] or not timed)
                     and (kernels is None or r.get("kernels") == kernels)), None)

    def is_untimed(self, model: str, members: tuple[str, ...]) -> bool:
        """Whether the group was recorded without run times."""
        row = self._current.get((model, tuple(members)))
        return bool(row and row.get("not_timed"))

    @contextlib.contextmanager
    def writing(self, wait: bool = False, log: Callable[[str], None] | None = None,
                salvage: bool = True) -> Iterator[GroupDatabase]:
        """Hold the folder's write lock: repair what a killed session left, re-read what
        another session wrote, and append. ``wait``: wait for another writer instead of
        raising :class:`DatabaseLocked`; ``salvage``: check that TVM loads its files (reads
        them all) and salvage them if not. Re-entrant."""
        if self._writing:
            yield self
            return
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with exclusive(self.work_dir, wait, log):
            self._writing = True
            try:
                self._repair_features()
                if salvage:
                    self._note(salvage_ms_database(self.work_dir))
                self._ms = None  # opened afresh under the lock
                yield self
            finally:
                self._writing = False
                self._ms = None

    @property
    def ms_database(self) -> ms.database.JSONDatabase:
        """TVM's view of the same folder (opened on first use)."""
        if self._ms is None:
            self.work_dir.mkdir(parents=True, exist_ok=True)  # TVM creates missing files in it
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
        target and run times are filled in here. Everything that can refuse the kernel (a
        symbolic shape: ``ValueError``) does so before the workload is written, so the
        workload file never gains a line without its record.
        """
        dims = symbolic_dims(func)
        if dims:
            raise ValueError(f"kernel with symbolic shapes ({', '.join(dims)}): meta-schedule "
                             "records static shapes only")
        if not self._writing:
            with self.writing(wait=True):
                return self.commit(func, trace, run_secs, target, row)
        mod = tvm.IRModule({"main": func})
        # The record's parts first: what refuses the kernel raises before either file grows.
        args_info = ms.arg_info.ArgInfo.from_prim_func(func)
        # No run times (CUDA compiled without a GPU): a record without run_secs, as
        # meta-schedule keeps for candidates it never ran.
        secs = [float(s) for s in run_secs] if run_secs else None
        db = self.ms_database
        workload = db.commit_workload(mod)
        db.commit_tuning_record(
            ms.database.TuningRecord(trace, workload, secs, target, args_info))
        return self.append_row({**row, "run_secs": [float(s) for s in run_secs],
                                "target": str(target), "workload_hash": workload_hash(func),
                                "measured": True})

    def rewrite_rows(self, rows: list[dict]) -> None:
        """Replace the features log with ``rows`` (same order), atomically: a kill leaves the
        old file or the new one, never half of each. For re-deriving features after the
        schema grew; timings and the TVM database files are untouched."""
        if not self._writing:
            with self.writing(wait=True, salvage=False):
                return self.rewrite_rows(rows)
        tmp = self.features_path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as f:
            f.writelines(json.dumps(row, sort_keys=True) + "\n" for row in rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.features_path)
        self._index(list(rows))
        return None

    def append_row(self, row: dict) -> dict:
        """Append one features line (one ``write`` call: a kill leaves all of it or a torn
        tail that the next writer cuts off) and push it to disk before returning."""
        if not self._writing:
            with self.writing(wait=True, salvage=False):
                return self.append_row(row)
        data = (json.dumps(row, sort_keys=True) + "\n").encode()
        fd = os.open(self.features_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        self._lines.append(row)
        self._current[_key(row)] = row
        if not _environmental(row):
            self._hashes.add(row["workload_hash"])
        return row
