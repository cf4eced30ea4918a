"""The learned model's files (``xgb_model.json``, ``.meta.json``, ``.points.npz``): written
atomically, and read back either whole or with an error naming the file and the fix."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["ModelFileError", "other_host_model", "read_meta", "unreadable", "write_atomically"]


class ModelFileError(RuntimeError):
    """A saved learned-model file cannot be read; the message names it and the fix."""


def unreadable(path: Path, why: str) -> ModelFileError:
    return ModelFileError(
        f"learned-model file {path} is unreadable ({why}); delete the xgb_model.* files in "
        f"{path.parent} and retrain from its features.jsonl with `costfuse tune --retrain-only "
        f"--work-dir {path.parent}`")


META_FILE = "xgb_model.meta.json"


def read_meta(work_dir: Path) -> dict:
    path = work_dir / META_FILE
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise unreadable(path, f"{type(err).__name__}: {err}") from None
    if not isinstance(meta, dict) or not {"n_records", "lo", "hi", "models"} <= set(meta):
        raise unreadable(path, "not a model's meta record")
    return meta


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)``, renamed over ``path``: a kill leaves the old file or the new one (the
    temporary name keeps the suffix: XGBoost picks its format by it)."""
    tmp = path.with_name(f"{path.stem}.tmp{path.suffix}")
    write(tmp)
    os.replace(tmp, path)


def other_host_model(work_dir: Path, roots: tuple[Path, ...] = ()) -> Path | None:
    """The folder of another host's trained model of the same target kind as ``work_dir``
    (``tuning_logs/llvm-<cpu>/groups``), beside it or under one of ``roots`` (the shipped
    models): the one trained on the most records; None if none can be read.

    The trees learn a correction of the analytical model's log-time (its estimate is their
    base margin and an input), and the analytical model prices with the serving host's own
    description: the correction, not the other machine's absolute times, is what carries."""
    kind = work_dir.parent.name.split("-")[0]
    found = []
    metas = {m.resolve(): m for root in (work_dir.parent.parent, *roots)
             for m in sorted(Path(root).glob(f"{kind}-*/groups/{META_FILE}"))}
    for meta in metas.values():
        try:
            found.append((read_meta(meta.parent)["n_records"], meta.parent))
        except ModelFileError:
            continue
    return max(found, key=lambda f: f[0])[1] if found else None
