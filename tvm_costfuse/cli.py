"""The ``costfuse`` command.

``demo`` is the README's main job: it compiles a zoo model under several fusion strategies,
checks that they compute the same thing, and prints kernels launched and measured latency
side by side (one process, one machine state: ratios, not absolute numbers, are the claim).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import tvm
from tvm import relax

from . import zoo
from .graph import build_graph
from .measure import assert_close, build, median_seconds, run
from .partition import fuseops_groups
from .passes import prepare


def kernel_launches(mod: tvm.IRModule, fusion: tvm.transform.Pass | None) -> int:
    """call_tir launches per inference after fusion and FuseTIR."""
    mod = prepare(mod)
    mod = fusion(mod) if fusion is not None else mod
    mod = relax.transform.FuseTIR()(mod)
    return len(build_graph(mod).call_tir_names())


def _strategies() -> dict[str, tvm.transform.Pass | None]:
    """Fusion strategies the demo compares; CostFuse's own joins when its pass lands."""
    return {"none": None, "tvm": relax.transform.FuseOps()}


def cmd_demo(args: argparse.Namespace) -> int:
    mod, inputs = zoo.load(args.model, small=args.small)
    target = tvm.target.Target(args.target)
    print(f"model {args.model}{' (small)' if args.small else ''}, target {target.kind.name}")
    rows, outputs = [], {}
    for name, fusion in _strategies().items():
        t0 = time.perf_counter()
        ex = build(mod, target, fusion)
        compile_s = time.perf_counter() - t0
        outputs[name] = run(ex, inputs)
        seconds = median_seconds(ex, inputs, repeat=args.repeat)
        rows.append((name, kernel_launches(mod, fusion), compile_s, seconds))
    reference = outputs["none"]
    for name, out in outputs.items():
        assert_close(out, reference)  # raises, naming the output, if a strategy is wrong
    base = rows[0][3]
    print(f"{'fusion':<8} {'kernels':>7} {'compile s':>10} {'latency ms':>11} {'speedup':>8}")
    for name, kernels, compile_s, seconds in rows:
        print(f"{name:<8} {kernels:>7} {compile_s:>10.2f} {seconds * 1e3:>11.3f} "
              f"{base / seconds:>7.2f}x")
    print("numerics: every strategy matches no-fusion (rtol 1e-4, atol 1e-5)")
    return 0


def cmd_zoo(_args: argparse.Namespace) -> int:
    for name in zoo.names():
        print(name)
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    mod, _ = zoo.load(args.model, small=args.small)
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
    import json  # noqa: PLC0415

    from .explain import draw, explain, format_text  # noqa: PLC0415

    caps = {"max_chain_length": args.max_chain_length, "max_body_ops": args.max_body_ops,
            "register_budget": args.register_budget}
    report = explain(args.model, args.target, small=args.small, **caps)
    print(json.dumps(report, indent=1) if args.json else format_text(report))
    if args.plot:
        draw(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="costfuse", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compare fusion strategies on a zoo model")
    demo.add_argument("--model", default="layernorm_mlp", choices=zoo.names())
    demo.add_argument("--small", action="store_true", help="use the tiny test variant")
    demo.add_argument("--target", default="llvm")
    demo.add_argument("--repeat", type=int, default=5, help="timed repeats (median reported)")
    demo.set_defaults(func=cmd_demo)
    sub.add_parser("zoo", help="list the zoo models").set_defaults(func=cmd_zoo)
    graph = sub.add_parser("graph", help="print a model's op graph and FuseOps' groups")
    graph.add_argument("model", choices=zoo.names())
    graph.add_argument("--small", action="store_true")
    graph.set_defaults(func=cmd_graph)
    explain = sub.add_parser("explain", help="CostFuse's plan for a model, with reasons and costs")
    explain.add_argument("model", choices=zoo.names())
    explain.add_argument("--target", default="host", choices=["host", "h100", "h200", "a100"])
    explain.add_argument("--small", action="store_true")
    explain.add_argument("--json", action="store_true", help="print the report as JSON")
    explain.add_argument("--plot", metavar="PNG", help="draw the fused graph to this file")
    explain.add_argument("--max-chain-length", type=int)
    explain.add_argument("--max-body-ops", type=int)
    explain.add_argument("--register-budget", type=int)
    explain.set_defaults(func=cmd_explain)
    args = parser.parse_args(argv)
    np.set_printoptions(precision=4)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
