"""The host's calibration records: one per CPU and core count, in one JSON file, measured on
first use.

A plan priced with the conservative defaults can be far off on a given machine (the model's
kernel times were 1.9-3.1x off on an uncalibrated Intel host), and a user should not have to
know that ``costfuse calibrate`` exists. So the first time a process prices a plan for a CPU
and core count the file has no record of, :mod:`tvm_costfuse.measurement.calibrate` measures
it (its quick mode, a few seconds), says so once, and caches the record. A measurement taken
while other processes kept the machine busy is used by this process but not cached. Several
machines can share one home directory: records are keyed by LLVM CPU name, CPU model and core
count, so they do not overwrite each other.

``TVM_COSTFUSE_CALIBRATION`` names another file, or ``none`` for the documented defaults with
no measurement (the test suite sets it: results never depend on the machine's state).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from .cpu_id import host_cpu, host_cpu_model

_log = logging.getLogger(__name__)

CALIBRATION_PATH = Path(
    os.environ.get("TVM_COSTFUSE_CALIBRATION", "~/.cache/tvm_costfuse/host_calibration.json")
).expanduser()
# Other processes' cores during the measurement above which its record is not cached.
DISTURBED_CORES = 0.5

_measured: dict[tuple, dict] = {}  # this process' first-use measurements, cached or not


def _key(record: dict) -> str:
    return f"{record.get('cpu')}|{record.get('cpu_model')}|{record.get('num_cores')}"


def _records(path: Path) -> dict[str, dict]:
    """Every record in ``path`` by key; a file of one bare record (the old format) is one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    if not isinstance(data, dict):
        return {}
    if "figures" in data:
        return {_key(data): data}
    records = data.get("records", {})
    return {k: r for k, r in records.items() if isinstance(r, dict) and "figures" in r}


def _is_record_file(path: Path) -> bool:
    """Whether ``path`` holds what :func:`save_calibration` writes (``{"records": {key:
    record}}``, or one bare record, the old format): only such a file may be replaced."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(data, dict):
        return False
    if "records" not in data:  # the old format: one record, its CPU and its figures
        return "cpu" in data and isinstance(data.get("figures"), dict)
    records = data["records"]
    return (set(data) == {"records"} and isinstance(records, dict)
            and all(isinstance(r, dict) and "figures" in r for r in records.values()))


def refusal(path: Path) -> str | None:
    """Why a record must not be written to ``path``, or None when it may: a folder, or a file
    that is not a record file (one TVM_COSTFUSE_CALIBRATION names by mistake) is left alone."""
    if str(path) in ("", ".", "none"):
        return "TVM_COSTFUSE_CALIBRATION is empty or 'none': no record file is named"
    try:
        if path.is_dir():
            return "it is a folder, not a file"
        if (path.exists() or path.is_symlink()) and not _is_record_file(path):
            return "it is not a calibration record file, so it is left as it is"
    except OSError as err:
        return str(err)
    return None


def _write(record: dict, path: Path) -> Path:
    """Written to a temporary name and renamed, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    records = _records(path) | {_key(record): record}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"records": records}, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


_noticed: set[str] = set()  # notices given in this process: each once, not once per plan


def save_calibration(record: dict, path: str | os.PathLike | None = None) -> Path | None:
    """Add (or replace) ``record`` among the file's records (default :data:`CALIBRATION_PATH`);
    the path written, or None after one notice when it cannot or must not be written.

    First-use calibration saves through here: a read-only home, a folder or a stranger's file
    must cost one notice, not every plan, and the measured figures still price this process'
    plans (kept in memory, see :func:`calibrated_on_first_use`)."""
    target = Path(path).expanduser() if path else CALIBRATION_PATH
    why = refusal(target)
    if why is None:
        try:
            return _write(record, target)
        except (OSError, ValueError) as err:  # ValueError: a path with no file name
            why = str(err)
    notice = (f"calibration record not saved to {target} ({why}); its figures price this "
              "process' plans only. TVM_COSTFUSE_CALIBRATION names the record file, 'none' "
              "turns calibration off")
    if notice not in _noticed:
        _noticed.add(notice)
        _log.warning(notice)
    return None


def load_calibration(path: str | os.PathLike | None = None,
                     num_cores: int | None = None) -> dict | None:
    """The saved record measured on this CPU (LLVM name and model), with ``num_cores`` cores
    when given (else the one with the most cores); None when there is none."""
    path = Path(path).expanduser() if path else CALIBRATION_PATH
    if str(path) == "none" or not path.is_file():
        return None
    mine = [r for r in _records(path).values()
            if r.get("cpu") == host_cpu() and r.get("cpu_model") == host_cpu_model()
            and num_cores in (None, r.get("num_cores"))]
    return max(mine, key=lambda r: r.get("num_cores") or 0, default=None)


# How a record is measured on first use: ``measurement.calibrate`` registers its quick
# measurement here when it is imported (the package imports it), since targets sit below
# measurement. A function returning (record, other processes' cores meanwhile).
_measure: Callable[[int], tuple[dict, float]] | None = None


def measure_on_first_use(measure: Callable[[int], tuple[dict, float]]) -> None:
    global _measure
    _measure = measure


def calibrated_on_first_use(num_cores: int) -> dict | None:
    """The default file's record for this CPU and ``num_cores``, measured now if it has none
    (once per process); None when calibration is off (``TVM_COSTFUSE_CALIBRATION=none``)."""
    if str(CALIBRATION_PATH) == "none":
        return None
    record = load_calibration(CALIBRATION_PATH, num_cores)
    if record is not None:
        return record
    key = (host_cpu(), num_cores)
    if key not in _measured:
        if _measure is None:
            raise RuntimeError("no calibration measurement registered: import "
                               "tvm_costfuse (it registers measurement.calibrate's)")
        _log.warning("calibrating this host once (%s, %d cores: a few seconds) for the cost "
                     "model; cached in %s, `costfuse calibrate` measures it again",
                     host_cpu(), num_cores, CALIBRATION_PATH)
        record, others = _measure(num_cores)
        record["other_load_cores"] = others
        if others > DISTURBED_CORES:
            _log.warning("other processes kept %.1f cores busy while calibrating: the figures "
                         "price this process' plans but are not cached", others)
        else:
            save_calibration(record, CALIBRATION_PATH)
        _measured[key] = record
    return _measured[key]
