"""What the user typed, checked: each an argparse ``type=`` of the ``costfuse`` parser
(``cli_args``), so that a bad value is refused with one line before any work starts, and
:class:`UsageError` for what a command finds wrong only while it runs."""

from __future__ import annotations

import argparse
import importlib.util
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import models
from .config import INT_RANGES
from .records.database import headline

__all__ = ["UsageError", "budget", "compare_models", "config_int", "csv_choices", "existing_dir",
           "float_in", "int_at_least", "load_model", "model_spec", "one_model", "output_dir",
           "output_file", "plot_file", "rpc_tracker", "target_spec", "tune_model"]


class UsageError(Exception):
    """A user error a command finds only while it runs (a model file that does not load, a
    tuning folder another session holds): printed as one line, exit status 2."""


def model_spec(text: str) -> str:
    """argparse type of a model argument: a registry name or an existing model file."""
    if models.is_name(text):
        return text
    if text.endswith((".onnx", ".pt2")):
        if not Path(text).is_file():
            raise argparse.ArgumentTypeError(f"model file {text!r} does not exist")
        return text
    raise argparse.ArgumentTypeError(
        f"unknown model {text!r}; choose a name from `costfuse models` or an .onnx/.pt2 path")


def compare_models(text: str) -> list[str]:
    """Comma-separated model specs of ``compare``: ``all`` (the zoo), ``corpus``, what
    :func:`model_spec` takes,
    or ``package.module:function`` whose module can be found."""
    specs = [x for x in text.split(",") if x]
    for spec in specs:
        if spec in ("all", "corpus") or spec.endswith((".onnx", ".pt2")) or ":" not in spec:
            if spec not in ("all", "corpus"):
                model_spec(spec)
            continue
        module = spec.split(":", 1)[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise argparse.ArgumentTypeError(f"{spec!r}: no Python module {module!r}")
    if not specs:
        raise argparse.ArgumentTypeError("no model given")
    return specs


def tune_model(text: str) -> str:
    """argparse type of ``tune``'s models: what :func:`model_spec` takes, ``all`` (the zoo) or
    ``corpus``."""
    return text if text in ("all", "corpus") else model_spec(text)


def one_model(text: str) -> str:
    """argparse type of ``compile``'s model: what :func:`model_spec` takes, or
    ``package.module:function`` whose module can be found."""
    if text in ("all", "corpus") or "," in text:
        raise argparse.ArgumentTypeError(f"{text!r}: give one model")
    return compare_models(text)[0]


def target_spec(text: str) -> str:
    """argparse type of a target string: a preset name or a tvm target (``llvm -mcpu=...``,
    ``cuda -arch=sm_90``), checked by the resolver the pass itself uses."""
    from .targets import resolve

    try:
        resolve(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def csv_choices(choices) -> Callable[[str], object]:
    """argparse type of a comma-separated list whose items must be in ``choices``; an empty
    list or an unknown item is refused naming the valid choices."""
    valid = ", ".join(choices)

    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(
                f"empty list; give one or more of {valid} (comma-separated)")
        bad = [x for x in items if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, bad))}; choose from {valid} (comma-separated)")
        return items

    return parse


def int_at_least(lo: int) -> Callable[[str], object]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {value}")
        return value

    return parse


def budget(text: str) -> int | str:
    """argparse type of ``tune --budget``: a count of at least 1, or ``all``."""
    if text == "all":
        return text
    try:
        return int_at_least(1)(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err} (or all)") from None


def float_in(lo: float, hi: float = math.inf, *, open_lo: bool = False
             ) -> Callable[[str], object]:
    """argparse type of a number in [lo, hi], or (lo, hi] with ``open_lo``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not ((value > lo if open_lo else value >= lo) and value <= hi):
            raise argparse.ArgumentTypeError(
                f"must be in {'(' if open_lo else '['}{lo:g}, {hi:g}], got {text}")
        return value

    return parse


def config_int(field: str) -> Callable[[str], object]:
    """argparse type of a ``FusionConfig`` int: the range the config itself enforces."""
    lo, hi = INT_RANGES[field]

    def parse(text: str) -> int:
        value = int_at_least(lo)(text)
        if value > hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}], got {value}")
        return value

    return parse


def _writable_in(folder: Path) -> None:
    """Raise ArgumentTypeError unless a file can be created in ``folder`` (tried, not
    guessed from permission bits: root passes ``os.access`` on read-only mounts)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".costfuse-probe-"):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(
            f"cannot write in {folder}: {err.strerror or err}") from None


def output_dir(text: str) -> str:
    """argparse type of an output folder: an existing writable folder, or one that can be
    created under its nearest existing parent."""
    path = Path(text).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{existing} is not a folder")
    _writable_in(existing)
    return text


def existing_dir(text: str) -> str:
    """argparse type of a folder to read: it exists."""
    if not Path(text).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"folder {text} does not exist")
    return text


def output_file(text: str) -> str:
    """argparse type of an output file: its folder exists and is writable, and it is not a
    folder itself."""
    path = Path(text).expanduser().absolute()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"folder {path.parent} does not exist")
    _writable_in(path.parent)
    return text


def plot_file(text: str) -> str:
    """argparse type of a plot file: writable, with an image format matplotlib writes."""
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError("needs matplotlib (pip install 'tvm_costfuse[plot]')")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if Path(text).suffix.lstrip(".").lower() not in formats:
        raise argparse.ArgumentTypeError(
            f"{text}: not an image format matplotlib writes ({', '.join(sorted(formats))})")
    return output_file(text)


def rpc_tracker(text: str) -> str:
    """argparse type of ``--rpc-tracker``: HOST:PORT:KEY of a tracker that answers and has a
    server under KEY (checked now: otherwise every candidate would fail alike)."""
    from .tuning.runners import check_rpc_tracker  # tvm.rpc loads only when asked

    try:
        return check_rpc_tracker(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def load_model(spec: str, small: bool, loader=models.load):
    """``loader(spec, small=small)`` (``models.load``); a user's file or function that does
    not load is a UsageError (a registry model that does not load is a bug, and raises as it
    is)."""
    if spec in models.names():
        return loader(spec, small=small)
    try:
        return loader(spec, small=small)
    except Exception as err:
        raise UsageError(f"cannot load model {spec!r}: {type(err).__name__}: "
                         f"{headline(str(err))}") from err
