"""Keeping a tuning folder whole: one writer at a time, and repair of what a kill leaves behind.

- :func:`exclusive` -- an advisory ``fcntl.flock`` on ``<folder>/.lock``: one session writes,
  another waits or is refused (:class:`DatabaseLocked`, naming the holder). Only the holder
  repairs: a reader that truncated a line another session is still writing would destroy it.
  A reader never needs the lock (:func:`try_exclusive` yields False in a folder it may not
  write), so a read-only tuning folder still serves the cost models.
- :func:`repair_lines` -- a JSON-lines file (the features log) after a kill: a torn last line
  is cut off (a complete one missing only its newline is kept); a line where a torn record was
  glued to the next one keeps the complete record; anything else unreadable, or valid JSON
  that is not a record, is dropped. Each repair is one note naming the file and line.
- :func:`salvage_ms_database` -- meta-schedule's ``database_workload.json`` /
  ``database_tuning_record.json`` when TVM's ``JSONDatabase`` cannot load them: every line TVM
  accepts is kept (tuning records re-indexed onto the kept workloads; a record whose index
  points at the wrong workload, as two unlocked writers leave it, is re-attached to the one
  its trace replays on), the old files are kept as ``*.bak`` copies, and the new ones load.

A file is only ever replaced whole (written aside, fsynced, ``os.replace``), so a kill during a
repair leaves the old file or the new one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["LOCK_FILE", "DatabaseLocked", "exclusive", "repair_lines", "salvage_ms_database"]

_log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
# What opening the lock file raises in a folder this process may not write.
_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


class DatabaseLocked(RuntimeError):
    """Another session is writing to the folder (and the caller chose not to wait)."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return text or "another process"


@contextlib.contextmanager
def exclusive(work_dir: Path, wait: bool = False,
              log: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the folder's write lock for the ``with`` body.

    ``wait``: block until the holder finishes (saying so through ``log``); otherwise raise
    :class:`DatabaseLocked` at once. The lock file records who holds it (pid, host, start
    time); the lock itself is the kernel's, released when the process dies however it dies.
    """
    path = Path(work_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(path)
            if not wait:
                raise DatabaseLocked(
                    f"{work_dir} is being written by {holder}; wait for it to finish (tune "
                    "--wait), or use another --work-dir") from None
            (log or _log.warning)(f"waiting for {holder} to finish writing {work_dir}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (f"pid {os.getpid()} on {socket.gethostname()} since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n").encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def try_exclusive(work_dir: Path) -> contextlib.AbstractContextManager[bool]:
    """The write lock if it is free now: yields whether it was taken. Also False when the
    folder cannot be written at all (a read-only mount, an installed package, another user's
    checkout): the caller only wanted to repair in passing, and a reader must not fail because
    it may not write."""

    @contextlib.contextmanager
    def attempt() -> Iterator[bool]:
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(exclusive(work_dir, wait=False))
            except DatabaseLocked:
                yield False
                return
            except OSError as err:
                if err.errno not in _UNWRITABLE:
                    raise
                _log.debug("%s is not writable (%s): read as it is", work_dir, err.strerror)
                yield False
                return
            yield True

    return attempt()


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S")


def _replace(path: Path, data: bytes, backup: bool) -> Path | None:
    """Write ``data`` over ``path`` atomically, first copying the old file to a ``.bak``."""
    kept = None
    if backup and path.exists():
        kept = path.with_name(f"{path.name}.{_stamp()}.bak")
        kept.write_bytes(path.read_bytes())
    tmp = path.with_name(f"{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return kept


def _parse(line: bytes):
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return value


def _glued_record(line: bytes) -> bytes | None:
    """The complete JSON object at the end of a line that starts with a torn one (the next
    append was written after the cut): the longest parseable suffix starting at ``{``."""
    start = line.find(b"{", 1)
    while start != -1:
        if isinstance(_parse(line[start:]), dict):
            return line[start:]
        start = line.find(b"{", start + 1)
    return None


def repair_lines(path: Path, is_record: Callable[[object], bool] | None = None) -> list[str]:
    """Repair a JSON-lines file in place after a kill; returns one note per repaired line
    (none: the file was whole and is untouched). ``is_record``: which parsed lines are
    records; a line of valid JSON that is not one (``[]``, ``42``, a hand edit) is dropped
    like a garbled one, kept in the backup. Call it holding the folder's lock."""
    if not path.exists():
        return []

    def whole(line: bytes) -> bool:
        value = _parse(line)
        return value is not None and (is_record is None or is_record(value))

    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    notes: list[str] = []
    kept: list[bytes] = []
    rewrite = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            rewrite |= bool(line)
            continue
        if whole(line):
            kept.append(line)
            continue
        rewrite = True
        glued = _glued_record(line)
        if glued is not None and whole(glued):
            kept.append(glued)
            notes.append(f"{path} line {number}: a record cut short by a kill, with the next "
                         f"one written after it: kept the complete one, dropped "
                         f"{len(line) - len(glued)} bytes")
        elif _parse(line) is not None:
            notes.append(f"{path} line {number}: JSON but not a record ({line[:40]!r}): "
                         "dropped")
        else:
            notes.append(f"{path} line {number}: not a JSON record ({line[:40]!r}...): dropped")
    if tail:
        number = len(lines) + 1
        if whole(tail):
            kept.append(tail)
            notes.append(f"{path} line {number}: complete but without its newline: kept")
            if not rewrite:
                with open(path, "ab") as f:
                    f.write(b"\n")
                return notes
        elif (glued := _glued_record(tail)) is not None and whole(glued):
            kept.append(glued)
            rewrite = True
            notes.append(f"{path} line {number}: a torn record glued to a complete one: kept "
                         f"the complete one")
        elif _parse(tail) is not None:
            rewrite = True
            notes.append(f"{path} line {number}: JSON but not a record ({tail[:40]!r}): "
                         "dropped")
        elif not rewrite:
            # Only the last line is torn: cut it off where it starts.
            os.truncate(path, len(data) - len(tail))
            notes.append(f"{path} line {number}: cut short by a kill ({len(tail)} bytes): "
                         "removed")
            return notes
        else:
            notes.append(f"{path} line {number}: cut short by a kill ({len(tail)} bytes): "
                         "removed")
    if rewrite:
        backup = _replace(path, b"".join(line + b"\n" for line in kept),
                          backup=any("dropped" in n for n in notes))
        if backup is not None:
            notes.append(f"{path}: the file before repair is kept as {backup.name}")
    return notes


# ----------------------------------------------------------------------- meta-schedule files
def _headline(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"


def _json_lines(path: Path) -> list[tuple[int, bytes]]:
    if not path.exists():
        return []
    return [(i, ln) for i, ln in enumerate(path.read_bytes().split(b"\n"), 1) if ln.strip()]


def _args_of(workload) -> list:
    from tvm.s_tir import meta_schedule as ms

    return [["TENSOR", str(a.dtype), [int(d) for d in a.shape]]
            for a in ms.arg_info.ArgInfo.from_prim_func(workload.mod["main"])]


def salvage_ms_database(work_dir: Path) -> list[str]:
    """Make TVM's ``JSONDatabase`` load ``work_dir`` again, keeping every valid record;
    returns one note per dropped or moved line (none: TVM loaded the folder as it was).
    Call it holding the folder's lock."""
    from tvm.s_tir import meta_schedule as ms

    work_dir = Path(work_dir)
    wpath, rpath = work_dir / WORKLOAD_FILE, work_dir / RECORD_FILE
    if not wpath.exists() and not rpath.exists():
        return []
    try:
        ms.database.JSONDatabase(work_dir=str(work_dir))
        return []
    except Exception as err:  # noqa: BLE001 -- TVM names no file or line: find them
        notes = [f"{work_dir}: TVM's JSONDatabase could not load it ({_headline(err)})"]
    workloads = []  # (line number, line, Workload)
    for number, line in _json_lines(wpath):
        try:
            workloads.append((number, line, ms.database.Workload.from_json(json.loads(line))))
        except Exception as err:  # noqa: BLE001
            notes.append(f"{wpath} line {number}: {_headline(err)}: dropped")
    by_index = {i: w for i, (_, _, w) in enumerate(workloads)}
    # TVM numbers workloads by their position among the file's lines, bad ones included.
    old_index = {k: i for i, (k, _) in enumerate(_json_lines(wpath))}
    kept_at = {old_index[n]: i for i, (n, _, _) in enumerate(workloads)}
    records: list[bytes] = []
    claimed: set[int] = set()
    for number, line in _json_lines(rpath):
        try:
            index, record = json.loads(line)
        except Exception as err:  # noqa: BLE001
            notes.append(f"{rpath} line {number}: {_headline(err)}: dropped")
            continue
        own = kept_at.get(index)
        # Its own workload first, then (a record misfiled by an unlocked writer) the others,
        # unclaimed ones first.
        order = ([own] if own is not None else [])
        order += [i for i in by_index if i != own and i not in claimed]
        order += [i for i in by_index if i != own and i in claimed]
        found = None
        for i in order:
            # A trace may replay on another kernel of the same loop structure: the argument
            # shapes must match as well.
            if len(record) > 3 and _args_of(by_index[i]) != record[3]:
                continue
            try:
                ms.database.TuningRecord.from_json(record, by_index[i])
            except Exception:  # noqa: BLE001, S112 -- not this workload's trace
                continue
            found = i
            break
        if found is None:
            notes.append(f"{rpath} line {number}: replays on no kept workload: dropped")
            continue
        if found != own:
            notes.append(f"{rpath} line {number}: pointed at workload {index}, replays on "
                         f"{wpath.name} line {workloads[found][0]}: re-attached")
        claimed.add(found)
        records.append(json.dumps([found, record]).encode())
    for path, data in ((wpath, b"".join(ln + b"\n" for _, ln, _ in workloads)),
                       (rpath, b"".join(r + b"\n" for r in records))):
        backup = _replace(path, data, backup=True)
        if backup is not None:
            notes.append(f"{path}: the file before salvage is kept as {backup.name}")
    ms.database.JSONDatabase(work_dir=str(work_dir))  # raises if the salvage failed
    return notes
