"""The ``costfuse`` commands that write and read ``tuning_logs/``: ``tune`` measures labels,
``evaluate`` scores the cost models on them, ``refeature`` and ``restamp`` keep stored rows
current after the features or the kernel code changed. ``cli.py`` dispatches to them."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from . import models
from .cli_args import check_tune
from .cli_types import UsageError, load_model
from .pipelines import prepare
from .records.integrity import exclusive
from .targets import resolve


def cmd_tune(args: argparse.Namespace) -> int:
    """Measure one kind of label (``tuning.labels``) for each model variant asked for, most
    consequential first (the greedy planner weighs merges in order of predicted gain); after
    candidate groups, retrain the learned model and re-plan each model with it."""
    from .records.database import FEATURES_FILE, default_work_dir
    from .tuning import labels

    check_tune(args)
    resolved = resolve(args.target)  # a GPU preset: CUDA kernels, ptxas always, timed on a GPU
    work_dir = Path(args.work_dir or default_work_dir(resolved.tvm))
    if args.retrain_only and not (work_dir / FEATURES_FILE).is_file():
        raise UsageError(f"no measured groups in {work_dir} to retrain on")
    if not args.wait:  # refuse a held folder before building anything (measuring re-checks)
        work_dir.mkdir(parents=True, exist_ok=True)
        with exclusive(work_dir):
            pass
    kind = args.labels
    given = {} if args.budget is None else {
        "budget": None if args.budget == "all" else args.budget}
    if args.repeat:
        given["repeat"] = args.repeat
    opts = labels.LabelOptions.of(
        kind, min_repeat_ms=args.min_repeat_ms, timeout_s=args.timeout,
        processes=args.processes or 1, rpc_tracker=args.rpc_tracker, wait=args.wait, **given)
    prepared = {}
    for spec, small in labels.variants(args.models, args.size, args.synthetic):
        mod, inputs = load_model(spec, small)
        name = models.variant_name(spec, small)  # as the rows record it
        if args.retrain_only:
            prepared[name] = prepare(mod, resolved.tvm)
            continue
        with _progress(f"tune {name}", opts.budget, kind) as log:
            done = labels.LABELLERS[kind](name, mod, inputs, resolved, work_dir, opts, log)
        for note in done.repairs:
            print(f"repaired: {note}", file=sys.stderr)
        print(done.line, flush=True)
        prepared[name] = done.prepared
    if kind == "groups":
        print("\n".join(labels.retrain(work_dir, resolved, prepared)))
    return 0


@contextlib.contextmanager
def _progress(title: str, total: int | None, kind: str):
    """A progress bar over ``total`` groups or decisions, one a call of the log it yields (a
    line each when tqdm is missing: progress is a convenience)."""
    try:
        from tqdm import tqdm
    except ImportError:
        yield lambda line: print(line, flush=True)
        return
    unit = "group" if kind == "groups" else "decision"
    with tqdm(total=total, desc=title, unit=unit) as bar:
        def log(line: str) -> None:
            bar.update(1)
            bar.set_postfix_str(line.strip()[-60:])

        yield log


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Leave one unit out and score the cost models on its labels (``report.evaluate``)."""
    from .records.database import FEATURES_FILE, default_work_dir
    from .report.evaluate import EvalOptions, evaluate

    target = resolve("host")
    work_dir = Path(args.work_dir or default_work_dir(target.tvm))
    if not (work_dir / FEATURES_FILE).is_file():
        raise UsageError(f"no measured groups in {work_dir}: `costfuse tune` measures them")
    opts = EvalOptions(by=args.by, seeds=args.seeds, margin=args.margin,
                       min_records=args.min_records, train_side_by_side=args.train_side_by_side,
                       train_synthetic=args.train_synthetic)
    evaluate(work_dir, target.desc, opts, out=lambda line: print(line, flush=True))
    return 0


def cmd_refeature(args: argparse.Namespace) -> int:
    from .tuning.feedback import refeature

    rows, n_models, missing = refeature(args.work_dir, args.target)
    print(f"recomputed the features of {rows} rows of {n_models} models")
    for model, why in missing.items():
        print(f"kept the rows of {model} as they were ({why})", file=sys.stderr)
    return 0


def cmd_restamp(args: argparse.Namespace) -> int:
    from .records.database import FEATURES_FILE, default_work_dir
    from .tuning.restamp import restamp

    work_dir = Path(args.work_dir or default_work_dir(resolve(args.target).tvm))
    if not (work_dir / FEATURES_FILE).is_file():
        raise UsageError(f"no measured groups in {work_dir} to restamp")
    summary = restamp(work_dir, args.target,
                      log=lambda line: print(line, file=sys.stderr, flush=True))
    print(summary.line())
    for model, why in summary.missing.items():
        print(f"left the rows of {model} stale ({why})", file=sys.stderr)
    return 0
