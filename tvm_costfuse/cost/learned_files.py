"""The learned model's files (``xgb_model.json``, ``.meta.json``, ``.points.npz``): written
atomically, and read back either whole or with an error naming the file and the fix."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["ModelFileError", "read_meta", "unreadable", "write_atomically"]


class ModelFileError(RuntimeError):
    """A saved learned-model file cannot be read; the message names it and the fix."""


def unreadable(path: Path, why: str) -> ModelFileError:
    return ModelFileError(
        f"learned-model file {path} is unreadable ({why}); delete the xgb_model.* files in "
        f"{path.parent} and retrain from its features.jsonl with `costfuse tune` (or "
        "`scripts/eval_cost_model.py train`)")


def read_meta(work_dir: Path) -> dict:
    path = work_dir / "xgb_model.meta.json"
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
