"""The ``costfuse`` command: cost-model-driven operator fusion for TVM, from the shell.

Its parser is in ``cli_args``, the checks of each value in ``cli_types``, the commands on
``tuning_logs/`` in ``cli_tune``; here are the others. ``demo`` is the README's main job: it
compiles a zoo model under several fusion strategies, checks that they compute the same thing,
and prints kernels launched and measured latency side by side (one process, one machine state:
ratios, not absolute numbers, are the claim).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import tvm

from . import models
from .cli_args import DEMO_MODELS, DEMO_NOTES, build_parser
from .cli_tune import cmd_evaluate, cmd_refeature, cmd_restamp, cmd_tune
from .cli_types import UsageError, load_model
from .cost.learned import ModelFileError
from .graph import build_graph
from .measurement.timing import assert_close, interleaved_medians, run
from .partition import fuseops_groups
from .pipelines import prepare
from .records.database import headline
from .records.integrity import DatabaseLocked
from .strategies import STRATEGIES, strategy_pipeline, tir_pipeline
from .targets import host_target


def cmd_demo(args: argparse.Namespace) -> int:
    """``--model``'s model, or each demo model in turn, with a blank line between them."""
    specs = [args.model] if args.model else list(DEMO_MODELS)
    for i, spec in enumerate(specs):
        if i:
            print()
        _demo(spec, args.small, args.repeat)
    return 0


def _demo(spec: str, small: bool, repeat: int) -> None:
    """One model under every strategy: kernels, compile time, latency, the decisions."""
    mod, inputs = load_model(spec, small)
    target = host_target()
    print(f"model {spec}{' (small)' if small else ''}, target {target}")
    if spec in DEMO_NOTES and not small:  # the notes' shapes are the full ones
        print(f"  {DEMO_NOTES[spec]}")
    executables, compile_s, kernels = {}, {}, {}
    for name in STRATEGIES:
        start = time.perf_counter()
        executables[name] = tvm.compile(mod, target, relax_pipeline=strategy_pipeline(name, target),
                                        tir_pipeline=tir_pipeline(name))
        compile_s[name] = time.perf_counter() - start
    reference = run(executables["none"], inputs)
    for name, ex in executables.items():
        calls: list[str] = []
        assert_close(run(ex, inputs, calls=calls), reference)  # raises, naming the output
        kernels[name] = len(calls)
    seconds = interleaved_medians(executables, inputs, repeat=repeat)
    print("stock = TVM's relax.get_default_pipeline (FuseOps, no schedules); the others share "
          "our CPU schedules and differ in fusion only (CostFuse's sibling matmuls included)")
    print(f"{'strategy':<9} {'kernels':>7} {'compile s':>10} {'latency ms':>11} {'vs tvm':>7}")
    for name in STRATEGIES:
        print(f"{name:<9} {kernels[name]:>7} {compile_s[name]:>10.2f} "
              f"{seconds[name] * 1e3:>11.3f} {seconds['tvm'] / seconds[name]:>6.2f}x")
    print("numerics: every strategy matches no fusion (rtol 1e-4, atol 1e-5)")
    from .report.decided import summary

    print("\n".join(summary(mod, target, seconds["tvm"] / seconds["costfuse"])))


def cmd_compile(args: argparse.Namespace) -> int:
    """``tvmc compile``'s job with CostFuse's fusion: one library, the plan beside it."""
    from .export import check_request, compile_model, parse_config
    from .measurement.timing import SCALED_TOLERANCE as TOLERANCE

    try:
        config = parse_config(args.config)
        check_request(args.strategy, config, args.report, args.target, args.verify)
    except ValueError as err:
        raise UsageError(str(err)) from err
    mod, inputs = load_model(args.model, small=False)
    summary = compile_model(mod, args.output, target=args.target, strategy=args.strategy,
                            config=config, report=args.report, inputs=inputs,
                            verify=args.verify, name=args.model)
    print(f"wrote {summary['output']} ({summary['strategy']}, target {summary['target']}"
          + (f", {summary['kernels']} kernels" if "kernels" in summary else "") + ")")
    if "kernels" not in summary:
        print("not run here (the target is not this CPU): no kernel count", file=sys.stderr)
    if "max_error" in summary:
        print(f"largest relative error against no fusion: {summary['max_error']:.2e}")
        if summary["max_error"] > TOLERANCE:
            print(f"costfuse compile: the library differs from no fusion by more than "
                  f"{TOLERANCE:g} of the output's scale", file=sys.stderr)
            return 1
    if "report" in summary:
        print(f"wrote the plan to {summary['report']}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Our strategies next to the peers at equal threads: one table, busy rows marked; a
    progress bar over the (model, threads) rows on stderr, and a plot on request."""
    import tempfile

    from .report.bench import bench, table, workload

    ours = [s for s in args.strategies if s.startswith("costfuse")]
    if args.plot and not ours:
        raise UsageError("--plot draws a costfuse strategy's speedups: add one to --strategies")
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a convenience: plain lines then
        tqdm = None
    per_model = len(args.threads)
    bar = (tqdm(total=len(args.models) * per_model, unit="row", desc="bench",
                dynamic_ncols=True) if tqdm else None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, spec in enumerate(args.models):
            if bar is not None:
                bar.set_description(f"bench {spec}")
            else:
                print(f"[{i + 1}/{len(args.models)}] {spec}: building and timing "
                      f"{len(args.strategies)} strategies and {len(args.peers)} peers at "
                      f"{', '.join(map(str, args.threads))} thread(s)", file=sys.stderr,
                      flush=True)
            w = load_model(spec, args.small, workload)
            try:  # a model that fails is a row saying so; the rows timed so far are kept
                rows.append(bench(w, args.threads, args.repeat, tmp, tuple(args.strategies),
                                  tuple(args.peers), (lambda _t: bar.update(1)) if bar else None,
                                  args.huge_pages))
            except Exception as err:  # noqa: BLE001 -- reported in the table
                rows.append({"model": spec,
                             "error": f"{type(err).__name__}: {headline(str(err))}"[:200]})
            if bar is not None:  # a failed model's thread counts count as done
                bar.update((i + 1) * per_model - bar.n)
    if bar is not None:
        bar.close()
    text = table(rows, args.threads, tuple(args.strategies), tuple(args.peers))
    from .export import short_target

    print(f"host {short_target(host_target())}, {len(os.sched_getaffinity(0))} CPUs, "
          f"repeat {args.repeat}" + (", --huge-pages" if args.huge_pages else ""))
    pages = [f"{r['model']} @{t}: {said}" for r in rows for t, said in r.get("pages", {}).items()]
    text = "\n".join([text, *pages])
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.plot:
        from .report.plots import plot_bench

        columns = [*args.strategies, *args.peers]
        if plot_bench(rows, args.threads, args.plot, ours[0], columns):
            print(f"wrote {args.plot}", file=sys.stderr)
        else:
            print(f"no plot: no column was timed beside {ours[0]}", file=sys.stderr)
    return 1 if all("error" in r for r in rows) else 0


def cmd_regret(args: argparse.Namespace) -> int:
    """Regret against the best measured plan, per model and thread count, and the clear
    regions' decisions next to always / never fuse (``report.regret``)."""
    from .export import short_target
    from .report.regret import rows
    from .report.regret_table import summary, table

    done = rows(args.models, args.threads, args.repeat, lambda s: load_model(s, args.small),
                lambda msg: print(f"regret {msg}", file=sys.stderr, flush=True), args.builds,
                args.confirm, args.replicate)
    text = "\n".join([table(done), *summary(done, args.threads)])
    print(f"host {short_target(host_target())}, {len(os.sched_getaffinity(0))} CPUs, "
          f"repeat {args.repeat}, {args.builds} build(s) per plan in round 2, "
          f"{args.confirm} fresh build(s) of each of two in round 3"
          + (", clear regions replicated on fresh builds" if args.replicate else ""))
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if all("error" in r for r in done) else 0


def cmd_models(_args: argparse.Namespace) -> int:
    """The registry: zoo models, then the corpus with its family (``corpus`` extra)."""
    for name in models.zoo.names():
        print(f"{name:<22} zoo")
    corpus = models.corpus_names()
    if corpus:
        from .models import corpus as real

        for name in corpus:
            print(f"{name:<22} corpus ({real.family(name)})")
    else:
        print("(the real-model corpus needs its extra: pip install 'tvm_costfuse[corpus]')")
    print("synth-<seed>           random test programs; or a path to an .onnx / .pt2 file")
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    mod, _ = load_model(args.model, args.small)
    mod = prepare(mod)
    graph = build_graph(mod)
    group_of = {n: i for i, g in enumerate(fuseops_groups(mod)) for n in g}
    print(f"{'binding':<24} {'pattern':<18} {'MFLOP':>9} {'out KiB':>8} {'FuseOps':>7}  inputs")
    for node in graph.nodes:
        kib = node.bytes_written / 1024
        grp = group_of.get(node.name, "-")
        note = "" if node.fusable else f"  (not fusable: {node.why_not_fusable})"
        print(f"{node.name:<24} {node.pattern.name:<18} {node.flops / 1e6:>9.3f} {kib:>8.1f} "
              f"{grp:>7}  {', '.join(node.inputs)}{note}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    import json

    from .report.explain import draw, explain, format_text

    caps = {"max_chain_length": args.max_chain_length, "max_body_ops": args.max_body_ops,
            "register_budget": args.register_budget, "horizontal": args.horizontal,
            "layout": args.layout}
    report = explain(args.model, args.target, small=args.small, fold=not args.no_fold, **caps)
    print(json.dumps(report, indent=1) if args.json else format_text(report))
    if args.plot:
        draw(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .report.compare import compare, markdown_table

    specs = [m for group in args.models for m in group]
    start = time.perf_counter()
    cells = compare(specs, args.strategies, args.targets, args.out,
                    small=args.small, repeat=args.repeat, gpu=args.gpu,
                    measure_cuda=args.measure_cuda, progress=not args.no_progress)
    print(markdown_table(cells))
    failed = sum(not c.ok for c in cells)
    print(f"{len(cells)} cells ({failed} failed) in {time.perf_counter() - start:.0f} s; "
          f"wrote {args.out}/compare.csv, compare.md, kernels.csv and plots", file=sys.stderr)
    if cells and failed == len(cells):
        print("costfuse compare: every cell failed", file=sys.stderr)
        return 1
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .measurement.calibrate import main as calibrate_main

    argv = ["--quick"] if args.quick else []
    argv += ["--cores", str(args.cores)] if args.cores is not None else []
    argv += ["--path", args.path] if args.path else []
    calibrate_main(argv)
    return 0


COMMANDS = {"demo": cmd_demo, "compile": cmd_compile, "bench": cmd_bench, "models": cmd_models,
            "graph": cmd_graph, "explain": cmd_explain, "compare": cmd_compare, "tune": cmd_tune,
            "regret": cmd_regret,
            "evaluate": cmd_evaluate, "refeature": cmd_refeature, "restamp": cmd_restamp,
            "calibrate": cmd_calibrate}


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (2: a usage error, printed as one line)."""
    try:
        return _dispatch(argv)
    except BrokenPipeError:
        # The reader left (`costfuse models | head -1`): stop quietly, as a C tool killed by
        # SIGPIPE would (status 141), and point stdout at devnull so the interpreter's final
        # flush does not raise again (the recipe in Python's `signal` docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _dispatch(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    finally:  # --help and --version print, then exit: a closed pipe must show here too
        sys.stdout.flush()
    np.set_printoptions(precision=4)
    try:
        status = COMMANDS[args.cmd](args)
    except (UsageError, DatabaseLocked, ModelFileError) as err:
        print(f"costfuse {args.command}: error: {err}", file=sys.stderr)
        return 2
    sys.stdout.flush()  # a closed pipe shows here, not at exit as "Exception ignored"
    return status


if __name__ == "__main__":
    sys.exit(main())
